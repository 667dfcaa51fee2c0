"""compile_plan: the cheapest plan that meets a deadline, under a named policy."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from rubberband.errors import InfeasibleDeadlineError, SpecError
from rubberband.limits import check_samples_seed
from rubberband.plan.plan import Plan
from rubberband.plan.policies import (
    MAX_FULL_SIMULATIONS,
    Candidate,
    choose,
    get_policy,
    statics,
)
from rubberband.plan.search import Progress, StageGraph
from rubberband.plan.table import StageTable
from rubberband.plan.variants import (
    PACKING_MIN_GAIN,
    VariantTable,
    fusion_gain,
    fusion_pays,
    packing_gain,
    packing_pays,
)
from rubberband.profiles.by_gpu import model_of
from rubberband.profiles.cloud import CloudCatalog, CloudProfile, Market
from rubberband.profiles.model import ModelProfile
from rubberband.schema import choice, did_you_mean
from rubberband.simulator.engine import HeldInstances, simulate, spot_billable, stage_models
from rubberband.simulator.model import instances_needed
from rubberband.spec.experiment import ExperimentSpec


def compile_plan(spec: ExperimentSpec, model: ModelProfile | Mapping[str, ModelProfile],
                 cloud: CloudProfile | CloudCatalog, deadline_s: float,
                 policy: str = "optimal", samples: int = 200, seed: int = 0, confidence: float | None = None,
                 instance_type: str | None = None, market: str | Market | None = None,
                 compare: bool = False, progress: Progress | None = None,
                 held_at_start: HeldInstances | int | None = None,
                 max_instances: int | Mapping[str, int] | None = None,
                 target_model: ModelProfile | Mapping[str, ModelProfile] | None = None,
                 redone: Sequence[int] | None = None) -> Plan:
    """Find the cheapest plan that meets ``deadline_s`` under ``policy``.

    Args:
        spec: the job's stages.
        model: the model profile, or one per GPU model (``{"V100": a, "A10G": b}``): each
            type is planned by its own GPU model's profile, and a type whose GPU model has
            none is skipped (``plan.info["skipped"]`` says why).
        cloud: one instance type's profile, or a whole region's ``CloudCatalog`` together
            with ``instance_type``: a name, or ``"auto"`` to plan on every type with a
            profile of its GPUs. With ``auto`` and the optimal policy, each stage gets its own
            type (among the types of one GPU model; ``VariantTable``): a change of type at a
            SYNC releases every old instance and launches the new ones. The cheapest plan
            over the GPU models is kept; each type's own plan is in ``plan.considered``.
            Under the optimal policy a profile with ``packed_iter_latency_s`` lets each stage
            of 1-GPU trials pack ``k`` trials to a GPU (within the type's GPU memory) where
            that is cheaper (``Plan.trials_per_gpu``); one with ``fused_iter_latency_s`` lets it
            fuse ``F`` trials into one program per GPU instead (``Plan.fused_per_gpu``, DESIGN
            §4.5), only where the profile's fused throughput pays (``fusion_pays``) and the
            group fits the type's GPU memory (``ModelProfile.fused_fits``).
        deadline_s: the deadline in seconds.
        policy: ``optimal`` (default), ``greedy``, ``static`` or ``naive-elastic``.
        samples, seed: Monte-Carlo samples and seed; all candidates share the random numbers.
        confidence: if given (e.g. 0.9), require P(JCT <= deadline) >= confidence in full
            simulation instead of mean JCT <= deadline.
        market: ``on-demand`` or ``spot`` (default: a profile's own market, a catalog's
            on-demand; given, it applies to a profile too), or ``auto``: choose per stage between spot and on-demand instances
            (``market_vectors``), keeping the cheapest plan that meets the constraint in full
            simulation with spot reclaims (DESIGN §4.1). Spot stages that may be reclaimed
            are searched on stage means from the spot kernel, a surrogate within a stated
            tolerance of the full simulation (``StageTable``: mean JCT within 2%, mean cost
            within 3% at notices up to 120 s, 15% at 600 s), so the choice among spot plans is
            exact to that tolerance; the plan's ``predicted`` is always the full simulation of
            the plan chosen (what ``simulate_plan`` gives with the plan's seed).
        compare: also plan with every other policy and list them in ``plan.considered``.
        progress: called as the search goes with a ``PlanProgress`` (stage k of n, candidates
            kept), for a progress line; the planner itself prints nothing.
        held_at_start: instances the job already holds, up and initialised, at t = 0
            (``HeldInstances``; an int: on-demand ones of the plan's type), e.g. when the rest
            of a job is re-planned: every plan is weighed, and the chosen one simulated, from
            them (``simulate``'s ``held_at_start``). Stage 0 keeps what it can use of them and
            launches the rest; the search may also keep them for a later stage. With a
            catalog, name their type (``HeldInstances.instance_type``).
        max_instances: the most instances of a type any stage may hold (on-demand and spot
            together, and instances kept idle for a later stage too): one count for every type,
            or one per type name (a type not named has no limit), e.g. the room a real cluster
            has (its ``max_workers``). The search is exact within it: allocations needing more
            are no candidates of any policy, market or type-per-stage table, and no plan holds
            more (a stage that cannot run within it is a ``SpecError`` naming ``max_instances``).
        target_model: with a surrogate job (``spec`` ends in a target stage, DESIGN §4.6),
            the full-width model's profile (or one per GPU model) the target stage runs by;
            ``model`` is then the surrogate's. The search plans the whole job at once: the
            target stage has its own candidates (GPUs per trial by its profile), market and,
            with ``auto``, type, and the deadline covers it.
        redone: each stage's iterations a TRAIN trains again on resuming (DESIGN §4; default:
            ``redone_iters`` of ``spec``, as if nothing had been trained before it). A re-plan of
            the rest of a job passes the job's own (``Replanner.redone[first:]``): its first
            stages resume trials trained in the stages before, which ``spec`` no longer has.

    Returns:
        A new ``Plan`` (inputs are never modified).

    Raises:
        InfeasibleDeadlineError: no plan meets the deadline; names the shortest achievable JCT.
        SpecError: bad arguments (unknown policy, non-positive deadline, ...).
    """
    get_policy(policy)
    check_samples_seed(samples, seed)
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) or not deadline_s > 0 or not math.isfinite(deadline_s):
        raise SpecError(f"deadline_s: expected a positive number of seconds, got {deadline_s!r}")
    if confidence is not None and not 0 < confidence < 1:
        raise SpecError(f"confidence: must be between 0 and 1, got {confidence!r}")
    if spec.eager is not None:
        def sequential(d: float) -> Plan:
            return compile_plan(spec.without_eager(), model, cloud, d, policy, samples, seed, confidence,
                                instance_type, market, compare, progress, held_at_start, max_instances,
                                target_model, redone)

        tuning_redone = None if redone is None else tuple(redone)[:-1]

        def tuning(d: float) -> Plan:
            try:
                return compile_plan(spec.tuning, model, cloud, d, policy, samples, seed, confidence, instance_type,
                                    market, False, progress, held_at_start, max_instances, None, tuning_redone)
            except InfeasibleDeadlineError as exc:       # the tuning's fastest plan, where one type is all
                if not isinstance(cloud, CloudProfile) or not isinstance(model, ModelProfile) or held_at_start:
                    raise
                return plan_allocation(spec.tuning, exc.allocation, model, cloud, d, samples=samples, seed=seed,
                                       redone=tuning_redone)
        return replace(eager_search(sequential, spec, model, target_model, float(deadline_s), redone,
                                    check_max_instances(max_instances, cloud) if max_instances is not None else None,
                                    tuning), policy=policy)
    auto_market = market == AUTO
    if market is not None and not auto_market and not isinstance(market, Market):
        market = Market(choice(market, "market", [m.value for m in Market] + [AUTO]))
    models = check_models(model, cloud) if isinstance(model, Mapping) else None
    if (spec.target_stage is None) != (target_model is None):
        stage_models(model, [], False, spec, target_model)        # the one-line error naming target_model
    job = _Job(spec, float(deadline_s), policy, samples, seed, confidence, progress,
               _held_type(held_at_start, cloud, instance_type), check_max_instances(max_instances, cloud),
               check_models(target_model, cloud) if isinstance(target_model, Mapping) else target_model,
               check_redone(redone, spec))
    if isinstance(cloud, CloudCatalog):
        if not instance_type:
            raise SpecError("instance_type: name an instance type of the catalog, or `auto` to compare them")
        catalog = cloud
        market = market or Market.ON_DEMAND
        if instance_type == "auto":
            plan = _plan_auto(job, models or _models_of(model, catalog), catalog, market, compare)
            return _within_caps(replace(plan, warnings=plan_warnings(plan, model_of(models or model, plan.cloud), catalog)
                                        + plan.warnings), job.caps)
        cloud = catalog.get(instance_type, Market.ON_DEMAND if auto_market else market)
    else:
        catalog = None
        if isinstance(market, Market) and market is not cloud.market:
            # A market asked for applies to the profile too (a spot plan, not silently an on-demand one).
            if market is Market.SPOT and cloud.spot_price_usd_per_hour is None:
                raise SpecError(f"market: {cloud.instance_type} has no spot_price_usd_per_hour; "
                                "add one to the cloud profile or plan on-demand")
            cloud = cloud.replace(market=market)
    model = model_of(models, cloud) if models is not None else model
    plan = _plan_one(job, model, cloud, market=market)
    if compare:      # with markets, the considered plans are the markets weighed, then the other policies on the chosen ones
        plan = _with_considered(plan, ([] if auto_market else [plan.summary()]) + list(plan.considered if auto_market else ())
                                + _other_policies(job, model, cloud, plan))
    return _within_caps(replace(plan, warnings=plan_warnings(plan, model, catalog) + plan.warnings), job.caps)


class OverCapError(SpecError):
    """An eager plan holds more instances at once than ``max_instances`` allow (``eager_plan``)."""


# Eager transfer's search (``eager_search``): the sequential optima at the deadline times these
# (the deadline itself first). Tighter ones too: a faster target holds its instances for less.
EAGER_RELAXATIONS = (1.0, 0.6, 0.8, 0.9, 1.1, 1.25, 1.5, 2.0)


# ... and the tuning's own optima at the deadline times these, each with every target GPU count.
EAGER_TUNING_SHARES = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def eager_search(sequential: Callable[[float], Plan], spec: ExperimentSpec,
                 model: ModelProfile | Mapping[str, ModelProfile],
                 target_model: ModelProfile | Mapping[str, ModelProfile] | None, deadline_s: float,
                 redone: Sequence[int] | None = None, caps: Caps = None,
                 tuning: Callable[[float], Plan] | None = None) -> Plan:
    """The plan of a surrogate job whose target starts early (DESIGN §4.6): the cheapest, run
    eagerly (``eager_plan``), of the sequential job's optimal plans at the deadline times each of
    ``EAGER_RELAXATIONS``: one slower in sequence may still make the deadline with the overlap, for
    less, and a faster one may cost less run eagerly (its target holds its instances for less).
    ``sequential(d)`` is the exact sequential planner at deadline ``d``. With ``tuning(d)``, the
    exact planner of the tuning stages alone, it weighs too each of the tuning's optima at the
    deadline times ``EAGER_TUNING_SHARES`` followed by the target at each GPU count of its profile
    (single-type on-demand plans: ``_with_target``). Every candidate is checked against
    ``deadline_s`` itself. A search over those frontiers, not over every plan:
    ``tests/unit/plan/test_eager_plan.py`` measures it against brute force.

    Raises:
        InfeasibleDeadlineError, SpecError: as ``eager_plan`` for the plan at the deadline itself,
            when no relaxed one meets it either.
    """
    best: Plan | None = None
    first_error: Exception | None = None
    seen: set[tuple] = set()

    def weigh(candidate: Callable[[], Plan | None], must: bool = False) -> None:
        nonlocal best, first_error
        try:
            seq = candidate()
            if seq is None:
                return
            key = (seq.allocation, seq.instances, seq.stage_types, seq.packing, seq.fusion, seq.spot_counts)
            if key in seen:
                return
            seen.add(key)
            plan = eager_plan(seq, spec, model, target_model, redone, caps, deadline_s)
        except (InfeasibleDeadlineError, OverCapError) as exc:      # this candidate cannot: others may
            first_error = first_error or exc
            return
        except SpecError as exc:
            if must:           # the request itself is wrong (or spot): no candidate will do
                raise
            first_error = first_error or exc
            return
        if best is None or plan.predicted.mean_cost_usd < best.predicted.mean_cost_usd:
            best = plan

    for factor in EAGER_RELAXATIONS:
        weigh(lambda: sequential(deadline_s * factor), must=factor == 1.0)
    if tuning is not None and best is not None and not isinstance(target_model, Mapping):
        # The overlap trades the tuning's pace against the target's: the tuning's own optima at
        # shorter deadlines, each with the target at every GPU count its profile has.
        for factor in EAGER_TUNING_SHARES:
            try:
                tuned = tuning(deadline_s * factor)
            except (InfeasibleDeadlineError, SpecError):
                continue
            for gpus in range(target_model.min_gpus if target_model else 1,
                              (target_model.max_gpus if target_model else 1) + 1):
                weigh(lambda: _with_target(tuned, gpus, spec, model, target_model, redone))
    if best is None:
        assert first_error is not None
        raise first_error
    return best


def _with_target(tuned: Plan, gpus: int, spec: ExperimentSpec, model: ModelProfile | Mapping[str, ModelProfile],
                 target_model: ModelProfile | None, redone: Sequence[int] | None) -> Plan | None:
    """A tuning plan followed by a target stage of ``gpus`` GPUs on the tuning's one type
    (on-demand, the fewest instances): ``None`` where that plan is no single-type, on-demand,
    unpacked one ``plan_allocation`` can state."""
    if len(set(tuned.stage_types)) != 1 or any(tuned.spot_counts) or any(k > 1 for k in tuned.packing) \
            or tuned.held_at_start is not None or tuned.cloud.market is not Market.ON_DEMAND:
        return None
    cloud = tuned.cloud
    need = instances_needed(1, gpus, cloud.gpus_per_instance)
    fused = tuple(tuned.fusion) + (1,) if any(f > 1 for f in tuned.fusion) else None
    return plan_allocation(spec.without_eager(), tuple(tuned.allocation) + (gpus,), model, cloud, tuned.deadline_s,
                           instances=tuple(tuned.instances) + (need,), samples=tuned.samples or 200, seed=tuned.seed,
                           fused_per_gpu=fused, target_model=target_model, redone=redone)


def eager_plan(sequential: Plan, spec: ExperimentSpec, model: ModelProfile | Mapping[str, ModelProfile],
               target_model: ModelProfile | Mapping[str, ModelProfile] | None,
               redone: Sequence[int] | None = None, caps: Caps = None, deadline_s: float | None = None) -> Plan:
    """A surrogate job with an eager target stage (DESIGN §4.6), planned: the allocation of
    ``sequential`` (the same job with its target after the tuning, planned exactly) simulated
    with the target started early, on the same samples and seed. The search does not weigh the
    overlap itself (the mean of the later of two ends is not a sum over stages); the plan
    records the sequential prediction beside its own (``info["eager_transfer"]``) and must meet
    the deadline as planned, now with the overlap and the restarts.

    ``caps`` (``max_instances``) count the target's instances together with those of each tuning
    stage it overlaps. ``deadline_s``: the one to meet (default: ``sequential``'s).

    Raises:
        SpecError: the plan holds spot instances (an eager job runs on on-demand ones), or
            with the target's instances it holds more of a type than ``caps`` allow.
        InfeasibleDeadlineError: the plan run eagerly misses the deadline it met sequentially.
    """
    plan = replace(sequential, spec=spec)
    for j, n in peak_instances(plan).items():
        cap = type_cap(caps, plan.stage_types[j])
        if cap is not None and n > cap:
            raise OverCapError(f"max_instances: with the target started early its {plan.instances[-1]} instance(s) run "
                            f"beside stage {j}'s {plan.instances[j]}, {n} {plan.stage_types[j]} in all, over the limit "
                            f"of {cap}; raise --max-instances, or drop eager_transfer")
    if any(plan.spot_counts):
        raise SpecError(f"market: the plan holds spot instances ({list(plan.spot_counts)} per stage), and a job whose "
                        "target starts early (surrogate.eager_transfer) runs on on-demand ones; plan with --market "
                        "on-demand, or drop eager_transfer")
    result = simulate(spec, plan.allocation, model, samples=plan.samples or sequential.predicted.samples,
                      seed=plan.seed, target_model=target_model, redone=redone, **plan.simulation_args())
    if deadline_s is not None:
        plan = replace(plan, deadline_s=deadline_s)
    deadline, confidence = plan.deadline_s, plan.confidence
    met = result.p_meet(deadline) >= confidence if confidence is not None else result.mean_jct_s <= deadline
    if math.isfinite(deadline) and not met:
        needed = float(np.quantile(result.jct_s, confidence)) if confidence is not None else result.mean_jct_s
        raise InfeasibleDeadlineError(deadline, result.mean_jct_s, plan.allocation, confidence=confidence,
                                      needed_s=needed, detail=" with the target started early (eager transfer)")
    seq = sequential.predicted
    plan = replace(plan, predicted=result, info={**plan.info, "eager_transfer": {
        **spec.eager.to_dict(), "sequential_jct_s_mean": seq.mean_jct_s, "sequential_cost_usd_mean": seq.mean_cost_usd}})
    if plan.considered:      # the plans weighed, as weighed: with the target after the tuning
        peak = max([*peak_instances(plan).values(), *plan.instances])
        plan = replace(plan, considered=({**plan.summary(), "peak_instances": peak},
                                         *({**c, "policy": f"{c['policy']} (target after tuning)"}
                                           for c in sequential.considered)))
    return plan


def peak_instances(plan: Plan) -> dict[int, int]:
    """Per tuning stage an eager target (DESIGN §4.6) overlaps, the instances of that stage's
    type held at once: the stage's own, and the target's when it is of the same type."""
    eager = plan.spec.eager
    if eager is None:
        return {}
    last, types = len(plan.instances) - 1, plan.stage_types
    return {j: plan.instances[j] + (plan.instances[last] if types[j] == types[last] else 0)
            for j in range(eager.after_stage + 1, last)}


def _within_caps(plan: Plan, caps: Caps) -> Plan:
    """``plan`` with the ``max_instances`` it was planned within in ``info["max_instances"]``:
    a run re-plans within it too (``executor/run.py: _cluster_room``)."""
    return plan if caps is None else replace(plan, info={**plan.info, "max_instances": caps})


@dataclass(frozen=True)
class _Job:
    """What every plan of one ``compile_plan`` call shares: the job, its constraint and its
    search settings (the private helpers take this instead of a long positional bundle)."""

    spec: ExperimentSpec
    deadline_s: float
    policy: str
    samples: int
    seed: int
    confidence: float | None
    progress: Progress | None = None
    held: HeldInstances | None = None
    caps: Caps = None
    target: ModelProfile | Mapping[str, ModelProfile] | None = None    # a surrogate job's target stage's
    redone: tuple[int, ...] | None = None       # each stage's redone iterations (``None``: ``spec``'s own)

    def target_for(self, cloud: CloudProfile, catalog: CloudCatalog | None = None) -> ModelProfile | None:
        """The target stage's profile on ``cloud`` (its GPU model's); with the ``catalog`` it was
        measured in, only the GPU counts that hold on ``cloud``'s instances (``usable_profile``,
        as ``auto`` plans the tuning stages)."""
        if self.target is None:
            return None
        target = model_of(self.target, cloud, "target_model") if isinstance(self.target, Mapping) else self.target
        if catalog is not None:
            usable = usable_profile(target, profile_gpu(target, catalog)[1], cloud.gpus_per_instance)
            if usable is None:
                raise SpecError(f"target_model: profile {target.name!r} starts at {target.min_gpus} GPUs per trial, "
                                f"more than one {cloud.instance_type} holds")
            return usable
        return target

    def table(self, model: ModelProfile, cloud: CloudProfile) -> StageTable:
        return StageTable(self.spec, model, cloud, samples=self.samples, seed=self.seed, held_at_start=self.held,
                          max_instances=type_cap(self.caps, cloud), target_model=self.target_for(cloud),
                          redone=self.redone)


def _plan_one(job: _Job, model, cloud, table=None, market: Market | str | None = None, cost_cap: float = math.inf,
              policy: str | None = None) -> Plan | None:
    """The plan on one type (or ``table``'s variants), on ``market``, under ``policy`` (default the
    job's). With a finite ``cost_cap`` (a plan in hand costs that much), only plans of surrogate
    cost under it are weighed: ``None`` when there is none."""
    policy = policy or job.policy
    if table is None and policy == "optimal" and (packing_counts(model, cloud) or fusion_counts(model, cloud)):
        table = VariantTable(variant_tables(job.spec, model, cloud.replace(market=Market.ON_DEMAND) if market == AUTO
                                            else cloud, job.samples, job.seed, held=job.held, caps=job.caps,
                                            target_model=job.target_for(cloud), redone=job.redone),
                             model, job.target_for(cloud))
    if market == AUTO:
        return plan_markets(job.spec, model, cloud, job.deadline_s, policy, job.samples, job.seed, job.confidence,
                            base=table, progress=job.progress, cost_cap=cost_cap, held=job.held, caps=job.caps,
                            target_model=job.target_for(cloud), redone=job.redone)
    table = table or job.table(model, cloud)
    if math.isfinite(cost_cap):
        return cheaper_plan(table, job.deadline_s, policy, job.confidence, cost_cap=cost_cap, progress=job.progress)
    return plan_on_table(table, job.deadline_s, policy, job.confidence, progress=job.progress)


def check_redone(redone: Sequence[int] | None, spec: ExperimentSpec) -> tuple[int, ...] | None:
    """``redone`` as one whole count of at least 0 per stage of ``spec`` (``None`` stays ``None``).

    Raises:
        SpecError: naming ``redone``.
    """
    if redone is None:
        return None
    if isinstance(redone, (str, bytes)) or not isinstance(redone, Sequence | np.ndarray) or len(redone) != spec.num_stages():
        raise SpecError(f"redone: expected {spec.num_stages()} counts of redone iterations, one per stage, got {redone!r}")
    out = []
    for r in redone:
        if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0:
            raise SpecError(f"redone: expected whole numbers of iterations, at least 0, got {redone!r}")
        out.append(int(r))
    return tuple(out)


def _held_type(held: HeldInstances | int | None, cloud: CloudProfile | CloudCatalog,
               instance_type: str | None) -> HeldInstances | None:
    """``held_at_start`` checked, with its type filled in: a profile's own, or the catalog type
    planned on; over several types (``auto``) it must be named."""
    held = HeldInstances.of(held)
    if held is None:
        return None
    held.check_type(cloud)
    if held.instance_type is not None:
        return held
    if isinstance(cloud, CloudProfile):
        return replace(held, instance_type=cloud.instance_type)
    if instance_type and instance_type != "auto":
        return replace(held, instance_type=instance_type)
    raise SpecError("held_at_start.instance_type: planning over several instance types needs the type of the "
                    "instances held, e.g. HeldInstances(4, instance_type='p3.8xlarge')")


# Instances a stage may hold: one count for every type, or per type name (absent: no limit).
Caps = int | Mapping[str, int] | None


def check_max_instances(max_instances, cloud: CloudProfile | CloudCatalog) -> Caps:
    """``max_instances`` checked: a positive count, or positive counts by type names of the cloud."""
    def count(value, field: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"{field}: expected a positive number of instances, got {value!r}")
        return value

    if max_instances is None or not isinstance(max_instances, Mapping):
        return None if max_instances is None else count(max_instances, "max_instances")
    known = list(catalog_entries(cloud))
    for name in max_instances:
        if name not in known:
            raise SpecError(f"max_instances[{name!r}]: no such instance type{did_you_mean(str(name), known)}; "
                            f"the types are {', '.join(known)}")
    return {name: count(v, f"max_instances[{name!r}]") for name, v in max_instances.items()}


def type_cap(caps: Caps, cloud: CloudProfile | str) -> int | None:
    """The most instances of ``cloud``'s type (or the type named) a stage may hold under ``caps``
    (``None``: no limit)."""
    name = cloud if isinstance(cloud, str) else cloud.instance_type
    return caps.get(name) if isinstance(caps, Mapping) else caps


def packing_counts(model: ModelProfile, cloud: CloudProfile) -> list[int]:
    """The trials per GPU above 1 the search may pack on ``cloud``: the profile's packed counts
    that its GPU memory holds and whose throughput clearly pays (``packing_pays``; none when the
    profile has no 1-GPU trials)."""
    if 1 not in model.iter_latency_s:
        return []
    try:
        cap = model.max_trials_per_gpu(cloud.gpu_memory_gb)
    except SpecError:      # one trial alone is above the GPU's memory: nothing to pack
        return []
    return [k for k in model.packing_counts if 1 < k <= cap and packing_pays(model, k)]


def fusion_counts(model: ModelProfile, cloud: CloudProfile) -> list[int]:
    """The trials fused per GPU above 1 the search may use on ``cloud`` (DESIGN §4.5): the
    profile's fused group sizes that one of its GPUs holds (``ModelProfile.fused_fits``: Hydro's
    ``max_fused`` on the fitted memory, and the measured memory) and whose throughput clearly
    pays (``fusion_pays``); none when the profile has no 1-GPU trials."""
    if 1 not in model.iter_latency_s:
        return []
    return [f for f in model.fused_counts
            if f > 1 and model.fused_fits(f, cloud.gpu_memory_gb) and fusion_pays(model, f)]


def variant_tables(spec: ExperimentSpec, model: ModelProfile, cloud: CloudProfile, samples: int, seed: int,
                   draws=None, held: HeldInstances | None = None, caps: Caps = None,
                   target_model: ModelProfile | None = None, redone: Sequence[int] | None = None) -> list[StageTable]:
    """One ``StageTable`` per trials per GPU on ``cloud`` (1, then each of ``packing_counts``), and
    one per trials fused per GPU (each of ``fusion_counts``), on one set of random streams
    (``draws``: another type's, to share), from the instances ``held`` at the start, with at
    most ``caps`` instances of the type. Packing and fusion are variants of their own, so a
    stage is unfused, packed or fused, never both. ``target_model``: a surrogate job's target
    stage's profile (DESIGN §4.6); its one trial never packs nor fuses. ``redone``: each stage's
    redone iterations (``compile_plan``'s; ``None``: ``spec``'s own)."""
    cap = type_cap(caps, cloud)
    first = StageTable(spec, model, cloud, samples=samples, seed=seed, draws=draws, held_at_start=held,
                       max_instances=cap, target_model=target_model, redone=redone)
    return ([first] + [StageTable(spec, model, cloud, samples=samples, seed=seed, trials_per_gpu=k, draws=first.draws,
                                  held_at_start=held, max_instances=cap, target_model=target_model, redone=redone)
                       for k in packing_counts(model, cloud)]
            + [StageTable(spec, model, cloud, samples=samples, seed=seed, fused_per_gpu=f, draws=first.draws,
                          held_at_start=held, max_instances=cap, target_model=target_model, redone=redone)
               for f in fusion_counts(model, cloud)])


AUTO = "auto"
# Plans of a market vector with reclaims simulated in full, cheapest surrogate first.
SPOT_SIMULATIONS = 16


def market_vectors(num_stages: int) -> list[tuple[Market, ...]]:
    """The per-stage markets ``market="auto"`` weighs: all on-demand, all spot, and every split
    into a spot part and an on-demand part (spot first — the many short early trials lose
    little to a reclaim — or on-demand first). 2 x stages vectors."""
    od, spot = Market.ON_DEMAND, Market.SPOT
    vectors = [(od,) * num_stages, (spot,) * num_stages]
    for k in range(1, num_stages):
        vectors.append((spot,) * k + (od,) * (num_stages - k))
        vectors.append((od,) * k + (spot,) * (num_stages - k))
    return vectors


def plan_markets(spec: ExperimentSpec, model: ModelProfile, cloud: CloudProfile, deadline_s: float, policy: str,
                 samples: int, seed: int, confidence: float | None, base: StageTable | None = None,
                 progress: Progress | None = None, cost_cap: float = math.inf,
                 held: HeldInstances | None = None, caps: Caps = None,
                 target_model: ModelProfile | None = None, redone: Sequence[int] | None = None) -> Plan | None:
    """The cheapest plan over ``market_vectors``: each is planned exactly as an on-demand job is
    (its stage means from the spot kernel where instances may be reclaimed, see ``StageTable``)
    and kept only if it meets the constraint in full simulation with reclaims. The considered
    plans list all on-demand, all spot and the chosen mix; a job that spot cannot carry falls
    back to on-demand stages and says so in ``Plan.warnings``. ``base``: an on-demand table of the
    same job and cloud to derive the markets' tables from (what-if sweeps share one across
    deadlines). With a finite ``cost_cap`` (a plan in hand elsewhere costs that much) every vector
    is cut there (``cheaper_plan``), all on-demand and all spot too: ``None`` when none has a plan
    left. ``held``: the instances held at the start (a ``base`` given has its own, and its own
    ``redone``: each stage's redone iterations, ``None``: ``spec``'s own)."""
    if cloud.spot_price_usd_per_hour is None:
        plan = _plan_one(_Job(spec, deadline_s, policy, samples, seed, confidence, progress, held, caps, target_model,
                              check_redone(redone, spec)),
                         model, cloud.replace(market=Market.ON_DEMAND))
        return replace(plan, warnings=(f"market auto: {cloud.instance_type} has no spot price; planned on-demand",))
    base = base or StageTable(spec, model, cloud.replace(market=Market.ON_DEMAND), samples=samples, seed=seed,
                              held_at_start=held, max_instances=type_cap(caps, cloud), target_model=target_model,
                              redone=check_redone(redone, spec))
    plans: dict[tuple[Market, ...], Plan | InfeasibleDeadlineError | None] = {}
    best_usd = cost_cap
    vectors = market_vectors(spec.num_stages())
    screened = _screen_zone(base, vectors, deadline_s, confidence) if cloud.spot.trace is not None else {}
    for k, markets in enumerate(vectors):
        if Market.SPOT in markets and not spot_billable(cloud):
            plans[markets] = InfeasibleDeadlineError(deadline_s, math.inf, (), detail=", spot under per-function billing")
            continue
        table = base.for_markets(markets)
        # Stage means with reclaims (on a traced market, without them) are a surrogate, not a
        # bound: weigh the cheapest few in full.
        budget = SPOT_SIMULATIONS if Market.SPOT in markets and cloud.spot.at_risk else MAX_FULL_SIMULATIONS
        if markets in screened:
            plans[markets] = screened[markets] if k < 2 else None
            continue
        if k < 2 and not math.isfinite(cost_cap):   # listed in the considered plans, so planned in full
            try:
                plans[markets] = plan_on_table(table, deadline_s, policy, confidence, budget, progress)
            except InfeasibleDeadlineError as exc:
                plans[markets] = exc
        else:          # a mix only matters if it beats the cheapest plan so far
            plans[markets] = cheaper_plan(table, deadline_s, policy, confidence, budget, best_usd, progress)
        if isinstance(plans[markets], Plan):
            best_usd = min(best_usd, plans[markets].predicted.mean_cost_usd)
    feasible = [p for p in plans.values() if isinstance(p, Plan)]
    if not feasible and math.isfinite(cost_cap):
        return None
    if not feasible:
        raise plans[(Market.ON_DEMAND,) * spec.num_stages()]   # the on-demand plan's own reason
    best = min(feasible, key=lambda p: p.predicted.mean_cost_usd)
    rows = []
    for markets, label in (((Market.ON_DEMAND,) * spec.num_stages(), "all on-demand"),
                           ((Market.SPOT,) * spec.num_stages(), "all spot")):
        p = plans[markets]
        if p is None:      # under a cost cap: not cheaper, which is all that is known
            continue
        rows.append({**p.summary(), "market": label} if isinstance(p, Plan) else
                    {"policy": policy, "instance_type": cloud.instance_type, "market": label, "infeasible": str(p)})
    rows.append({**best.summary(), "market": "chosen: " + market_label(best)})
    warnings = ()
    all_spot = plans[(Market.SPOT,) * spec.num_stages()]
    spot_fails = isinstance(all_spot, InfeasibleDeadlineError)    # None under a cap: not known
    if spot_fails and any(best.spot_counts):
        od = [i for i, n in enumerate(best.spot_counts) if n == 0]
        warnings = (f"market auto: all spot cannot meet the deadline; stage(s) {', '.join(map(str, od))} "
                    f"run on on-demand instances",)
    elif not any(best.spot_counts) and spot_fails:
        warnings = ("market auto: all spot cannot meet the deadline, nor is any mix cheaper; planned on-demand",)
    if any(best.spot_counts) and not cloud.spot.modelled:
        warnings += (f"market auto: {cloud.instance_type} has no spot preemption model, so spot instances were "
                     "planned as never reclaimed; set cloud.overrides.spot.preemption (rate_per_hour, trace or advisor)",)
    return replace(best, considered=tuple(rows), warnings=warnings)


def _screen_zone(base: StageTable, vectors: list[tuple[Market, ...]], deadline_s: float,
                 confidence: float | None) -> dict[tuple[Market, ...], InfeasibleDeadlineError | None]:
    """The market vectors with spot stages that a traced zone cannot carry (``_fastest_misses``),
    screened from the fewest spot stages up: a vector whose spot stages include all of one that
    failed is exposed to the same outages for longer, and fails without a simulation of its own
    (all spot, listed among the considered plans, is always simulated for its reason)."""
    out: dict[tuple[Market, ...], InfeasibleDeadlineError | None] = {}
    failed: list[set[int]] = []
    everything = (Market.SPOT,) * base.num_stages
    for markets in sorted((v for v in vectors if Market.SPOT in v), key=lambda v: v.count(Market.SPOT)):
        spot = {i for i, m in enumerate(markets) if m is Market.SPOT}
        if markets != everything and any(f <= spot for f in failed):
            out[markets] = None
            continue
        missed = _fastest_misses(base.for_markets(markets), deadline_s, confidence)
        if missed is not None:
            failed.append(spot)
            out[markets] = missed
    return out


def _fastest_misses(table: StageTable, deadline_s: float, confidence: float | None) -> InfeasibleDeadlineError | None:
    """On a traced market: why a market vector cannot carry the job, if its fastest plan (of
    the allocations that run every trial at once) misses the constraint in full simulation,
    else ``None``. A zone reclaims all its spot instances at once, however many, so a slower
    plan of the same markets spends longer exposed to the same outages with less slack: the
    screen that spares simulating plan after plan of a zone that cannot carry the job (the
    stage means it is searched on know nothing of the trace)."""
    # Within ``max_instances`` a stage may only queue: its allocations all stay in then.
    allocations = [[a for a in table.candidates(i) if table.parallel(i, a)] or table.candidates(i)
                   for i in range(table.num_stages)]
    fastest = StageGraph(table, allocations=allocations).fastest()
    result = table.simulate(fastest.allocation, fastest.instances)
    jct = np.sort(result.jct_s)
    needed = result.mean_jct_s if confidence is None else float(jct[max(0, math.ceil(confidence * len(jct) - 1e-9) - 1)])
    if needed <= deadline_s * (1 + 1e-9):
        return None
    return InfeasibleDeadlineError(deadline_s, result.mean_jct_s, fastest.allocation,
                                   detail=f" on {table.cloud.instance_type} with spot stages in its zone",
                                   confidence=confidence, needed_s=needed)


def market_label(plan: Plan) -> str:
    """``on-demand``, ``spot`` or ``spot 0-1, on-demand 2-3`` for a plan's stages."""
    spot = [n > 0 for n in plan.spot_counts]
    if all(spot):
        return "spot"
    if not any(spot):
        return "on-demand"
    parts, start = [], 0
    for i in range(1, len(spot) + 1):
        if i == len(spot) or spot[i] != spot[start]:
            name = "spot" if spot[start] else "on-demand"
            parts.append(f"{name} {start}" + (f"-{i - 1}" if i - 1 > start else ""))
            start = i
    return ", ".join(parts)


def plan_on_table(table: StageTable, deadline_s: float, policy: str, confidence: float | None = None,
                  max_simulations: int = MAX_FULL_SIMULATIONS, progress: Progress | None = None) -> Plan:
    """Plan with an already built ``StageTable`` (what-if sweeps share one across deadlines)."""
    plan = cheaper_plan(table, deadline_s, policy, confidence, max_simulations, progress=progress)
    if plan is None:
        cloud = table.cloud
        fastest = fastest_plan(table)
        needed = None
        if confidence is not None:
            # Meeting the deadline with probability p takes the p-quantile of the JCT, drawn
            # from the same samples the search used: the mean is not enough.
            jct = np.sort(table.simulate(fastest.allocation, fastest.instances).jct_s)
            needed = float(jct[max(0, math.ceil(confidence * len(jct) - 1e-9) - 1)])
        types = getattr(table, "type_names", [cloud.instance_type])   # a VariantTable's keys, decoded
        raise InfeasibleDeadlineError(deadline_s, fastest.jct_s,
                                      table.plan_fields(fastest.allocation, fastest.instances)["allocation"],
                                      detail=f" on {'/'.join(types)}, policy {policy}",
                                      confidence=confidence, needed_s=needed)
    return plan


def cheaper_plan(table: StageTable, deadline_s: float, policy: str, confidence: float | None = None,
                 max_simulations: int = MAX_FULL_SIMULATIONS, cost_cap: float = math.inf,
                 progress: Progress | None = None) -> Plan | None:
    """``plan_on_table``'s plan, or ``None`` when no plan meets the constraint; with ``cost_cap``,
    only plans whose surrogate cost is below it are weighed (the optimal policy cuts its
    search there: a plan already in hand costs that much)."""
    spec, samples, seed = table.spec, table.samples, table.seed
    candidates = get_policy(policy)(table, deadline_s, confidence, cost_cap=cost_cap, progress=progress)
    if math.isfinite(cost_cap):
        candidates = [c for c in candidates if c.cost_usd < cost_cap]
    chosen = choose(table, candidates, deadline_s, confidence, max_simulations, progress)
    if chosen is None:
        return None
    candidate, result = chosen
    return Plan(
        gpus_per_trial=tuple(s.gpus_per_trial for s in result.stages), predicted=result,
        deadline_s=float(deadline_s), policy=policy, spec=spec, confidence=confidence,
        samples=samples, seed=seed, info={"note": candidate.note, "candidates": len(candidates)},
        held_at_start=table.held_at_start, **table.plan_fields(candidate.allocation, candidate.instances),
    )


def fastest_plan(table: StageTable) -> Candidate:
    """The plan with the shortest mean JCT: the end of the optimal Pareto front, or a static
    cluster (which holds instances across stages and so skips later scale-ups)."""
    fastest = StageGraph(table).fastest()
    cands = [Candidate(fastest.allocation, fastest.instances, *table.evaluate(fastest.allocation, fastest.instances))]
    cands += statics(table)
    return min(cands, key=lambda c: (c.jct_s, c.cost_usd))


def _other_policies(job: _Job, model: ModelProfile, cloud: CloudProfile, chosen: Plan) -> list[dict]:
    """The other policies' plans on the chosen plan's type and markets (stage by stage: a spot
    plan's baselines are spot plans too, never on-demand ones beside it)."""
    from rubberband.plan.policies import POLICIES

    markets = tuple(Market.SPOT if n else Market.ON_DEMAND for n in chosen.spot_counts)
    mixed = Market.SPOT in markets and cloud.market is not Market.SPOT      # markets chosen per stage
    table = job.table(model, cloud)
    if mixed:
        table = table.for_markets(markets)
    label = {"market": market_label(chosen)} if mixed else {}
    out = []
    for name in POLICIES:
        if name == job.policy:
            continue
        try:
            out.append({**_plan_one(job, model, cloud, table, policy=name).summary(), **label})
        except InfeasibleDeadlineError as exc:
            out.append({"policy": name, "instance_type": cloud.instance_type, "infeasible": str(exc), **label})
    return out


def _with_considered(plan: Plan, considered: list[dict]) -> Plan:
    return replace(plan, considered=tuple(considered))


def profile_gpu(model: ModelProfile, catalog: CloudCatalog | None = None) -> tuple[str | None, int | None]:
    """The GPU model and GPUs per instance of the type the profile was measured on, where known
    (``measured_on.gpu_model`` and ``measured_on.instance_type``, looked up in ``catalog``)."""
    measured = model.measured_on or {}
    entry = catalog.types.get(measured.get("instance_type"), {}) if catalog is not None else {}
    gpu = measured.get("gpu_model") or entry.get("gpu_model")
    return (str(gpu) if gpu is not None else None), entry.get("gpus_per_instance")


def usable_profile(model: ModelProfile, measured_g: int | None, gpus_per_instance: int) -> ModelProfile | None:
    """The part of ``model`` that holds on instances of ``gpus_per_instance`` GPUs of the profiled
    GPU model, or ``None`` if no GPU count does.

    A trial that fits on one instance (m <= G) runs as it did when profiled, or better (on one
    instance instead of several). A wider trial spreads over ``ceil(m / G)`` instances: the
    profile covers that only if the profiled instances were no wider (the same gang or fewer,
    wider instances); on narrower instances the gang crosses the network more than the profile
    ever saw, so those counts are dropped.
    """
    if measured_g is None or gpus_per_instance >= measured_g:
        return model
    if model.min_gpus > gpus_per_instance:
        return None
    kept = {g: d for g, d in model.iter_latency_s.items() if g <= gpus_per_instance}
    if model.covers(gpus_per_instance):
        kept[gpus_per_instance] = model.latency(gpus_per_instance)   # the interpolated edge stays exact
    return model.replace(iter_latency_s=kept)


def plan_warnings(plan: Plan, model: ModelProfile, catalog: CloudCatalog | None = None) -> tuple[str, ...]:
    """One line for each way the plan's instance type departs from what the profile measured,
    and one for packed latencies too slow to be offered (``packing_pays``).

    Another GPU model makes every iteration time a guess. A trial spread over instances
    narrower than the profiled ones crosses the network more than it did when profiled, so
    its iteration time is likely optimistic (``auto`` never plans such trials).
    """
    gpu, measured_g = profile_gpu(model, catalog)
    cloud, out = plan.cloud, []
    where = (model.measured_on or {}).get("instance_type")
    if gpu is not None and cloud.gpu_model is not None and gpu != str(cloud.gpu_model):
        out.append(f"model profile {model.name!r} was measured on {gpu} GPUs" + (f" ({where})" if where else "")
                   + f" but {cloud.instance_type} has {cloud.gpu_model} GPUs: its iteration times may be far off; "
                     f"profile the model on {cloud.instance_type} (`rubberband profile`)")
    G = cloud.gpus_per_instance
    if measured_g is not None and G < measured_g:
        wide = [(i, m) for i, m in enumerate(plan.gpus_per_trial) if m > G]
        if wide:
            i, m = wide[0]
            out.append(f"stage {i} spreads each {m}-GPU trial over {math.ceil(m / G)} {cloud.instance_type} instances "
                       f"but profile {model.name!r} measured {m} GPUs on {math.ceil(m / measured_g)} {where} "
                       f"instance(s): its iteration times there are likely optimistic")
    unpaid = [k for k in model.packed_iter_latency_s if not packing_pays(model, k)]
    if unpaid:
        gains = ", ".join(f"{packing_gain(model, k):.2f}x at {k} per GPU" for k in unpaid)
        out.append(f"packing: profile {model.name!r} gains {gains} over one trial alone, under the "
                   f"{1 + PACKING_MIN_GAIN:.2f}x that pays (the profiler's noise): not offered")
    return tuple(out) + fusion_warnings(model, plan.stage_clouds)


def fusion_warnings(model: ModelProfile, clouds: list[CloudProfile]) -> tuple[str, ...]:
    """What fusion the search left out, and why (DESIGN §4.5): group sizes whose fused throughput
    is under the 1.05x that pays (``fusion_pays``), those no GPU of the plan's types holds
    (``ModelProfile.fused_fits``), and all of them when the profile has no 1-GPU trials."""
    sizes = [f for f in model.fused_counts if f > 1]
    if not sizes:
        return ()
    if 1 not in model.iter_latency_s:
        return (f"fusion: profile {model.name!r} has no 1-GPU trials, and only those are fused: "
                f"{', '.join(map(str, sizes))} per GPU not offered",)
    out = []
    unpaid = [f for f in sizes if not fusion_pays(model, f)]
    if unpaid:
        gains = ", ".join(f"{fusion_gain(model, f):.2f}x at {f} fused" for f in unpaid)
        out.append(f"fusion: profile {model.name!r} gains {gains} over one trial alone, under the "
                   f"{1 + PACKING_MIN_GAIN:.2f}x that pays (the profiler's noise): not offered")
    for c in {c.instance_type: c for c in clouds}.values():
        big = [f for f in sizes if f not in unpaid and not model.fused_fits(f, c.gpu_memory_gb)]
        if big:
            out.append(f"fusion: {', '.join(f'{f} ({model.fused_memory(f) or 0.0:.3g} GB)' for f in big)} fused per "
                       f"GPU do not fit the {c.gpu_memory_gb:g} GB of one {c.instance_type} GPU (fused_memory_gb, "
                       f"m1 + (F - 1) * delta): not offered")
    return tuple(out)


def auto_instance_types(model: ModelProfile, catalog: CloudCatalog) -> list[tuple[str, ModelProfile | None]]:
    """Types of the catalog with the GPU model the profile was measured on, each with the part of
    the profile that holds on it (``usable_profile``; ``None`` when none does)."""
    gpu, measured_g = profile_gpu(model, catalog)
    if gpu is None:
        raise SpecError(
            f"instance_type: `auto` needs to know which GPU model profile {model.name!r} was measured on; "
            "add measured_on.gpu_model (e.g. V100) or measured_on.instance_type to the model profile"
        )
    types = [(name, usable_profile(model, measured_g, entry["gpus_per_instance"]))
             for name, entry in catalog.types.items() if str(entry.get("gpu_model")) == gpu]
    if not types:
        raise SpecError(f"instance_type: no type in {catalog.path or catalog.region} has {gpu} GPUs, which profile {model.name!r} was measured on")
    return types


def jct_floor(tables: list[StageTable], confidence: float | None) -> float:
    """A lower bound on what a plan's constraint reads on any of ``tables`` (stage by stage, any
    of them): its mean JCT, or with ``confidence`` the JCT quantile ``choose`` compares (every
    sample's JCT is at least the sum of its stages' floors, so each order statistic is too)."""
    total = sum(np.min([t.stage_floor(i) for t in tables], axis=0) for i in range(tables[0].num_stages))
    if confidence is None:
        return float(np.mean(total))
    jct = np.sort(total)
    return float(jct[max(0, math.ceil(confidence * len(jct) - 1e-9) - 1)])


def check_models(models: Mapping, cloud: CloudProfile | CloudCatalog) -> dict[str, ModelProfile]:
    """Profiles by GPU model, checked against the cloud: one line naming the GPU model for an
    empty mapping, a value that is not a profile, two keys for one GPU model, a GPU model the
    cloud has no type of, or a profile measured on another GPU model. Each profile comes back
    with ``measured_on.gpu_model`` set to its key (the planner reads it)."""
    if not models:
        raise SpecError("model: expected a model profile, or a mapping of GPU model to profile such as "
                        "{'V100': a, 'A10G': b}")
    entries = catalog_entries(cloud)
    known = sorted({str(e["gpu_model"]) for e in entries.values() if e.get("gpu_model") is not None})
    where_cloud = cloud.path or cloud.region if isinstance(cloud, CloudCatalog) else cloud.instance_type
    out: dict[str, ModelProfile] = {}
    seen: dict[str, str] = {}
    for gpu, profile in models.items():
        if not isinstance(gpu, str) or not isinstance(profile, ModelProfile):
            raise SpecError(f"model[{gpu!r}]: expected a GPU model name mapped to a ModelProfile, got "
                            f"{type(profile).__name__}")
        if gpu.lower() in seen:
            raise SpecError(f"model[{gpu!r}]: {seen[gpu.lower()]!r} and {gpu!r} name one GPU model; keep one profile "
                            "per GPU model")
        seen[gpu.lower()] = gpu
        canonical = {k.lower(): k for k in known}
        if gpu.lower() not in canonical:
            raise SpecError(f"model[{gpu!r}]: no type of {where_cloud} has {gpu} GPUs{did_you_mean(gpu, known)}; "
                            f"its types have {', '.join(known) or 'no GPU model listed'}")
        gpu = canonical[gpu.lower()]
        measured, _ = profile_gpu(profile, cloud if isinstance(cloud, CloudCatalog) else None)
        if measured is not None and measured != gpu:
            raise SpecError(f"model[{gpu!r}]: profile {profile.name!r} was measured on {measured}, not {gpu}; "
                            f"key it by {measured}")
        if measured is None:
            profile = profile.replace(measured_on={**(profile.measured_on or {}), "gpu_model": gpu})
        out[gpu] = profile
    return out


def catalog_entries(cloud: CloudProfile | CloudCatalog) -> dict[str, dict]:
    """Type name -> entry (``gpu_model``, ``gpus_per_instance``) of a catalog, or of one profile."""
    if isinstance(cloud, CloudCatalog):
        return cloud.types
    return {cloud.instance_type: {"gpu_model": cloud.gpu_model, "gpus_per_instance": cloud.gpus_per_instance}}


def _models_of(model: ModelProfile, catalog: CloudCatalog) -> dict[str, ModelProfile]:
    """One profile as a mapping by the GPU model it was measured on (``auto`` needs to know it)."""
    auto_instance_types(model, catalog)       # one line when the GPU model is unknown or absent
    return {profile_gpu(model, catalog)[0]: model}


def _narrowed(model: ModelProfile, usable: ModelProfile, catalog: CloudCatalog, name: str) -> dict[str, str]:
    """``{"excluded": the rule}`` when ``auto`` planned ``name`` with only part of the profile
    (``usable_profile``: no trial spread over instances narrower than profiled), so that a type
    that misses the deadline under that rule is not read as one that cannot meet it at all."""
    if usable.gpu_counts == model.gpu_counts:
        return {}
    where = (model.measured_on or {}).get("instance_type") or "instances"
    G = catalog.types[name]["gpus_per_instance"]
    return {"excluded": f"a trial is never spread over instances narrower than the {where} it was profiled on, "
                        f"so auto plans {name} with {G}-GPU trials only" if G == 1 else
                        f"a trial is never spread over instances narrower than the {where} it was profiled on, "
                        f"so auto plans {name} with trials of up to {G} GPUs only"}


def _plan_auto(job: _Job, models: dict[str, ModelProfile], catalog: CloudCatalog, market: Market | str,
               compare: bool) -> Plan:
    """``instance_type="auto"``: per GPU model with a profile, a plan on each of its types, and
    (optimal policy) one choosing a type per stage among them; the cheapest is kept. Types
    without a profile of their GPU model, or without a spot price on the spot market, are
    skipped and listed in ``plan.info["skipped"]``."""
    spec, deadline_s, policy, confidence = job.spec, job.deadline_s, job.policy, job.confidence
    plans, considered, infeasible, hopeless = [], [], [], []
    usable_by_type: dict[str, ModelProfile] = {}     # the part of its profile each type plans by
    skipped = {name: f"no {entry.get('gpu_model')} model profile" for name, entry in catalog.types.items()
               if str(entry.get("gpu_model")) not in models}
    for model in models.values():
        tables: list[StageTable] = []
        draws = None
        for name, usable in auto_instance_types(model, catalog):
            if market is Market.SPOT and catalog.types[name].get("spot_price_usd_per_hour") is None:
                skipped[name] = "no spot price"
                continue
            cloud = catalog.get(name, Market.ON_DEMAND if market == AUTO else market)
            if usable is not None:
                usable_by_type[name] = usable
            if usable is None:
                considered.append({"policy": policy, "instance_type": name, "infeasible":
                                   f"profile {model.name!r} starts at {model.min_gpus} GPUs per trial, more than one "
                                   f"{name} holds"})
                continue
            try:
                own = (variant_tables(spec, usable, cloud, job.samples, job.seed, draws, job.held, job.caps,
                                      job.target_for(cloud, catalog), job.redone)
                       if policy == "optimal" else None)
                if own is not None:
                    draws = own[0].draws
                    # A type too slow for the whole job may still be the cheapest for some stages:
                    # its tables join the type-per-stage search whatever its own search does.
                    if market != AUTO or cloud.spot_price_usd_per_hour is not None:
                        tables += own
                    floor = jct_floor(own, confidence)
                    if floor > deadline_s * (1 + 1e-9):
                        # Even its fastest stages miss: no search (nor its reason, unless every type misses).
                        hopeless.append((floor, usable, cloud))
                        considered.append({"policy": policy, "instance_type": name, "infeasible":
                                           f"no plan meets the deadline of {deadline_s:g}s: even the fastest stages "
                                           f"on {name} take {floor:.0f}s" + (f" at P >= {confidence:g}"
                                                                             if confidence else ""),
                                           **_narrowed(model, usable, catalog, name)})
                        continue
                table = (VariantTable(own, model, job.target_for(cloud)) if own is not None and len(own) > 1
                         else own and own[0])
                plan = _plan_one(job, usable, cloud, table=table, market=market)
            except InfeasibleDeadlineError as exc:
                infeasible.append(exc)
                considered.append({"policy": policy, "instance_type": name, "infeasible": str(exc),
                                   **_narrowed(model, usable, catalog, name)})
                continue
            except SpecError as exc:  # e.g. the job is too large on this type's instances
                considered.append({"policy": policy, "instance_type": name, "infeasible": str(exc)})
                continue
            plans.append(plan)
            considered.append({**plan.summary(), **({"market": market_label(plan)} if market == AUTO else {})})
        if len({t.cloud.instance_type for t in tables}) > 1:
            # Only a plan cheaper than the types' own counts: the cheapest so far cuts the search.
            cap = min((p.predicted.mean_cost_usd for p in plans), default=math.inf)
            try:
                plan = _plan_one(job, model, tables[0].cloud,
                                 table=VariantTable(tables, model, job.target_for(tables[0].cloud)), market=market,
                                 cost_cap=cap)
            except InfeasibleDeadlineError as exc:
                infeasible.append(exc)
                plan = None
            if plan is not None:
                plans.append(plan)
                if len(set(plan.instance_types)) > 1:      # else it is one of the types' own plans
                    considered.append({**plan.summary(), "policy": f"{policy}, type per stage"})
    if not plans and hopeless and not infeasible:     # the closest type's own reason
        _, usable, cloud = min(hopeless, key=lambda h: h[0])
        _plan_one(job, usable, cloud, market=market)
    if not plans:
        if infeasible:   # the advice of the type that comes closest
            best = min(infeasible, key=lambda e: e.needed_s)
            raise InfeasibleDeadlineError(deadline_s, best.min_jct_s, best.allocation,
                                          detail=best.detail + ", the closest of every instance type",
                                          confidence=best.confidence, needed_s=best.needed_s)
        raise SpecError("instance_type: `auto` found no instance type to plan on: "
                        + "; ".join([c["infeasible"] for c in considered] + [f"{n}: {r}" for n, r in skipped.items()]))
    best = min(plans, key=lambda p: p.predicted.mean_cost_usd)
    considered.sort(key=lambda c: c.get("cost_usd_mean", math.inf))
    if compare:
        considered += _other_policies(job, usable_by_type[best.instance_type], best.cloud, best)
    info = {**best.info, **({"skipped": skipped} if skipped else {})}
    return replace(_with_considered(best, considered), info=info)


def plan_allocation(spec: ExperimentSpec, allocation: tuple[int, ...] | list[int], model: ModelProfile,
                    cloud: CloudProfile, deadline_s: float, instances: tuple[int, ...] | list[int] | None = None,
                    samples: int = 200, seed: int = 0, held_at_start: HeldInstances | int | None = None,
                    fused_per_gpu: tuple[int, ...] | list[int] | None = None,
                    target_model: ModelProfile | Mapping[str, ModelProfile] | None = None,
                    redone: Sequence[int] | None = None) -> Plan:
    """A ``Plan`` for an allocation you chose yourself (policy ``manual``), with its prediction
    (from the instances ``held_at_start``, as ``compile_plan``), its stages fused ``fused_per_gpu``
    to a GPU if given (DESIGN §4.5); ``target_model``: a surrogate job's target stage's profile (§4.6);
    ``redone``: each stage's redone iterations (``compile_plan``'s).

    Raises:
        SpecError: for an invalid allocation or instance vector.
    """
    held = _held_type(held_at_start, cloud, None)
    result = simulate(spec, allocation, model, cloud, samples=samples, seed=seed, instances=instances,
                      held_at_start=held, fused_per_gpu=fused_per_gpu, target_model=target_model,
                      redone=check_redone(redone, spec))
    fused = tuple(s.fused_per_gpu for s in result.stages)
    return Plan(allocation=result.allocation, instances=result.instances,
                gpus_per_trial=tuple(s.gpus_per_trial for s in result.stages), predicted=result,
                deadline_s=float(deadline_s), policy="manual", spec=spec, cloud=cloud, samples=samples, seed=seed,
                held_at_start=held, fused_per_gpu=fused if any(f > 1 for f in fused) else ())
