"""What-if analysis: plan the same job under changed deadlines, trial counts, latencies, prices."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from rubberband.errors import InfeasibleDeadlineError, SpecError
from rubberband.limits import check_samples_seed, check_sweep, table_work
from rubberband.plan.budget import InfeasibleBudgetError, within_budget
from rubberband.plan.compile import model_of, plan_markets, plan_on_table, variant_tables
from rubberband.plan.plan import Plan
from rubberband.plan.policies import POLICIES
from rubberband.plan.search import Progress
from rubberband.plan.table import StageTable, check_table_size, valid_allocations
from rubberband.plan.variants import VariantTable
from rubberband.profiles.cloud import Billing, BillingModel, CloudProfile, DataCost, Market
from rubberband.profiles.distributions import Constant
from rubberband.profiles.model import ModelProfile
from rubberband.profiles.spot import SpotMarket, trace_zones
from rubberband.schema import did_you_mean
from rubberband.simulator.engine import spot_billable
from rubberband.spec.experiment import ExperimentSpec

AXES = ("deadline_s", "num_trials", "init_latency_s", "billing", "data_price_usd_per_gb", "dataset_gb",
        "instance_type", "straggler_std", "market", "preemption_rate", "zone", "notice_s", "budget_usd", "packing")
SPOT_AXES = ("preemption_rate", "zone", "notice_s")
MARKETS = ("on-demand", "spot", "auto")


@dataclass(frozen=True)
class Scenario:
    """One point of a sweep: the inputs planned and each policy's mean cost (None if infeasible)."""

    values: dict[str, Any]
    costs: dict[str, float | None]
    jcts: dict[str, float | None]
    allocations: dict[str, tuple[int, ...] | None]
    trials_per_gpu: dict[str, tuple[int, ...] | None] = field(default_factory=dict)   # per stage, where packed

    def to_dict(self) -> dict[str, Any]:
        return {**self.values, "cost_usd": self.costs, "jct_s": self.jcts,
                "allocation": {k: list(v) if v else None for k, v in self.allocations.items()},
                "trials_per_gpu": {k: list(v) if v else None for k, v in self.trials_per_gpu.items()}}


def whatif(spec: ExperimentSpec, model: ModelProfile | Mapping[str, ModelProfile], cloud: CloudProfile, deadline_s: float,
           vary: Mapping[str, Sequence[Any]], policies: Sequence[str] = tuple(POLICIES), samples: int = 200,
           seed: int = 0, spec_for_trials: Callable[[int], ExperimentSpec] | None = None,
           cloud_for_type: Callable[[str], CloudProfile] | None = None,
           trace_file: str | None = None, progress: Progress | None = None,
           market: str | Market | None = None, confidence: float | None = None) -> list[Scenario]:
    """Plan the job for every combination of the swept values, with every policy.

    Args:
        model: the model profile, or one per GPU model (each instance type swept plans by its
            own GPU model's, as ``compile_plan`` does).
        vary: axis name -> values; axes: ``deadline_s``, ``num_trials`` (needs
            ``spec_for_trials``), ``init_latency_s`` (constant seconds), ``billing``
            (``per_instance`` / ``per_function``), ``data_price_usd_per_gb``, ``dataset_gb``,
            ``instance_type`` (needs ``cloud_for_type``), ``straggler_std`` (std of the
            iteration latency at every GPU count, seconds); and the spot market (DESIGN §4.1):
            ``market`` (``on-demand``, ``spot`` or ``auto``: chosen per stage),
            ``preemption_rate`` (reclaims per instance-hour), ``zone`` (a zone of
            ``trace_file``, replayed), ``notice_s`` (the interruption notice); and
            ``budget_usd``: each scenario's plan is then the shortest mean JCT within that
            budget (``plan.budget.within_budget``; no deadline), not the cheapest by a deadline;
            ``packing``: the most trials per GPU the optimal policy may pack (1: none), each a
            count the profile has a packed latency for. As in ``compile_plan``, the optimal
            policy packs wherever the profile allows and it pays; the other policies never pack.
        policies: policy names to compare.
        trace_file: the spot availability traces ``zone`` reads (default: the cloud's own).
        progress: called as each scenario's search goes (``compile_plan``'s, with the scenario
            number and count filled in).
        market: the market of every scenario that does not sweep it: ``on-demand``, ``spot``
            or ``auto`` (default: ``cloud``'s own), as the experiment's ``cloud.market``.
        confidence: plan for P(JCT <= deadline) >= this (``compile_plan``'s), as the
            experiment's ``confidence:``; a budget sweep ignores it (no deadline).

    Returns:
        One ``Scenario`` per combination, in sweep order.
    """
    for axis in vary:
        if axis not in AXES:
            raise SpecError(f"whatif: unknown axis {axis!r}{did_you_mean(axis, AXES)}; choose from {', '.join(AXES)}")
    for name in policies:
        if name not in POLICIES:
            raise SpecError(f"policy: unknown policy {name!r}{did_you_mean(name, POLICIES)}; choose one of {', '.join(POLICIES)}")
    check_samples_seed(samples, seed)
    axes = list(vary)
    spot_axes = [a for a in axes if a in SPOT_AXES]
    own_market = cloud.market.value if market is None else market.value if isinstance(market, Market) else str(market)
    markets = vary.get("market", [own_market])
    for value in markets:
        if value not in MARKETS:
            raise SpecError(f"market: unknown market {value!r}{did_you_mean(str(value), MARKETS)}; choose one of {', '.join(MARKETS)}")
    if confidence is not None and not 0 < confidence < 1:
        raise SpecError(f"confidence: must be between 0 and 1, got {confidence!r}")
    if own_market in (Market.SPOT.value,) and "market" not in vary:
        cloud = cloud.replace(market=Market.SPOT)
    if spot_axes and set(markets) == {"on-demand"}:
        raise SpecError(f"{spot_axes[0]}: on-demand instances are never reclaimed; sweep --market spot,auto too "
                        "(or set cloud.market: spot)")
    if (spot_axes or set(markets) != {"on-demand"}) and cloud.spot_price_usd_per_hour is None:
        raise SpecError(f"market: {cloud.instance_type} has no spot_price_usd_per_hour to weigh spot with; add one")
    if "budget_usd" in vary and "deadline_s" in vary:
        raise SpecError("budget_usd: a budget sweep plans the shortest JCT per budget, with no deadline; "
                        "sweep the deadline or the budget, not both")
    if "packing" in vary:
        check_packing(vary["packing"], model_of(dict(model), cloud) if isinstance(model, Mapping) else model, cloud)
    if "zone" in vary and "preemption_rate" in vary:
        raise SpecError("zone: a zone's trace and a reclaim rate are two preemption models; sweep one of them")
    if "zone" in vary:
        trace_file = trace_file or cloud.spot.trace_file
        if trace_file is None:
            raise SpecError("zone: no trace file to replay the zone from; set cloud.overrides.spot.preemption.trace.file")
        known = trace_zones(trace_file)
        for zone in vary["zone"]:
            if zone not in known:
                raise SpecError(f"zone: {zone!r} is not in {trace_file}{did_you_mean(str(zone), known)}; "
                                f"choose one of {', '.join(known)}")
    # Refuse a sweep too large before planning its first scenario: its tables (one per
    # combination of the axes other than the deadline) and a plan search per scenario and policy.
    # The largest job of the sweep stands for all of them.
    models = dict(model) if isinstance(model, Mapping) else None    # checked by the experiment's loader
    model = model_of(models, cloud) if models is not None else model
    tables = math.prod(len(vary[a]) for a in axes if a != "deadline_s")
    largest = spec_for_trials(max(int(n) for n in vary["num_trials"])) if vary.get("num_trials") and spec_for_trials else spec
    check_table_size(largest, model, cloud, None, samples)
    base = [valid_allocations(s.num_trials, model, cloud.gpus_per_instance) for s in largest.stages]
    check_table_size(largest, model, cloud, base, samples)
    check_sweep(math.prod(len(v) for v in vary.values()), len(policies), largest.trials, samples,
                table_work(largest.trials, base), tables)
    out = []
    tables: dict[tuple, StageTable] = {}     # the deadline does not change a table: share it
    combos = list(itertools.product(*(vary[a] for a in axes)))
    for number, combo in enumerate(combos, 1):
        tell = None if progress is None else (
            lambda p, number=number: progress(replace(p, scenario=number, scenarios=len(combos))))
        values = dict(zip(axes, combo))
        s, m, c, d = _apply(values, spec, model if models is None or "instance_type" not in values else
                            model_of(models, cloud_for_type(str(values["instance_type"]))),
                            cloud, deadline_s, spec_for_trials, cloud_for_type, trace_file)
        key = tuple((a, v) for a, v in values.items() if a not in ("deadline_s", "budget_usd"))
        auto = values.get("market", own_market) == "auto"
        costs: dict[str, float | None] = dict.fromkeys(policies)
        jcts: dict[str, float | None] = dict.fromkeys(policies)
        allocs: dict[str, tuple[int, ...] | None] = dict.fromkeys(policies)
        if c.market is Market.SPOT and not spot_billable(c):     # no spot under per-function billing
            out.append(Scenario(values, costs, jcts, allocs))
            continue
        if key not in tables:     # with markets chosen, the on-demand table they derive from
            # and, where the profile packs, the optimal policy's table of every trials per GPU (as compile_plan)
            own = variant_tables(s, m, c.replace(market=Market.ON_DEMAND) if auto else c, samples, seed)
            tables[key] = own[0], (VariantTable(own, m) if len(own) > 1 else own[0])
        packs: dict[str, tuple[int, ...] | None] = dict.fromkeys(policies)
        for name in policies:
            at = partial(_plan_at, spec=s, model=m, cloud=c, policy=name, samples=samples, seed=seed, auto=auto,
                         table=tables[key][name == "optimal"], progress=tell,
                         confidence=None if "budget_usd" in values else confidence)
            try:
                plan = at(d) if "budget_usd" not in values else within_budget(at, float(values["budget_usd"]))
                costs[name], jcts[name], allocs[name] = plan.predicted.mean_cost_usd, plan.predicted.mean_jct_s, plan.allocation
                packs[name] = plan.trials_per_gpu or None
            except (InfeasibleDeadlineError, InfeasibleBudgetError):
                pass
        out.append(Scenario(values, costs, jcts, allocs, packs))
    return out


def _plan_at(deadline_s, spec, model, cloud, policy, samples, seed, auto, table, progress, confidence=None) -> Plan:
    """A scenario's plan for one policy at ``deadline_s``, on the sweep's shared table."""
    if auto:
        return plan_markets(spec, model, cloud, deadline_s, policy, samples, seed, confidence, table, progress=progress)
    return plan_on_table(table, deadline_s, policy, confidence, progress=progress)


def check_packing(values: Sequence[Any], model: ModelProfile, cloud: CloudProfile) -> None:
    """Each value of the ``packing`` axis (the most trials per GPU the planner may pack) is 1 or
    a trials-per-GPU count the profile has a packed latency for and the GPU's memory holds."""
    for k in values:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise SpecError(f"packing: trials per GPU must be whole numbers of at least 1 (1: no packing), got {k!r}")
        if k > 1 and k not in model.packed_iter_latency_s:
            have = ", ".join(map(str, model.packing_counts)) or "none"
            raise SpecError(f"packing: {k} trials per GPU has no packed latency in model profile {model.name!r} "
                            f"(profiled: {have}); sweep profiled counts or measure it with `rubberband profile`")
        if k > model.max_trials_per_gpu(cloud.gpu_memory_gb):
            raise SpecError(f"packing: {k} trials of {model.gpu_memory_gb_per_trial:g} GB do not fit the "
                            f"{cloud.gpu_memory_gb:g} GB GPU of {cloud.instance_type}; sweep fewer trials per GPU")


def _apply(values, spec, model, cloud, deadline_s, spec_for_trials, cloud_for_type, trace_file=None):
    for axis, value in values.items():
        if axis == "deadline_s":
            deadline_s = float(value)
        elif axis == "num_trials":
            if spec_for_trials is None:
                raise SpecError("whatif: sweeping num_trials needs an SHA experiment")
            spec = spec_for_trials(int(value))
        elif axis == "instance_type":
            if cloud_for_type is None:
                raise SpecError("whatif: sweeping instance_type needs a cloud catalog")
            cloud = cloud_for_type(str(value))
    for axis, value in values.items():
        if axis == "init_latency_s":
            cloud = cloud.replace(init_latency_s=Constant(float(value)))
        elif axis == "billing":
            billing = value if isinstance(value, Billing) else Billing(BillingModel(value), cloud.billing.granularity_s, cloud.billing.minimum_s)
            cloud = cloud.replace(billing=billing)
        elif axis == "data_price_usd_per_gb":
            cloud = cloud.replace(data=DataCost(cloud.data.dataset_gb, float(value)))
        elif axis == "dataset_gb":
            cloud = cloud.replace(data=DataCost(float(value), cloud.data.price_usd_per_gb))
        elif axis == "packing":      # at most ``value`` trials per GPU: the planner packs only the counts kept
            model = model.replace(packed_iter_latency_s={k: d for k, d in model.packed_iter_latency_s.items()
                                                         if k <= int(value)})
        elif axis == "straggler_std":
            model = model.replace(iter_latency_s={g: d.with_moments(d.mean, float(value)) for g, d in model.iter_latency_s.items()})
        elif axis == "market" and value != "auto":
            cloud = cloud.replace(market=Market(value))
        elif axis == "preemption_rate":
            cloud = cloud.replace(spot=SpotMarket(notice_s=cloud.spot.notice_s, rate_per_hour=float(value)))
        elif axis == "zone":      # the zone's trace, and its spot price where the profile knows it
            cloud = cloud.in_zone(str(value), trace_file)
    if "notice_s" in values:      # after the model it applies to
        cloud = cloud.replace(spot=replace(cloud.spot, notice_s=float(values["notice_s"])))
    return spec, model, cloud, deadline_s


def saving(scenario: Scenario, baseline: str = "static", policy: str = "optimal") -> float | None:
    """How many times cheaper ``policy`` is than ``baseline`` in a scenario."""
    a, b = scenario.costs.get(policy), scenario.costs.get(baseline)
    if not a or b is None or not math.isfinite(a):
        return None
    return b / a


# --- surrogate tuning: what the width ratio trades (DESIGN §4.6) --------------------------------
# The part of a target iteration that shrinks with width when no surrogate was measured: the
# rest (data loading, kernel launches, the framework's own work) is taken as width-independent.
SURROGATE_COMPUTE_FRACTION = 0.9


def approximate_surrogate(target: ModelProfile, ratio: int,
                          compute_fraction: float = SURROGATE_COMPUTE_FRACTION) -> ModelProfile:
    """A surrogate's profile scaled from the full-width ``target``'s at Hydro's FLOP ratio: an
    APPROXIMATION for when none was measured.

    A model ``S`` times narrower does ``~1/S²`` of the FLOPs of its width-scaled layers (Hydro,
    OSDI '23; its gradients, which multi-GPU trials all-reduce, shrink as its parameters,
    ``~1/S²`` too). With ``f = compute_fraction`` the part of an iteration that scales so, every
    GPU count's iteration latency, mean and spread alike, becomes

        L_S(g) = L(g) · (f / S² + 1 − f)

    The trial start-up and the SYNC are kept (loading data and connecting a gang do not
    shrink), the GPU memory per trial falls ``~1/S`` (activations), and packed latencies are
    dropped: how narrow trials share a GPU is not derivable from one that is wide.

    Raises:
        SpecError: naming ``ratio`` or ``compute_fraction`` out of range.
    """
    if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 1:
        raise SpecError(f"ratio: expected a whole width ratio of at least 1, got {ratio!r}")
    if not 0.0 <= compute_fraction <= 1.0:
        raise SpecError(f"compute_fraction: expected a fraction in [0, 1], got {compute_fraction!r}")
    factor = compute_fraction / ratio**2 + 1.0 - compute_fraction
    latency = {g: d.with_moments(d.mean * factor, d.std * factor) for g, d in target.iter_latency_s.items()}
    memory = target.gpu_memory_gb_per_trial / ratio if target.gpu_memory_gb_per_trial is not None else None
    return target.replace(iter_latency_s=latency, packed_iter_latency_s={}, gpu_memory_gb_per_trial=memory,
                          name=f"{target.name} / {ratio} (approximation: f = {compute_fraction:g})")


@dataclass(frozen=True)
class SurrogateScenario:
    """The whole job's plan at one width ratio: ``ratio`` 1 is tuning at full width (the winner
    is trained by the tuning itself), else tuning on surrogates plus one target training.
    ``profile`` says where the surrogate's profile came from: ``full width``, ``measured`` or
    ``approximation`` (``approximate_surrogate``). ``None`` figures: no plan meets the deadline."""

    ratio: int
    profile: str
    jct_s: float | None
    cost_usd: float | None
    p_meet: float | None = None
    tuning_s: float | None = None
    tuning_usd: float | None = None
    target_s: float | None = None
    target_usd: float | None = None
    allocation: tuple[int, ...] | None = None
    gpus_per_trial: tuple[int, ...] | None = None
    infeasible: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def surrogate_sweep(tuning: ExperimentSpec, target: ModelProfile, cloud: Any, deadline_s: float,
                    ratios: Sequence[int], target_iters: int, measured: Mapping[int, ModelProfile] | None = None,
                    compute_fraction: float = SURROGATE_COMPUTE_FRACTION, **compile_kwargs: Any
                    ) -> list[SurrogateScenario]:
    """Plan the job at each width ratio (``compile_plan``, the optimal policy unless told):
    ratio 1 plans ``tuning`` at full width on ``target``; a ratio ``S > 1`` plans ``tuning`` on
    the surrogate (``measured[S]``, else ``approximate_surrogate(target, S)``) followed by the
    target stage, ``target_iters`` iterations at full width by ``target``, all under one
    deadline. ``cloud`` and ``compile_kwargs`` are ``compile_plan``'s.

    Raises:
        SpecError: a ratio below 1, or ``tuning`` ending in a target stage already.
    """
    from rubberband.plan.compile import compile_plan

    if tuning.target_stage is not None:
        raise SpecError("tuning: give the tuning stages alone (ExperimentSpec.tuning); each ratio adds its target stage")
    measured = dict(measured or {})
    out = []
    for ratio in ratios:
        if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 1:
            raise SpecError(f"--surrogate-ratio: expected whole width ratios of at least 1 such as 1,4,8,16, got {ratio!r}")
        if ratio == 1:
            spec, model, kind, extra = tuning, target, "full width", {}
        else:
            model = measured.get(ratio) or approximate_surrogate(target, ratio, compute_fraction)
            kind = "measured" if ratio in measured else "approximation"
            spec, extra = tuning.with_target(target_iters), {"target_model": target}
        try:
            plan = compile_plan(spec, model, cloud, deadline_s, **compile_kwargs, **extra)
        except InfeasibleDeadlineError as exc:
            out.append(SurrogateScenario(ratio, kind, None, None, infeasible=str(exc)))
            continue
        stages = plan.predicted.stages
        t = spec.target_stage
        tune = stages if t is None else stages[:t]
        out.append(SurrogateScenario(
            ratio, kind, plan.predicted.mean_jct_s, plan.predicted.mean_cost_usd, plan.predicted.p_meet(deadline_s),
            sum(s.mean_duration_s for s in tune), sum(s.mean_cost_usd for s in tune),
            None if t is None else stages[t].mean_duration_s, None if t is None else stages[t].mean_cost_usd,
            plan.allocation, plan.gpus_per_trial))
    return out


# --- eager transfer: what starting the target early trades (DESIGN §4.6) -------------------------
@dataclass(frozen=True)
class EagerScenario:
    """A surrogate job's plan with the target started after ``after`` of the surrogate trials are
    done (``None``: after the tuning, the sequential job): the hand-over stage, the restart
    probability the model takes, and the plan's figures (``None``: no plan meets the deadline)."""

    after: float | None
    after_stage: int | None
    restart_probability: float | None
    jct_s: float | None
    jct_p90_s: float | None
    cost_usd: float | None
    p_meet: float | None = None
    allocation: tuple[int, ...] | None = None
    infeasible: str | None = None
    sequential_jct_s: float | None = None      # the same plan with the target after the tuning
    sequential_cost_usd: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def eager_sweep(spec: ExperimentSpec, model: Any, target_model: Any, cloud: Any, deadline_s: float,
                fractions: Sequence[float | None], restart_probability: float | None = None,
                **compile_kwargs: Any) -> list[EagerScenario]:
    """Plan a surrogate job (``spec`` ends in a target stage) with its target started early after
    each fraction of the surrogate trials (``eager_transfer``; ``None``: after the tuning), at
    ``restart_probability`` (default per fraction: ``1 - 1/n``, ``n`` the trials promoted at the
    hand-over). ``model`` is the surrogate's profile; the rest is ``compile_plan``'s.

    Raises:
        SpecError: ``spec`` has no target stage, or a fraction no SYNC before the tuning's last
            stage reaches.
    """
    from rubberband.plan.compile import compile_plan
    from rubberband.spec.experiment import eager_transfer

    if spec.target_stage is None:
        raise SpecError("--eager-transfer: weighs when a surrogate job's target starts; the experiment has no "
                        "`surrogate:` (no target stage)")
    tuning, iters = spec.tuning, spec.stages[-1].iters
    out = []
    for after in fractions:
        eager = None if after is None else eager_transfer(tuning, after)
        if eager is not None and restart_probability is not None and eager.restart_probability > 0:
            # (where one trial goes on from the hand-over it is the winner: 0 whatever was given)
            eager = eager_transfer(tuning, after, restart_probability)
        job = tuning.with_target(iters, eager)
        try:
            plan = compile_plan(job, model, cloud, deadline_s, target_model=target_model, **compile_kwargs)
        except InfeasibleDeadlineError as exc:
            out.append(EagerScenario(after, eager and eager.after_stage, eager and eager.restart_probability,
                                     None, None, None, infeasible=str(exc)))
            continue
        sim, seq = plan.predicted, plan.info.get("eager_transfer", {})
        out.append(EagerScenario(after, eager and eager.after_stage, eager and eager.restart_probability,
                                 sim.mean_jct_s, sim.p90_jct_s, sim.mean_cost_usd, sim.p_meet(deadline_s),
                                 plan.allocation, None, seq.get("sequential_jct_s_mean"),
                                 seq.get("sequential_cost_usd_mean")))
    return out
