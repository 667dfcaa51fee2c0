"""The ``sim`` provider: ``--provider sim`` in the registry, and the check of a rehearsal's truth model.

A rehearsal starts no cluster: the executor's ``Driver`` runs on virtual-clock ports
(``rubberband.executor.sim``), through ``rubberband.executor.rehearse``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rubberband.errors import SpecError
from rubberband.plan.plan import Plan
from rubberband.profiles.cloud import CloudProfile
from rubberband.profiles.model import ModelProfile


def check_truth(plan: Plan, model: ModelProfile, planned: ModelProfile, where: str = "--truth-model") -> ModelProfile:
    """A truth model must describe the planned model and cover every GPU count (and trials
    per GPU, packed) the plan uses.

    Raises:
        SpecError: naming ``where``, for another model or a missing GPU count.
    """
    if model.name != planned.name:
        raise SpecError(f"{where}: profile {model.name!r} is of another model than the plan's {planned.name!r}; "
                        "give a profile of the same model (its `name:`)")
    missing = sorted({m for m in plan.gpus_per_trial if not model.covers(m)})
    if missing:
        raise SpecError(f"{where}: profile {model.name!r} covers {model.min_gpus}..{model.max_gpus} GPUs per trial, "
                        f"but the plan runs trials on {', '.join(map(str, missing))} GPUs; add those counts to it")
    unpacked = sorted({k for k in plan.packing if k > 1 and k not in model.packed_iter_latency_s})
    if unpacked:
        raise SpecError(f"{where}: profile {model.name!r} has no packed_iter_latency_s for "
                        f"{', '.join(map(str, unpacked))} trials per GPU, which the plan packs; add them to it")
    return model


class SimProvider:
    """``--provider sim`` in the registry: rehearsal in virtual time, no Ray cluster."""

    name = "sim"
    cluster_yaml = False

    def check(self, cloud: CloudProfile, max_instances: int, cluster: Any) -> Any:
        return None

    def start(self, run_id: str, run_dir: Path, cloud: CloudProfile, max_instances: int, config: Any, *,
              seed: int, latency_scale: float, launch_attempts: int, launch_backoff_s: float):
        raise SpecError("provider: sim rehearses in virtual time and starts no Ray cluster; "
                        "run `rubberband run EXP --provider sim` instead")

    def sweep(self, cluster: Any, config: Any) -> None:
        return None

    def down(self, run_id: str | None, regions: list[str], cluster_yamls: list[str]) -> dict[str, Any]:
        return {"heads": []}        # a rehearsal leaves nothing running

    def status(self, run_id: str | None, regions: list[str], cluster_yamls: list[str]) -> dict[str, Any]:
        return {"heads": []}
