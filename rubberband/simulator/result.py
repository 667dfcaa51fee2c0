"""Simulation results: per-sample JCT and cost with summaries and a per-stage breakdown."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class StageStats:
    """Mean behaviour of one stage over all samples."""

    index: int
    num_trials: int
    iters: int
    allocation: int
    gpus_per_trial: int
    instances: int
    new_instances: int
    mean_duration_s: float
    mean_cost_usd: float
    spot_instances: int = 0          # of the stage's held instances (DESIGN §4.1)
    mean_reclaims: float = 0.0       # spot instances reclaimed during the stage, on average
    trials_per_gpu: int = 1          # trials sharing one GPU (packing)
    instance_type: str = ""          # the stage's instance type
    fused_per_gpu: int = 1           # trials fused into one program per GPU (DESIGN §4.5)
    redone: int = 0                  # iterations each TRAIN trains again on resuming (beyond ``iters``; DESIGN §4)

    def to_dict(self) -> dict[str, Any]:
        """The fields; ``fused_per_gpu`` only when the stage fuses, ``redone`` only when some are
        (files written before have neither)."""
        out = dict(self.__dict__)
        if self.fused_per_gpu == 1:
            del out["fused_per_gpu"]
        if self.redone == 0:
            del out["redone"]
        return out


@dataclass(frozen=True, eq=False)
class SimResult:
    """Per-sample job completion time and cost of one plan, with summaries.

    ``jct_s`` and ``cost_usd`` are numpy arrays with one value per Monte-Carlo sample.
    """

    jct_s: np.ndarray
    cost_usd: np.ndarray
    allocation: tuple[int, ...]
    instances: tuple[int, ...]
    stages: tuple[StageStats, ...] = ()
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    spot_instances: tuple[int, ...] = ()
    trials_per_gpu: tuple[int, ...] = ()     # per stage (all 1 when nothing is packed)
    instance_types: tuple[str, ...] = ()     # per stage, when the plan names a type per stage
    fused_per_gpu: tuple[int, ...] = ()      # per stage (all 1 when nothing is fused)

    @property
    def samples(self) -> int:
        return int(self.jct_s.shape[0])

    @property
    def mean_jct_s(self) -> float:
        return float(self.jct_s.mean())

    @property
    def mean_cost_usd(self) -> float:
        return float(self.cost_usd.mean())

    @property
    def p50_jct_s(self) -> float:
        return float(np.percentile(self.jct_s, 50))

    @property
    def p90_jct_s(self) -> float:
        return float(np.percentile(self.jct_s, 90))

    @property
    def p50_cost_usd(self) -> float:
        return float(np.percentile(self.cost_usd, 50))

    @property
    def p90_cost_usd(self) -> float:
        return float(np.percentile(self.cost_usd, 90))

    def p_meet(self, deadline_s: float) -> float:
        """Fraction of samples whose JCT is at most ``deadline_s``."""
        return float(np.mean(self.jct_s <= deadline_s + 1e-9))

    def summary(self) -> dict[str, float]:
        return {
            "jct_s_mean": self.mean_jct_s, "jct_s_p50": self.p50_jct_s, "jct_s_p90": self.p90_jct_s,
            "cost_usd_mean": self.mean_cost_usd, "cost_usd_p50": self.p50_cost_usd,
            "cost_usd_p90": self.p90_cost_usd,
        }

    def to_dict(self, include_samples: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "allocation": list(self.allocation),
            "instances": list(self.instances),
            "samples": self.samples,
            "seed": self.seed,
            **self.summary(),
            "stages": [s.to_dict() for s in self.stages],
        }
        if any(self.spot_instances):
            out["spot_instances"] = list(self.spot_instances)
        if any(k > 1 for k in self.trials_per_gpu):
            out["trials_per_gpu"] = list(self.trials_per_gpu)
        if any(f > 1 for f in self.fused_per_gpu):
            out["fused_per_gpu"] = list(self.fused_per_gpu)
        if self.instance_types:
            out["instance_types"] = list(self.instance_types)
        if include_samples:
            out["jct_s"] = self.jct_s.tolist()
            out["cost_usd"] = self.cost_usd.tolist()
        return out
