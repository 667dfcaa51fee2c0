"""The planner's dual (DESIGN §5): the shortest mean JCT whose cost stays within a budget.

``compile_plan`` answers "the cheapest plan that meets deadline D"; call its cost c(D). For
the exact (``optimal``) policy c(D) is non-increasing in D — a plan that meets D meets every
later deadline — so the plans within a budget B are those of the deadlines D >= D*, and the
shortest mean JCT within B is the JCT of c's plan at D*. ``plan_for_budget`` finds D* by
bisection (geometric: the tolerance is relative) between the fastest plan's mean JCT and the
cheapest plan's, with each feasible probe pulling the upper end down to the JCT of the plan it
returned (never above the probe). Once the bracket is within ``TOLERANCE`` of its lower end,
one probe just below the best plan's JCT settles it: if that probe is over budget, no plan the
planner returns is faster within the budget, and the answer is exact (to ``EXACT``); if it is
within budget it is a faster plan, and the search goes on. The bracket reaches ``TOLERANCE``
after about log2(ln(hi / lo) / TOLERANCE) probes; with the settling probes, 10-13 in all for
the paper's jobs (0.5-3 s on-demand, about 13 s for SHA(512) with markets chosen per stage:
each probe is a full search). A search cut short by ``MAX_PROBES`` keeps the best plan found,
always within the budget, and within ``TOLERANCE`` of the shortest once the bracket got there
(its lower end is over budget).
Every probe reuses the planner as it is — markets, instance types, trace zones and all.

With ``confidence=p`` the budget must hold with probability p: P(cost <= B) >= p over the
plan's Monte-Carlo samples (its cost's p-quantile <= B), the same samples the planner drew.
The planner's plan at each deadline is still the cheapest in *mean* cost, so with a
confidence the search is exact only as far as the cheapest-in-mean plan is also the
cheapest-in-quantile (they differ only where spot reclaims or stragglers spread the cost);
the plan returned always satisfies the constraint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from rubberband.errors import InfeasibleDeadlineError, SpecError
from rubberband.plan.compile import compile_plan
from rubberband.plan.plan import Plan
from rubberband.profiles.cloud import CloudCatalog, CloudProfile
from rubberband.profiles.model import ModelProfile
from rubberband.spec.experiment import ExperimentSpec
from rubberband.units import format_duration, format_usd

# The bracket [lo, hi] on the deadline is narrowed until hi - lo <= TOLERANCE * lo: then the
# best plan's mean JCT is within 0.5% of the shortest one within the budget.
TOLERANCE = 0.005
# The probe "just below" a plan's JCT, relative; above the planner's own 1e-9 slack on deadlines.
EXACT = 1e-7
MAX_PROBES = 40
# A deadline every plan meets: the planner's plan at it is the cheapest plan of all.
LONGEST_S = 1e8


class InfeasibleBudgetError(SpecError):
    """No plan stays within the budget; ``cheapest`` is the cheapest plan there is (or the
    cheapest that meets the deadline asked for too)."""

    def __init__(self, message: str, cheapest: Plan):
        super().__init__(message)
        self.cheapest = cheapest


def budget_cost(plan: Plan, confidence: float | None = None) -> float:
    """The cost the budget is held against: the plan's mean cost, or with ``confidence=p``
    its p-quantile over the samples (the smallest c with P(cost <= c) >= p)."""
    if confidence is None:
        return plan.predicted.mean_cost_usd
    costs = np.sort(plan.predicted.cost_usd)
    return float(costs[max(0, math.ceil(confidence * len(costs) - 1e-9) - 1)])


def plan_for_budget(spec: ExperimentSpec, model: ModelProfile | Mapping[str, ModelProfile],
                    cloud: CloudProfile | CloudCatalog, budget_usd: float, confidence: float | None = None,
                    deadline_s: float | None = None, field: str = "budget_usd", **compile_kwargs: Any) -> Plan:
    """The plan with the shortest mean JCT whose cost stays within ``budget_usd``.

    Args:
        spec, model, cloud: as for ``compile_plan``.
        budget_usd: the budget in dollars (> 0).
        confidence: ``None``: the plan's mean cost <= budget; ``p``: P(cost <= budget) >= p.
        deadline_s: a deadline the plan must meet as well (mean JCT); the budget still decides
            which plan (the fastest within it), the deadline only rules plans out.
        field: the name bad input is reported under (the CLI says ``--budget``).
        compile_kwargs: ``compile_plan``'s other arguments (policy, samples, seed,
            instance_type, market, progress); ``confidence`` there is the budget's here.

    Returns:
        ``compile_plan``'s plan at the deadline found (the module docstring), with
        ``info["budget_usd"]``, ``info["budget_confidence"]``, ``info["budget_cost_usd"]``
        (the cost held against the budget), ``info["p_within_budget"]`` and
        ``info["budget_probes"]`` (every deadline probed — ``None`` for the cheapest plan —
        with its plan's mean JCT, cost and whether it was within the budget). ``deadline_s`` is the deadline asked for,
        else ``math.inf``: the budget chose the plan, and the probe it came from is the search's
        deadline, no promise (a run of the plan keeps no deadline: no re-planning, no safety net).

    Raises:
        SpecError: a budget that is not a positive number, or a bad confidence.
        InfeasibleBudgetError: the budget is below the cheapest plan (or the cheapest that
            meets ``deadline_s``); the message names its cost and allocation.
        InfeasibleDeadlineError: ``deadline_s`` cannot be met at any cost.
    """
    compile_kwargs.pop("compare", None)        # one plan per probe; the probes are what is compared
    return within_budget(lambda d: compile_plan(spec, model, cloud, d, **compile_kwargs), budget_usd, confidence,
                         deadline_s, field)


def within_budget(planner: Callable[[float], Plan], budget_usd: float, confidence: float | None = None,
                  deadline_s: float | None = None, field: str = "budget_usd") -> Plan:
    """``plan_for_budget`` over any planner: ``planner(d)`` is the cheapest plan whose mean JCT
    is at most ``d`` (raising ``InfeasibleDeadlineError`` when there is none), e.g. a what-if
    sweep's planner on its shared ``StageTable``."""
    if isinstance(budget_usd, bool) or not isinstance(budget_usd, (int, float)) or not budget_usd > 0 \
            or not math.isfinite(budget_usd):
        raise SpecError(f"{field}: expected a positive amount of dollars, e.g. 50, got {budget_usd!r}")
    if confidence is not None and not 0 < confidence < 1:
        raise SpecError(f"confidence: must be between 0 and 1, got {confidence!r}")
    probes: list[dict[str, Any]] = []

    def probe(d: float) -> Plan | None:
        """The planner's plan at deadline ``d`` if it is within the budget, else ``None``."""
        try:
            plan = planner(d)
        except InfeasibleDeadlineError:
            probes.append({"deadline_s": d, "jct_s_mean": None, "cost_usd": None, "within_budget": False})
            return None
        cost = budget_cost(plan, confidence)
        ok = cost <= budget_usd * (1 + 1e-12)
        probes.append({"deadline_s": d, "jct_s_mean": plan.predicted.mean_jct_s, "cost_usd": cost,
                       "allocation": list(plan.allocation), "within_budget": ok})
        return plan if ok else None

    def over(plan: Plan, what: str) -> InfeasibleBudgetError:
        sure = "" if confidence is None else f" with probability {confidence:g}"
        cost = budget_cost(plan, confidence)
        # The whole layout, so the plan can be told apart (and rerun) from the message alone.
        types = plan.instance_types if len(set(plan.instance_types)) > 1 else ()
        on = f"{','.join(types)} per stage" if types else plan.instance_type
        packed = f", trials per GPU {','.join(map(str, plan.packing))}" if any(k > 1 for k in plan.packing) else ""
        return InfeasibleBudgetError(
            f"{field}: {format_usd(budget_usd)} is below {what}, which costs {format_usd(cost)}{sure} "
            f"(mean JCT {format_duration(plan.predicted.mean_jct_s)}, allocation "
            f"{','.join(map(str, plan.allocation))} on {on}{packed}); raise the budget to at least "
            f"{format_usd(math.ceil(cost * 100) / 100)}", plan)

    # The upper end: the cheapest plan (or the cheapest that meets the deadline asked for).
    top = planner(deadline_s or LONGEST_S)
    if budget_cost(top, confidence) > budget_usd * (1 + 1e-12):
        raise over(top, "the cheapest plan that meets the deadline of " + format_duration(deadline_s)
                   if deadline_s else "the cheapest possible run")
    probes.append({"deadline_s": deadline_s, "jct_s_mean": top.predicted.mean_jct_s,
                   "cost_usd": budget_cost(top, confidence), "allocation": list(top.allocation), "within_budget": True})
    best = top
    # The lower end: the fastest plan's mean JCT, which the planner names when asked for less.
    try:
        lo = planner(1e-6).predicted.mean_jct_s
    except InfeasibleDeadlineError as exc:
        lo = exc.min_jct_s
    fastest = probe(lo * (1 + EXACT))
    if fastest is not None:
        best = min((best, fastest), key=lambda p: p.predicted.mean_jct_s)
    while fastest is None and len(probes) < MAX_PROBES:
        hi = best.predicted.mean_jct_s
        settled = hi - lo <= TOLERANCE * lo
        # The middle on a log scale: the tolerance is relative, so this halves what matters.
        plan = probe(hi * (1 - EXACT) if settled else math.sqrt(lo * hi))
        if plan is not None:
            best = plan      # the planner's plan meets the probe's deadline: faster than hi
        elif settled:
            break            # nothing faster than ``best`` within the budget: exact
        else:
            lo = probes[-1]["deadline_s"]
    info = {**best.info, "budget_usd": float(budget_usd), "budget_confidence": confidence,
            "budget_cost_usd": budget_cost(best, confidence),
            "p_within_budget": float(np.mean(best.predicted.cost_usd <= budget_usd * (1 + 1e-12))),
            "budget_probes": probes}
    return replace(best, info=info, deadline_s=float(deadline_s) if deadline_s else math.inf)
