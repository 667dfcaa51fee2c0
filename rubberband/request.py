"""One resolution of an experiment: the experiment file plus the command line's flags, as one
frozen ``Request`` that every command (validate, plan, whatif, simulate, run, profile) reads.

Each flag overrides the experiment's own field; what is left unset keeps the experiment's
value, and a few rules tie fields together (a zone search plans spot, a budget without an
explicit deadline drops the experiment's deadline). The warnings found on the way — a
profile's doubts, a spot market modelled as never reclaimed, a notice longer than an
instance's mean lifetime, ... — are the request's, so every command prints the same ones.

Pure: reads YAML and trace files, imports no ray, boto3 or torch.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from rubberband.config import Experiment, load_experiment
from rubberband.errors import RubberbandWarning, SpecError
from rubberband.profiles.cloud import CloudCatalog, CloudProfile, Market
from rubberband.profiles.model import ModelProfile
from rubberband.schema import choice
from rubberband.spec.experiment import ExperimentSpec
from rubberband.units import format_duration, parse_duration

if TYPE_CHECKING:
    from rubberband.plan.plan import Plan

AUTO = "auto"


@dataclass(frozen=True)
class Overrides:
    """What the command line says over the experiment file (``None``: the experiment's own).

    Durations are the text the user typed (``"20m"``), parsed and named by their flag.
    """

    model_profile: str | None = None
    cloud_overrides: str | None = None
    deadline: str | None = None
    budget_usd: float | None = None
    confidence: float | None = None
    policy: str | None = None
    instance_type: str | None = None
    market: str | None = None
    samples: int | None = None
    seed: int | None = None
    zone: str | None = None
    max_instances: int | Mapping[str, int] | None = None
    spot_emulation: str | None = None
    allocation: tuple[int, ...] | None = None
    instances: tuple[int, ...] | None = None
    trials_per_gpu: tuple[int, ...] | None = None
    fused_per_gpu: tuple[int, ...] | None = None

    @classmethod
    def of(cls, values: Mapping[str, Any] | Any) -> Overrides:
        """The fields of ``values`` (a mapping, or an ``argparse.Namespace``) that an ``Overrides``
        has; others are ignored (each command has flags of its own)."""
        get = values.get if isinstance(values, Mapping) else (lambda k: getattr(values, k, None))
        alias = {"budget_usd": "budget"}
        out = {}
        for f in fields(cls):
            value = get(f.name)
            if value is None and f.name in alias:
                value = get(alias[f.name])
            if value is not None:
                out[f.name] = value
        return cls(**out)

    def given(self, name: str) -> bool:
        return getattr(self, name) is not None


@dataclass(frozen=True)
class Request:
    """An experiment as one command will run it: every field resolved, every warning found.

    ``catalog`` has the experiment's (and ``--cloud-overrides``') overrides applied; ``market``
    is a ``Market`` or ``"auto"`` (spot or on-demand per stage); ``deadline_s`` is ``None`` when
    none applies (a budget plan without ``--deadline``); ``zones`` is ``None`` (no zone search),
    ``"auto"`` (every zone of the region) or the zones named.
    """

    experiment: Experiment
    spec: ExperimentSpec
    models: ModelProfile | Mapping[str, ModelProfile]
    catalog: CloudCatalog
    instance_type: str
    market: Market | str
    confidence: float | None
    deadline_s: float | None
    budget_usd: float | None
    policy: str
    samples: int
    seed: int
    zones: tuple[str, ...] | str | None = None
    max_instances: int | Mapping[str, int] | None = None
    overrides: Overrides = field(default_factory=Overrides)
    warnings: tuple[str, ...] = ()
    # A surrogate job (DESIGN §4.6): ``models`` are the surrogate's, these the target stage's.
    target_models: ModelProfile | Mapping[str, ModelProfile] | None = None

    @property
    def name(self) -> str:
        return self.experiment.name

    @property
    def auto_instance_type(self) -> bool:
        return self.instance_type == AUTO

    @property
    def type_market(self) -> Market:
        """The market a type is priced at: on-demand when the planner chooses per stage."""
        return self.market if isinstance(self.market, Market) else Market.ON_DEMAND

    def cloud_for(self, instance_type: str) -> CloudProfile:
        """``instance_type``'s profile at the request's market, with its overrides."""
        return self.catalog.get(instance_type, self.type_market)

    @property
    def cloud(self) -> CloudProfile:
        """The profile of the request's type (the catalog's first under ``auto``)."""
        return self.cloud_for(self.catalog.instance_types[0] if self.auto_instance_type else self.instance_type)

    @property
    def types(self) -> list[str]:
        """The instance types the job may run on: its own, or every type of the catalog under ``auto``."""
        return list(self.catalog.instance_types) if self.auto_instance_type else [self.instance_type]


def resolve(experiment_path: str | Mapping[str, Any], overrides: Overrides | Mapping[str, Any] | None = None) -> Request:
    """Turn an experiment file (or its mapping, built by ``rubberband.Tuner``) plus the command
    line's ``overrides`` into a ``Request``.

    Raises:
        SpecError: one line naming the field or flag, for anything malformed or in conflict.
    """
    ov = overrides if isinstance(overrides, Overrides) else Overrides.of(overrides or {})
    found: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RubberbandWarning)
        exp = load_experiment(experiment_path, model_profile=ov.model_profile, cloud_overrides=ov.cloud_overrides)
    found += [str(w.message) for w in caught if issubclass(w.category, RubberbandWarning)]
    for w in caught:
        if not issubclass(w.category, RubberbandWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    deadline = parse_duration(ov.deadline, "--deadline") if ov.deadline is not None else exp.deadline_s
    budget = ov.budget_usd
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0 or not math.isfinite(budget):
            raise SpecError(f"--budget: expected a positive amount of dollars, e.g. 50, got {budget!r}")
        if ov.deadline is None:
            deadline = None       # the budget decides; the experiment's deadline is no promise here (plan_request says so)
    confidence = ov.confidence if ov.confidence is not None else exp.confidence
    if confidence is not None and not 0 < confidence < 1:
        raise SpecError(f"--confidence: must be between 0 and 1 (e.g. 0.9 for P(JCT <= deadline) >= 90%), "
                        f"got {confidence!r}")
    market: Market | str = exp.market
    if ov.market is not None:
        name = choice(ov.market, "--market", [m.value for m in Market] + [AUTO])
        market = AUTO if name == AUTO else Market(name)
    zones = _zones(ov.zone)
    if zones is not None and market is Market.ON_DEMAND and ov.market is None:
        market = Market.SPOT           # zones differ in their spot markets; keep an experiment's spot or auto
    instance_type = ov.instance_type or exp.instance_type
    if instance_type != AUTO:
        exp.catalog.get(instance_type, Market.ON_DEMAND, exp.cloud_overrides)    # did-you-mean, now
    exp = replace(exp, market=market, instance_type=instance_type)
    catalog = exp.catalog.with_overrides(exp.cloud_overrides)
    # A surrogate job plans by both profiles; without the surrogate's, planning says so (job_models).
    models, target = exp.job_models() if exp.surrogate_model is not None else (exp.model_for_planning, None)
    req = Request(
        experiment=exp, spec=exp.spec, models=models, target_models=target, catalog=catalog, instance_type=instance_type,
        market=market, confidence=confidence, deadline_s=deadline, budget_usd=budget,
        policy=ov.policy or exp.policy, samples=ov.samples if ov.samples is not None else exp.samples,
        seed=ov.seed if ov.seed is not None else exp.seed, zones=zones, max_instances=ov.max_instances, overrides=ov,
    )
    if zones is not None:      # a zone not in the trace file is an error before any warning about it
        from rubberband.plan.zones import zone_candidates

        zone_candidates(catalog, None if zones == AUTO else list(zones), instance_type)
    return replace(req, warnings=tuple(dict.fromkeys(found + request_warnings(req))))


def _zones(text: str | None) -> tuple[str, ...] | str | None:
    if text is None:
        return None
    if text.strip() == AUTO:
        return AUTO
    zones = tuple(z.strip() for z in text.split(",") if z.strip())
    if not zones:     # an empty list would otherwise read as every zone
        raise SpecError(f"--zone: {text!r} names no zone; give auto for every zone of the region, "
                        "or zones such as us-west-2a,us-west-2b")
    return zones


_ZONE = re.compile(r"^([a-z]{2}(?:-[a-z]+)+-\d+)[a-z]$")


def zone_region(zone: str) -> str | None:
    """``us-east-1a`` -> ``us-east-1``; ``None`` for a name that is no AWS zone."""
    m = _ZONE.match(zone)
    return m.group(1) if m else None


def request_warnings(req: Request) -> list[str]:
    """The warnings of a resolved request (beside those of loading its files): each way it can
    run but may mislead. Every command prints these."""
    out: list[str] = []
    spot = req.market is Market.SPOT or req.market == AUTO
    cloud = req.cloud
    if spot and not req.auto_instance_type and cloud.spot_price_usd_per_hour is not None:
        market = cloud.spot
        if not market.modelled:
            out.append(f"market {req.market if isinstance(req.market, str) else req.market.value}: {cloud.instance_type} "
                       "has no spot preemption model, so spot instances are modelled as never reclaimed; set "
                       "cloud.overrides.spot.preemption (rate_per_hour, trace or advisor)")
        elif market.rate_per_hour > 0 and market.notice_s > 3600 / market.rate_per_hour:
            out.append(f"spot.notice_s: a {market.notice_s:g}s notice is longer than a spot instance's mean lifetime "
                       f"({3600 / market.rate_per_hour:.0f}s at {market.rate_per_hour:g} reclaims/h): most replacements "
                       "are asked for as soon as an instance starts")
        zone = market.trace.zone if market.trace is not None else None
        if zone is not None and zone_region(zone) not in (None, cloud.region):
            out.append(_zone_warning(zone, cloud))
    if isinstance(req.zones, tuple):
        for zone in req.zones:
            if zone_region(zone) not in (None, cloud.region):
                out.append(_zone_warning(zone, cloud))
    emulation = req.overrides.spot_emulation
    if emulation:
        parts = dict(p.split("=", 1) for p in emulation.split(",") if "=" in p)
        if parts.get("max", "").strip() == "0":
            out.append("--spot-emulation: max=0 reclaims nothing, so the run is on-demand in all but price; "
                       "drop --spot-emulation, or give max=1 or more")
        zone = parts.get("zone", "").strip()
        if zone and zone_region(zone) not in (None, cloud.region):
            out.append(_zone_warning(zone, cloud))
    out += _idle_warnings(req)
    return out


def _zone_warning(zone: str, cloud: CloudProfile) -> str:
    return (f"zone {zone} is in {zone_region(zone)}, not {cloud.region}: its availability is replayed but priced at "
            f"{cloud.region}'s price; use a {zone_region(zone)} cloud profile, or a zone of {cloud.region}")


def _idle_warnings(req: Request) -> list[str]:
    """``--instances`` holding more instances than a stage's trials use (and no later stage
    uses them either): they are paid for idle."""
    ov = req.overrides
    if ov.allocation is None or ov.instances is None or req.auto_instance_type:
        return []
    from rubberband.simulator import instances_needed

    G = req.cloud.gpus_per_instance
    stages = req.spec.stages
    packing = ov.trials_per_gpu or (1,) * len(stages)
    fusion = ov.fused_per_gpu or (1,) * len(stages)
    if not (len(ov.allocation) == len(ov.instances) == len(stages) == len(packing) == len(fusion)):
        return []       # the simulator names the wrong length
    try:
        needed = [instances_needed(s.num_trials, a, G, k, f)
                  for s, a, k, f in zip(stages, ov.allocation, packing, fusion)]
    except (SpecError, ValueError, ZeroDivisionError, TypeError):
        return []
    out = []
    for i, (held, need) in enumerate(zip(ov.instances, needed)):
        later = max(needed[i + 1:], default=0)
        if held > max(need, later):
            out.append(f"--instances: stage {i} holds {held} instances but uses {need}"
                       + (f" (and no later stage more than {later})" if later else "")
                       + f": {held - max(need, later)} are paid for idle; give --instances "
                       + ",".join(str(min(h, max(n, max(needed[j + 1:], default=0))))
                                  for j, (h, n) in enumerate(zip(ov.instances, needed))))
    return out[:1]


def check_plan_size(req: Request) -> None:
    """Refuse a plan on one type too large for memory before its first table is drawn, spot
    market included (``limits.check_plan``; ``auto`` sizes each type's table as it goes)."""
    from rubberband.limits import check_plan
    from rubberband.profiles.by_gpu import model_of
    from rubberband.simulator import instances_needed

    if req.auto_instance_type:
        return
    cloud = req.cloud
    model = model_of(req.models, cloud) if isinstance(req.models, Mapping) else req.models
    widest = max(instances_needed(s.num_trials, s.num_trials * model.max_gpus, cloud.gpus_per_instance)
                 for s in req.spec.stages)
    spot = req.market != Market.ON_DEMAND and cloud.spot.at_risk and cloud.spot_price_usd_per_hour is not None
    # The fused variant tables draw one latency per group, ceil(n / F) rows per stage: fewer than
    # one more GPU count's together (sum of 1/F < 1).
    latencies = model.max_gpus - model.min_gpus + 1 + (1 if any(f > 1 for f in model.fused_counts) else 0)
    check_plan(req.spec.trials, latencies, widest, req.samples, spot)


def _dropped_deadline(req: Request) -> tuple[str, ...]:
    """A budget plan keeps no deadline but one asked for with ``--deadline``: say so when the
    experiment has one (a run would otherwise drop it without a word)."""
    own = req.experiment.deadline_s
    if req.overrides.deadline is not None or own is None:
        return ()
    return (f"--budget plans the shortest job within ${req.budget_usd:g}: the experiment's deadline "
            f"{format_duration(own)} is not kept; pass --deadline to keep it too",)


def plan_request(req: Request, *, confidence: float | None | str = "request", compare: bool = True,
                 progress: Any = None, step: Callable[[str], None] | None = None) -> Plan:
    """The request's plan: the cheapest that meets its deadline (``compile_plan``), over its
    zones (``plan_zones``), or the fastest within its budget (``plan_for_budget``).

    ``confidence`` replaces the request's when given (``None`` included). ``progress`` is the
    planner's callback (``compile_plan``'s); ``step(text)`` is told which budget probe and zone
    the planning is at (``"budget probe 3, zone us-west-2b (2 of 3)"``), for a progress line.

    Raises:
        SpecError: no deadline to plan for; InfeasibleDeadlineError: as ``compile_plan``.
    """
    from rubberband.plan import compile_plan

    conf = req.confidence if isinstance(confidence, str) else confidence      # "request": the request's own
    deadline, budget = req.deadline_s, req.budget_usd
    if req.spec.target_stage is not None and req.target_models is None:
        req.experiment.job_models()          # one line naming surrogate.model_profile
    check_plan_size(req)
    kwargs: dict[str, Any] = dict(policy=req.policy, samples=req.samples, seed=req.seed,
                                  instance_type=req.instance_type, market=req.market, progress=progress,
                                  max_instances=req.max_instances)
    if req.target_models is not None:
        kwargs["target_model"] = req.target_models
    where: dict[str, str] = {}

    def at(part: str, text: str) -> None:
        where[part] = text
        if step is not None:
            step(", ".join(where[k] for k in ("probe", "zone") if where.get(k)))

    probes = iter(range(1, 10**9))

    def probing(planner: Callable[[float], Plan]) -> Callable[[float], Plan]:
        """``planner`` with each budget probe counted on the progress line."""
        def probe(d: float) -> Plan:
            at("probe", f"budget probe {next(probes)}")
            return planner(d)
        return probe

    if req.zones is not None:
        kwargs["on_zone"] = lambda zone, k, n: at("zone", f"zone {zone} ({k} of {n})")

    def plan_for(d: float, **more: Any) -> Plan:
        """The cheapest plan that meets deadline ``d``: over the request's zones, or on its cloud."""
        if req.zones is not None:
            from rubberband.plan.zones import plan_zones

            zones = None if req.zones == AUTO else list(req.zones)
            # plan_zones hands the model to compile_plan, which takes one per GPU model too;
            # its own annotation says ModelProfile alone (plan/zones.py).
            return plan_zones(req.spec, req.models, req.catalog, d, zones, **more, **kwargs)  # type: ignore[arg-type]
        return compile_plan(req.spec, req.models, req.catalog, d, **more, **kwargs)

    if budget is not None:
        from rubberband.plan.budget import within_budget

        # plan_for_budget's search, with each probe counted on the progress line.
        plan = within_budget(probing(plan_for), budget, conf, deadline, field="--budget")
        return replace(plan, warnings=(*_dropped_deadline(req), *plan.warnings))
    if deadline is None:
        raise SpecError("deadline: the experiment has no `deadline:`; pass --deadline, e.g. --deadline 20m")
    return plan_for(deadline, confidence=conf, compare=compare)
