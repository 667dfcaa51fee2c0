"""The planner's output: an allocation plan with its predicted JCT and cost."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from rubberband.errors import SpecError
from rubberband.profiles.by_gpu import model_of
from rubberband.profiles.cloud import CloudCatalog, CloudProfile, Market
from rubberband.profiles.model import ModelProfile
from rubberband.schema import check_mapping, integer, jsonable, number
from rubberband.simulator.engine import HeldInstances, simulate, spot_layout
from rubberband.simulator.result import SimResult, StageStats
from rubberband.spec.experiment import EagerTransfer, ExperimentSpec, Stage

_REQUIRED = ["policy", "deadline_s", "allocation", "instances", "gpus_per_trial", "stages", "cloud", "predicted"]
_OPTIONAL = ["confidence", "samples", "seed", "bracket_starts", "eta", "considered", "info", "warnings", "spot_instances",
             "instance_types", "trials_per_gpu", "type_clouds", "held_at_start", "markets", "fused_per_gpu",
             "target_stage", "eager_transfer"]
# A stage's market in a plan file: all its instances on one market, or some of each.
MIXED = "mixed"
_SUMMARY = ["jct_s_mean", "jct_s_p50", "jct_s_p90", "cost_usd_mean", "cost_usd_p50", "cost_usd_p90", "p_meet"]


@dataclass(frozen=True, eq=False)
class Plan:
    """GPUs and instances per stage for one job, with the simulator's prediction.

    Per stage, the plan says each field once: ``stage_types``, ``markets``, ``spot_counts``
    and ``packing`` fill in what the compact fields below leave to the cloud, and a plan file
    (``to_dict``) writes those, one entry per stage, so a reader of ``plan.json`` never has to
    know what an empty list stands for. Plan files written before (empty lists) still load.

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
        warnings: one-line notes on a plan that can be used but may mislead (e.g. a profile
            measured on another GPU model than the instance type's).
        spot_instances: how many of each stage's held instances are spot (DESIGN §4.1); empty
            means as the cloud's market says (all of them on spot, none on on-demand).
        instance_types: the instance type of each stage; empty means ``cloud``'s one type.
            ``cloud`` is then stage 0's type and ``type_clouds`` has every type's profile.
        trials_per_gpu: trials sharing one GPU per stage (packing); empty means 1 everywhere.
        fused_per_gpu: trials fused into one program per GPU per stage (DESIGN §4.5); empty
            means 1 everywhere (a plan file without it loads so).
        type_clouds: the profile of each type ``instance_types`` names.
        held_at_start: the instances the job held when it was planned (a re-plan of the rest
            of a job): ``predicted`` starts from them, and so does ``simulate_plan``.
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
    warnings: tuple[str, ...] = ()
    spot_instances: tuple[int, ...] = ()
    instance_types: tuple[str, ...] = ()
    trials_per_gpu: tuple[int, ...] = ()
    type_clouds: dict[str, CloudProfile] = field(default_factory=dict)
    held_at_start: HeldInstances | None = None
    fused_per_gpu: tuple[int, ...] = ()

    @property
    def instance_type(self) -> str:
        """The plan's type: stage 0's, when stages differ (``instance_types``)."""
        return self.cloud.instance_type

    @property
    def stage_clouds(self) -> list[CloudProfile]:
        """Each stage's instance type profile."""
        if not self.instance_types:
            return [self.cloud] * len(self.allocation)
        return [self.type_clouds[t] for t in self.instance_types]

    @property
    def stage_types(self) -> tuple[str, ...]:
        """Each stage's instance type, ``cloud``'s filled in."""
        return self.instance_types or (self.instance_type,) * len(self.allocation)

    @property
    def markets(self) -> tuple[str, ...]:
        """Each stage's market: ``spot`` or ``on-demand`` when all its instances are on one,
        ``mixed`` when some are spot (``spot_counts``)."""
        return tuple(_market(spot, held) for spot, held in zip(self.spot_counts, self.instances))

    @property
    def packing(self) -> tuple[int, ...]:
        """Trials per GPU per stage, 1 filled in."""
        return self.trials_per_gpu or (1,) * len(self.allocation)

    @property
    def fusion(self) -> tuple[int, ...]:
        """Trials fused per GPU per stage, 1 filled in."""
        return self.fused_per_gpu or (1,) * len(self.allocation)

    @property
    def spot_counts(self) -> tuple[int, ...]:
        """Spot instances per stage, with the cloud's market filled in."""
        return tuple(spot_layout(self.instances, self.stage_clouds, self.spot_instances or None))

    def simulation_args(self) -> dict[str, Any]:
        """What ``simulate`` takes, besides spec, allocation and model, to simulate exactly this
        plan: its cloud (the types' profiles when stages differ), instances, spot instances,
        types, trials per GPU, trials fused per GPU and the instances held at the start."""
        return {"cloud": self.type_clouds if self.instance_types else self.cloud, "instances": self.instances,
                "spot_instances": self.spot_instances or None, "trials_per_gpu": self.trials_per_gpu or None,
                "instance_types": self.instance_types or None, "held_at_start": self.held_at_start,
                "fused_per_gpu": self.fused_per_gpu or None}

    def summary(self) -> dict[str, Any]:
        """One line of a 'considered plans' table."""
        return {
            "policy": self.policy,
            "instance_type": "+".join(dict.fromkeys(self.stage_types)),
            "allocation": list(self.allocation),
            "instances": list(self.instances),
            **({"trials_per_gpu": list(self.trials_per_gpu)} if any(k > 1 for k in self.trials_per_gpu) else {}),
            **({"fused_per_gpu": list(self.fused_per_gpu)} if any(f > 1 for f in self.fused_per_gpu) else {}),
            **({"instance_types": list(self.instance_types)} if len(set(self.instance_types)) > 1 else {}),
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
            "spot_instances": list(self.spot_counts),
            "markets": list(self.markets),
            "instance_types": list(self.stage_types),
            "trials_per_gpu": list(self.packing),
            "fused_per_gpu": list(self.fusion),
            "type_clouds": {name: c.to_dict() for name, c in self.type_clouds.items()},
            **({"held_at_start": self.held_at_start.to_dict()} if self.held_at_start is not None else {}),
            "stages": [[s.num_trials, s.iters] for s in self.spec.stages],
            "bracket_starts": list(self.spec.bracket_starts),
            "eta": self.spec.eta,
            **({"target_stage": self.spec.target_stage} if self.spec.target_stage is not None else {}),
            **({"eager_transfer": self.spec.eager.to_dict()} if self.spec.eager is not None else {}),
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
            "warnings": list(self.warnings),
        }

    def to_json(self, indent: int | None = 2) -> str:
        """Serialise to JSON (per-sample predictions included, rounded)."""
        return json.dumps(self.to_dict(), indent=indent, default=jsonable)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """Rebuild a plan written by ``to_json``.

        Raises:
            SpecError: naming the field, for anything but a well-formed plan (a plan file is
                user input: see ``check_plan`` for checking it against an experiment).
        """
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise SpecError(f"plan: not a JSON plan ({exc}); write one with `rubberband plan EXPERIMENT --out PLAN_JSON`") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any, where: str = "plan") -> Plan:
        """Rebuild a plan from ``to_dict``'s mapping, checking every field's shape."""
        if not isinstance(data, dict):
            raise SpecError(f"{where}: expected a JSON object as `rubberband plan --out` writes, got a {type(data).__name__}")
        data = check_mapping(data, where, required=_REQUIRED, optional=_OPTIONAL)
        stages = _rows(data["stages"], f"{where}.stages")
        try:
            target = data.get("target_stage")
            if target is not None and target != len(stages) - 1:
                raise SpecError(f"target_stage: expected the last stage's index {len(stages) - 1}, got {target!r}")
            eager = _eager(data.get("eager_transfer"), target)
            spec = ExperimentSpec(tuple(Stage(n, k, j == target, eager if j == target else None)
                                        for j, (n, k) in enumerate(stages)),
                                  tuple(_ints(data.get("bracket_starts", [0]), f"{where}.bracket_starts", minimum=0)),
                                  data.get("eta")).validate()
        except SpecError as exc:
            raise SpecError(f"{where}.{exc}") from None
        vectors = {key: tuple(_ints(data[key], f"{where}.{key}", length=len(stages)))
                   for key in ("allocation", "instances", "gpus_per_trial")}
        spot = tuple(_ints(data["spot_instances"], f"{where}.spot_instances", minimum=0, length=len(stages))) \
            if data.get("spot_instances") is not None else ()
        cloud = CloudProfile.from_dict(data["cloud"], f"{where}.cloud")
        types, packing, type_clouds = _types_packing(data, where, len(stages), cloud)
        fusion = tuple(_ints(data["fused_per_gpu"], f"{where}.fused_per_gpu", length=len(stages))) \
            if data.get("fused_per_gpu") else ()
        for i, (k, f) in enumerate(zip(packing or (1,) * len(stages), fusion)):
            if k > 1 and f > 1:
                raise SpecError(f"{where}.fused_per_gpu[{i}]: stage {i} also packs {k} trials per GPU; fused and "
                                f"packed are exclusive per stage: set one of them to 1")
        deadline = data["deadline_s"]
        if deadline != math.inf:    # a plan of your own allocation may have no deadline
            deadline = number(deadline, f"{where}.deadline_s", positive=True)
        confidence = data.get("confidence")
        if confidence is not None and not 0 < number(confidence, f"{where}.confidence") < 1:
            raise SpecError(f"{where}.confidence: must be between 0 and 1, got {confidence!r}")
        if not isinstance(data["policy"], str):
            raise SpecError(f"{where}.policy: expected a policy name, got {data['policy']!r}")
        warnings = data.get("warnings") or []
        if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
            raise SpecError(f"{where}.warnings: expected a list of strings")
        seed = integer(data.get("seed", 0), f"{where}.seed", minimum=0)
        predicted = _predicted(data["predicted"], f"{where}.predicted", vectors, seed)
        plan = cls(
            allocation=vectors["allocation"], instances=vectors["instances"], gpus_per_trial=vectors["gpus_per_trial"],
            predicted=predicted, deadline_s=float(deadline), policy=data["policy"], spec=spec,
            cloud=cloud, confidence=confidence,
            samples=integer(data.get("samples", 0), f"{where}.samples", minimum=0), seed=seed,
            considered=tuple(data.get("considered") or ()), info=dict(data.get("info") or {}), warnings=tuple(warnings),
            spot_instances=spot, instance_types=types, trials_per_gpu=packing, type_clouds=type_clouds,
            held_at_start=_held(data.get("held_at_start"), f"{where}.held_at_start"),
            fused_per_gpu=fusion if set(fusion) != {1} else (),
        )
        _check_markets(plan, data.get("markets"), where)
        return plan


def _held(value: Any, where: str) -> HeldInstances | None:
    """A plan file's ``held_at_start`` (``HeldInstances.to_dict``), or ``None``."""
    if value is None:
        return None
    data = check_mapping(value, where, required=["count"], optional=["spot", "instance_type"])
    held = HeldInstances(integer(data["count"], f"{where}.count", minimum=0),
                         integer(data.get("spot", 0), f"{where}.spot", minimum=0), data.get("instance_type"))
    try:
        return HeldInstances.of(held)
    except SpecError as exc:
        raise SpecError(str(exc).replace("held_at_start", where, 1)) from None


def _types_packing(data: dict[str, Any], where: str, stages: int,
                   cloud: CloudProfile) -> tuple[tuple[str, ...], tuple[int, ...], dict[str, CloudProfile]]:
    """A plan file's ``instance_types`` (each with its profile in ``type_clouds``, ``cloud``'s
    own type with ``cloud``) and ``trials_per_gpu``, as ``Plan`` keeps them: empty when every
    stage is on ``cloud``'s type (a file written before says so with an empty list) or packs
    nothing."""
    packing = tuple(_ints(data["trials_per_gpu"], f"{where}.trials_per_gpu", length=stages)) \
        if data.get("trials_per_gpu") else ()
    names = data.get("instance_types") or []
    if not isinstance(names, list) or (names and len(names) != stages) or not all(isinstance(n, str) for n in names):
        raise SpecError(f"{where}.instance_types: expected {stages} instance type names, one per stage, got {names!r}")
    raw = data.get("type_clouds") or {}
    if not isinstance(raw, dict):
        raise SpecError(f"{where}.type_clouds: expected a mapping of instance type to its cloud profile")
    clouds = {str(k): CloudProfile.from_dict(v, f"{where}.type_clouds.{k}") for k, v in raw.items()}
    if names and len(set(names)) == 1 and not clouds and names[0] != cloud.instance_type:
        raise SpecError(f"{where}.instance_types: says {names[0]} for every stage but {where}.cloud.instance_type is "
                        f"{cloud.instance_type}; make them the same (cloud is stage 0's type)")
    for i, name in enumerate(names):
        if name not in clouds and name != cloud.instance_type:
            raise SpecError(f"{where}.instance_types[{i}]: {name!r} has no profile in {where}.type_clouds; "
                            "plan it again with `rubberband plan EXPERIMENT --out PLAN_JSON`")
    if set(names) <= {cloud.instance_type} and set(clouds) <= {cloud.instance_type}:
        names, clouds = [], {}
    elif names:
        clouds.setdefault(cloud.instance_type, cloud)
    return tuple(names), packing if set(packing) != {1} else (), clouds


def _market(spot: int, held: int) -> str:
    return Market.SPOT.value if spot == held else Market.ON_DEMAND.value if spot == 0 else MIXED


def _check_markets(plan: Plan, markets: Any, where: str) -> None:
    """A plan file's ``markets`` (one per stage, written for its reader) must say what its spot
    instances do: it is read off ``spot_instances``, so an edit of one must keep the other."""
    if markets is None:
        return
    n = len(plan.allocation)
    if not isinstance(markets, list) or len(markets) != n:
        raise SpecError(f"{where}.markets: expected {n} markets, one per stage, got {markets!r}")
    try:
        derived = plan.markets
    except SpecError as exc:
        raise SpecError(f"{where}.{exc}") from None
    for i, (given, market) in enumerate(zip(markets, derived)):
        if given != market:
            raise SpecError(f"{where}.markets[{i}]: says {given!r} but spot_instances[{i}] puts {plan.spot_counts[i]} of "
                            f"the stage's {plan.instances[i]} instances on spot, which is {market!r}; make them agree "
                            "(or drop markets: it is read off spot_instances)")


def check_plan(plan: Plan, spec: ExperimentSpec, model: ModelProfile | Mapping[str, ModelProfile],
               cloud: CloudProfile | CloudCatalog,
               samples: int = 1000, target_model: ModelProfile | Mapping[str, ModelProfile] | None = None) -> Plan:
    """Check a plan (read from a file, perhaps edited) against the experiment it is to run, and
    predict it again.

    The plan must have the experiment's stages and an instance type of the experiment's cloud
    (one of the catalog's, or the profile's own); its allocation and instances must be valid
    for the model profile and hold every stage's trials (DESIGN §4, checked by ``simulate``),
    and its GPUs per trial must be what the allocation gives. Per-stage instance types must
    be the catalog's, and trials per GPU what the model profile packs on each type's GPUs.
    The prediction stored in the file is never trusted: the plan is simulated again with the
    experiment's model and cloud. A plan made from instances held (``held_at_start``, a
    re-plan of a running job) cannot start a run.

    Args:
        plan: the plan to check.
        spec, model: the experiment's job and model profile (or its profiles by GPU model: the
            one of the plan's GPU model is used).
        cloud: the experiment's cloud: a profile, or a catalog (with the experiment's
            overrides) holding the plan's instance type.
        samples: Monte-Carlo samples when the plan does not say.
        target_model: a surrogate job's target stage's profile (DESIGN §4.6).

    Returns:
        A new ``Plan`` on the experiment's spec and cloud with the recomputed prediction.

    Raises:
        SpecError: one line naming the field of the plan that does not fit.
    """
    if plan.held_at_start is not None:
        raise SpecError(f"plan.held_at_start: the plan starts from {plan.held_at_start.count} instances held (the "
                        "rest of a running job, re-planned) but a run starts with none; plan it again with "
                        "`rubberband plan EXPERIMENT --out PLAN_JSON`")
    if plan.spec.stages != spec.stages or plan.spec.bracket_starts != spec.bracket_starts:
        raise SpecError(f"plan.stages: the plan is for {plan.spec.describe()} but the experiment has {spec.describe()}; "
                        "plan it again with `rubberband plan EXPERIMENT --out PLAN_JSON`")
    type_clouds = {}
    if isinstance(cloud, CloudCatalog):
        for i, name in enumerate(plan.instance_types or (plan.instance_type,)):
            if name not in cloud.types:
                field_ = f"instance_types[{i}]" if plan.instance_types else "cloud.instance_type"
                raise SpecError(f"plan.{field_}: {name!r} is not in the experiment's cloud profile "
                                f"{cloud.path or cloud.region}; plan it again on its types")
            own = plan.type_clouds.get(name, plan.cloud)
            type_clouds[name] = _in_zone_of(cloud.get(name, own.market), own)
        cloud = type_clouds[plan.instance_type]
    elif plan.instance_type != cloud.instance_type or set(plan.instance_types) - {cloud.instance_type}:
        other = next(t for t in (plan.instance_type, *plan.instance_types) if t != cloud.instance_type)
        raise SpecError(f"plan.cloud.instance_type: the plan is for {other} but the experiment runs on "
                        f"{cloud.instance_type}; plan it again on {cloud.instance_type}")
    else:
        cloud = _in_zone_of(cloud, plan.cloud)
        type_clouds = {cloud.instance_type: cloud}
    model = model_of(model, cloud, "plan.cloud.instance_type")
    plan = replace(plan, cloud=cloud, type_clouds=type_clouds if plan.instance_types else {})
    try:
        result = simulate(spec, plan.allocation, model, samples=plan.samples or samples, seed=plan.seed,
                          target_model=target_model, **plan.simulation_args())
    except SpecError as exc:
        raise SpecError(f"plan.{exc}") from None
    gpus = tuple(s.gpus_per_trial for s in result.stages)
    if plan.gpus_per_trial != gpus:
        raise SpecError(f"plan.gpus_per_trial: {list(plan.gpus_per_trial)} is not what allocation "
                        f"{list(plan.allocation)} gives ({list(gpus)}); plan it again or fix the allocation")
    return replace(plan, spec=spec, cloud=cloud, predicted=result, samples=result.samples)


def _in_zone_of(rebuilt: CloudProfile, own: CloudProfile) -> CloudProfile:
    """``rebuilt`` on the spot market ``own`` (the plan's) was planned in: a plan made with
    ``--zone`` replays its zone's trace and price, not the experiment's zone."""
    zone = own.spot.trace.zone if own.spot.trace is not None else None
    if zone is None or rebuilt.spot.trace is None or rebuilt.spot.trace.zone == zone:
        return rebuilt
    try:
        return rebuilt.in_zone(zone)
    except SpecError as exc:
        raise SpecError(f"plan.cloud.{exc}") from None


def _ints(value: Any, where: str, minimum: int = 1, length: int | None = None) -> list[int]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        size = f"{length} " if length is not None else ""
        raise SpecError(f"{where}: expected a list of {size}integers, one per stage, got {value!r}")
    return [integer(v, f"{where}[{i}]", minimum=minimum) for i, v in enumerate(value)]


def _rows(value: Any, where: str) -> list[tuple[int, int]]:
    if not isinstance(value, list) or not value:
        raise SpecError(f"{where}: expected a non-empty list of [num_trials, iters], got {value!r}")
    rows = []
    for i, row in enumerate(value):
        if not isinstance(row, list) or len(row) != 2:
            raise SpecError(f"{where}[{i}]: expected [num_trials, iters], got {row!r}")
        rows.append((integer(row[0], f"{where}[{i}].num_trials"), integer(row[1], f"{where}[{i}].iters")))
    return rows


def _predicted(value: Any, where: str, vectors: dict[str, tuple[int, ...]], seed: int) -> SimResult:
    data = check_mapping(value, where, required=["jct_s", "cost_usd", "stages"], optional=_SUMMARY)
    arrays = []
    for key in ("jct_s", "cost_usd"):
        samples = data[key]
        if not isinstance(samples, list) or not samples:
            raise SpecError(f"{where}.{key}: expected a non-empty list of per-sample values; plan it again")
        arrays.append(np.asarray([number(v, f"{where}.{key}[{i}]", minimum=0) for i, v in enumerate(samples)]))
    if len(arrays[0]) != len(arrays[1]):
        raise SpecError(f"{where}: jct_s has {len(arrays[0])} samples but cost_usd {len(arrays[1])}; plan it again")
    # ``fused_per_gpu`` is written only for a fused stage, ``redone`` only for a stage that redoes
    # iterations (files written before have neither).
    names = [f.name for f in fields(StageStats) if f.name not in ("fused_per_gpu", "redone")]
    rows = data["stages"]
    if not isinstance(rows, list):
        raise SpecError(f"{where}.stages: expected a list of per-stage summaries")
    stats = tuple(StageStats(**check_mapping(r, f"{where}.stages[{i}]", required=names, optional=["fused_per_gpu", "redone"]))
                  for i, r in enumerate(rows))
    return SimResult(arrays[0], arrays[1], vectors["allocation"], vectors["instances"], stats, seed,
                     fused_per_gpu=tuple(s.fused_per_gpu for s in stats))


def _eager(value: Any, target: int | None) -> EagerTransfer | None:
    """A plan file's ``eager_transfer`` (``{after_stage, restart_probability}``), for its target stage."""
    if value is None:
        return None
    if target is None:
        raise SpecError("eager_transfer: only a plan with a target_stage starts it early")
    data = check_mapping(value, "eager_transfer", required=["after_stage", "restart_probability"])
    return EagerTransfer(data["after_stage"], data["restart_probability"])


def simulate_plan(plan: Plan, model: ModelProfile | Mapping[str, ModelProfile], samples: int | None = None,
                  seed: int | None = None, target_model: ModelProfile | Mapping[str, ModelProfile] | None = None
                  ) -> SimResult:
    """Simulate exactly what ``plan`` says — allocation, instances held, spot instances, each
    stage's instance type, trials per GPU and trials fused per GPU — on its own cloud, e.g. out of sample with
    another ``seed`` to re-check its promise.

    Args:
        plan: from ``compile_plan`` (or ``Plan.from_json``).
        model: the model profile to simulate with (the plan's, or another to ask "what if"),
            or one per GPU model (each stage runs by its type's, as ``simulate``).
        samples, seed: Monte-Carlo samples and seed (default: the plan's own).
        target_model: the target stage's profile, for a surrogate job's plan (DESIGN §4.6).
    """
    return simulate(plan.spec, plan.allocation, model, samples=samples or plan.samples or 1000,
                    seed=plan.seed if seed is None else seed, target_model=target_model, **plan.simulation_args())
