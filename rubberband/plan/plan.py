"""The planner's output: an allocation plan with its predicted JCT and cost."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rubberband.profiles.cloud import CloudProfile
from rubberband.schema import jsonable
from rubberband.simulator.result import SimResult, StageStats
from rubberband.spec.experiment import ExperimentSpec, Stage


@dataclass(frozen=True, eq=False)
class Plan:
    """GPUs and instances per stage for one job, with the simulator's prediction.

    Attributes:
        allocation: GPUs per stage.
        instances: instances held per stage.
        gpus_per_trial: GPUs each trial gets per stage (1 when trials queue).
        predicted: the ``SimResult`` of this plan.
        deadline_s: the deadline it was planned for.
        policy: the policy that produced it (``optimal``, ``greedy``, ``static``, ``naive-elastic``).
        spec: the job's stages.
        cloud: the instance type it was planned on.
        confidence: ``None`` when the mean JCT had to meet the deadline, else the probability
            the plan had to reach.
        considered: summaries of the other plans weighed (other policies, other instance types).
    """

    allocation: tuple[int, ...]
    instances: tuple[int, ...]
    gpus_per_trial: tuple[int, ...]
    predicted: SimResult
    deadline_s: float
    policy: str
    spec: ExperimentSpec
    cloud: CloudProfile
    confidence: float | None = None
    samples: int = 0
    seed: int = 0
    considered: tuple[dict[str, Any], ...] = ()
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def instance_type(self) -> str:
        return self.cloud.instance_type

    def summary(self) -> dict[str, Any]:
        """One line of a 'considered plans' table."""
        return {
            "policy": self.policy,
            "instance_type": self.instance_type,
            "allocation": list(self.allocation),
            "instances": list(self.instances),
            **self.predicted.summary(),
            "p_meet": self.predicted.p_meet(self.deadline_s),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "deadline_s": self.deadline_s,
            "confidence": self.confidence,
            "samples": self.samples,
            "seed": self.seed,
            "allocation": list(self.allocation),
            "instances": list(self.instances),
            "gpus_per_trial": list(self.gpus_per_trial),
            "stages": [[s.num_trials, s.iters] for s in self.spec.stages],
            "bracket_starts": list(self.spec.bracket_starts),
            "eta": self.spec.eta,
            "cloud": self.cloud.to_dict(),
            "predicted": {
                **self.predicted.summary(),
                "p_meet": self.predicted.p_meet(self.deadline_s),
                "stages": [s.to_dict() for s in self.predicted.stages],
                "jct_s": [round(float(v), 4) for v in self.predicted.jct_s],
                "cost_usd": [round(float(v), 6) for v in self.predicted.cost_usd],
            },
            "considered": list(self.considered),
            "info": self.info,
        }

    def to_json(self, indent: int | None = 2) -> str:
        """Serialise to JSON (per-sample predictions included, rounded)."""
        return json.dumps(self.to_dict(), indent=indent, default=jsonable)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """Rebuild a plan written by ``to_json``."""
        data = json.loads(text)
        spec = ExperimentSpec(tuple(Stage(n, k) for n, k in data["stages"]), tuple(data.get("bracket_starts", [0])),
                              data.get("eta"))
        pred = data["predicted"]
        stats = tuple(StageStats(**s) for s in pred["stages"])
        predicted = SimResult(np.asarray(pred["jct_s"], float), np.asarray(pred["cost_usd"], float),
                              tuple(data["allocation"]), tuple(data["instances"]), stats, int(data.get("seed", 0)))
        return cls(
            allocation=tuple(data["allocation"]), instances=tuple(data["instances"]),
            gpus_per_trial=tuple(data["gpus_per_trial"]), predicted=predicted, deadline_s=float(data["deadline_s"]),
            policy=data["policy"], spec=spec, cloud=CloudProfile.from_dict(data["cloud"]),
            confidence=data.get("confidence"), samples=int(data.get("samples", 0)), seed=int(data.get("seed", 0)),
            considered=tuple(data.get("considered", ())), info=dict(data.get("info", {})),
        )
