"""The ``sim`` provider: ``--provider sim`` in the registry.

A rehearsal starts no cluster: the executor's ``Driver`` runs on virtual-clock ports
(``rubberband.executor.sim``), through ``rubberband.executor.rehearse`` (which also checks
a rehearsal's truth model: ``check_truth``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

from rubberband.errors import SpecError
from rubberband.providers.base import Clouds, Room


class SimProvider:
    """``--provider sim`` in the registry: rehearsal in virtual time, no Ray cluster."""

    name = "sim"
    cluster_yaml = False

    def check(self, cloud: Clouds, max_instances: Room, cluster: Any) -> Any:
        return None

    def start(self, run_id: str, run_dir: Path, cloud: Clouds, max_instances: Room, config: Any, *,
              seed: int, latency_scale: float, launch_attempts: int, launch_backoff_s: float) -> NoReturn:
        raise SpecError("provider: sim rehearses in virtual time and starts no Ray cluster; "
                        "run `rubberband run EXP --provider sim` instead")

    def sweep(self, cluster: Any, config: Any) -> None:
        return None

    def down(self, run_id: str | None, regions: list[str], cluster_yamls: list[str]) -> dict[str, Any]:
        return {"heads": []}        # a rehearsal leaves nothing running

    def status(self, run_id: str | None, regions: list[str], cluster_yamls: list[str]) -> dict[str, Any]:
        return {"heads": []}
