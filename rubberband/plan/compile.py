"""compile_plan: the cheapest plan that meets a deadline, under a named policy."""

from __future__ import annotations

import math

import numpy as np

from rubberband.errors import InfeasibleDeadlineError, SpecError
from rubberband.plan.plan import Plan
from rubberband.plan.policies import Candidate, choose, get_policy, pareto_front, static_candidates
from rubberband.plan.table import StageTable
from rubberband.profiles.cloud import CloudCatalog, CloudProfile, Market
from rubberband.profiles.model import ModelProfile
from rubberband.simulator.engine import simulate
from rubberband.spec.experiment import ExperimentSpec


def compile_plan(spec: ExperimentSpec, model: ModelProfile, cloud: CloudProfile | CloudCatalog, deadline_s: float,
                 policy: str = "optimal", samples: int = 200, seed: int = 0, confidence: float | None = None,
                 instance_type: str | None = None, market: str | Market = Market.ON_DEMAND,
                 compare: bool = False) -> Plan:
    """Find the cheapest plan that meets ``deadline_s`` under ``policy``.

    Args:
        spec: the job's stages.
        model: the model profile.
        cloud: one instance type's profile, or a whole region's ``CloudCatalog`` together
            with ``instance_type`` (a name, or ``"auto"`` to plan on every type whose GPUs
            the model profile was measured on and keep the cheapest).
        deadline_s: the deadline in seconds.
        policy: ``optimal`` (default), ``greedy``, ``static`` or ``naive-elastic``.
        samples, seed: Monte-Carlo samples and seed; all candidates share the random numbers.
        confidence: if given (e.g. 0.9), require P(JCT <= deadline) >= confidence in full
            simulation instead of mean JCT <= deadline.
        market: ``on-demand`` or ``spot`` when ``cloud`` is a catalog.
        compare: also plan with every other policy and list them in ``plan.considered``.

    Returns:
        A new ``Plan`` (inputs are never modified).

    Raises:
        InfeasibleDeadlineError: no plan meets the deadline; names the shortest achievable JCT.
        SpecError: bad arguments (unknown policy, non-positive deadline, ...).
    """
    get_policy(policy)
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) or not deadline_s > 0 or not math.isfinite(deadline_s):
        raise SpecError(f"deadline_s: expected a positive number of seconds, got {deadline_s!r}")
    if confidence is not None and not 0 < confidence < 1:
        raise SpecError(f"confidence: must be between 0 and 1, got {confidence!r}")
    if isinstance(cloud, CloudCatalog):
        if not instance_type:
            raise SpecError("instance_type: name an instance type of the catalog, or `auto` to compare them")
        if instance_type == "auto":
            return _plan_auto(spec, model, cloud, deadline_s, policy, samples, seed, confidence, market, compare)
        cloud = cloud.get(instance_type, market)
    plan = _plan_one(spec, model, cloud, deadline_s, policy, samples, seed, confidence)
    if compare:
        plan = _with_considered(plan, [plan.summary()] + _other_policies(spec, model, cloud, deadline_s, policy,
                                                                        samples, seed, confidence))
    return plan


def _plan_one(spec, model, cloud, deadline_s, policy, samples, seed, confidence, table: StageTable | None = None) -> Plan:
    return plan_on_table(table or StageTable(spec, model, cloud, samples=samples, seed=seed), deadline_s, policy, confidence)


def plan_on_table(table: StageTable, deadline_s: float, policy: str, confidence: float | None = None) -> Plan:
    """Plan with an already built ``StageTable`` (what-if sweeps share one across deadlines)."""
    spec, cloud, samples, seed = table.spec, table.cloud, table.samples, table.seed
    candidates = get_policy(policy)(table, deadline_s)
    chosen = choose(table, candidates, deadline_s, confidence)
    if chosen is None:
        fastest = fastest_plan(table)
        needed = None
        if confidence is not None:
            # Meeting the deadline with probability p takes the p-quantile of the JCT, drawn
            # from the same samples the search used: the mean is not enough.
            jct = np.sort(simulate(spec, fastest.allocation, table.model, cloud, samples=samples, seed=seed,
                                   instances=fastest.instances, draws=table.draws).jct_s)
            needed = float(jct[max(0, math.ceil(confidence * len(jct) - 1e-9) - 1)])
        raise InfeasibleDeadlineError(deadline_s, fastest.jct_s, fastest.allocation,
                                      detail=f" on {cloud.instance_type}, policy {policy}",
                                      confidence=confidence, needed_s=needed)
    candidate, result = chosen
    return Plan(
        allocation=candidate.allocation, instances=candidate.instances,
        gpus_per_trial=tuple(s.gpus_per_trial for s in result.stages), predicted=result,
        deadline_s=float(deadline_s), policy=policy, spec=spec, cloud=cloud, confidence=confidence,
        samples=samples, seed=seed, info={"note": candidate.note, "candidates": len(candidates)},
    )


def fastest_plan(table: StageTable) -> Candidate:
    """The plan with the shortest mean JCT: the end of the optimal Pareto front, or a static
    cluster (which holds instances across stages and so skips later scale-ups)."""
    cands = [Candidate(a, h, *table.evaluate(a, h)) for a, h in pareto_front(table)]
    cands += static_candidates(table)
    return min(cands, key=lambda c: (c.jct_s, c.cost_usd))


def _other_policies(spec, model, cloud, deadline_s, policy, samples, seed, confidence) -> list[dict]:
    from rubberband.plan.policies import POLICIES

    table = StageTable(spec, model, cloud, samples=samples, seed=seed)
    out = []
    for name in POLICIES:
        if name == policy:
            continue
        try:
            out.append(_plan_one(spec, model, cloud, deadline_s, name, samples, seed, confidence, table).summary())
        except InfeasibleDeadlineError as exc:
            out.append({"policy": name, "instance_type": cloud.instance_type, "infeasible": str(exc)})
    return out


def _with_considered(plan: Plan, considered: list[dict]) -> Plan:
    from dataclasses import replace

    return replace(plan, considered=tuple(considered))


def auto_instance_types(model: ModelProfile, catalog: CloudCatalog) -> list[str]:
    """Types of the catalog with the GPU model the profile was measured on, at least as wide.

    The scaling curve holds for trials laid out as they were when profiled; a type with fewer
    GPUs per instance would spread the same trial over more instances.
    """
    measured = model.measured_on or {}
    gpu = measured.get("gpu_model")
    if gpu is None and measured.get("instance_type") in catalog.types:
        gpu = catalog.types[measured["instance_type"]].get("gpu_model")
    if gpu is None:
        raise SpecError(
            f"instance_type: `auto` needs to know which GPU model profile {model.name!r} was measured on; "
            "add measured_on.gpu_model (e.g. V100) or measured_on.instance_type to the model profile"
        )
    # A trial wider than one instance spreads over more instances on a smaller type than on
    # the profiled one, and pays network costs the profile never saw: keep types at least as
    # wide as the profiled one.
    min_g = catalog.types.get(measured.get("instance_type"), {}).get("gpus_per_instance", 1)
    types = [name for name, entry in catalog.types.items()
             if str(entry.get("gpu_model")) == str(gpu) and entry["gpus_per_instance"] >= min_g]
    if not types:
        raise SpecError(f"instance_type: no type in {catalog.path or catalog.region} has {gpu} GPUs, which profile {model.name!r} was measured on")
    return types


def _plan_auto(spec, model, catalog, deadline_s, policy, samples, seed, confidence, market, compare) -> Plan:
    plans, considered = [], []
    for name in auto_instance_types(model, catalog):
        cloud = catalog.get(name, market) if not isinstance(market, Market) or market is Market.ON_DEMAND or \
            catalog.types[name].get("spot_price_usd_per_hour") is not None else None
        if cloud is None:
            continue
        try:
            plan = _plan_one(spec, model, cloud, deadline_s, policy, samples, seed, confidence)
        except InfeasibleDeadlineError as exc:
            considered.append({"policy": policy, "instance_type": name, "infeasible": str(exc)})
            continue
        except SpecError as exc:  # e.g. the profile's GPU counts do not fit this type
            considered.append({"policy": policy, "instance_type": name, "infeasible": str(exc)})
            continue
        plans.append(plan)
        considered.append(plan.summary())
    if not plans:
        raise InfeasibleDeadlineError(deadline_s, math.inf, (), detail=" on any instance type: " + "; ".join(
            c.get("infeasible", "") for c in considered))
    best = min(plans, key=lambda p: p.predicted.mean_cost_usd)
    considered.sort(key=lambda c: c.get("cost_usd_mean", math.inf))
    if compare:
        considered += [c for c in _other_policies(spec, model, best.cloud, deadline_s, policy, samples, seed, confidence)]
    return _with_considered(best, considered)


def plan_allocation(spec: ExperimentSpec, allocation: tuple[int, ...] | list[int], model: ModelProfile,
                    cloud: CloudProfile, deadline_s: float, instances: tuple[int, ...] | list[int] | None = None,
                    samples: int = 200, seed: int = 0) -> Plan:
    """A ``Plan`` for an allocation you chose yourself (policy ``manual``), with its prediction.

    Raises:
        SpecError: for an invalid allocation or instance vector.
    """

    result = simulate(spec, allocation, model, cloud, samples=samples, seed=seed, instances=instances)
    return Plan(allocation=result.allocation, instances=result.instances,
                gpus_per_trial=tuple(s.gpus_per_trial for s in result.stages), predicted=result,
                deadline_s=float(deadline_s), policy="manual", spec=spec, cloud=cloud, samples=samples, seed=seed)
