"""plan_for_budget: the shortest mean JCT within a budget (DESIGN §5, issue #15 item 6)."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from rubberband import load_experiment
from rubberband.errors import InfeasibleDeadlineError, SpecError
from rubberband.plan import Plan, check_plan, compile_plan
from rubberband.plan.budget import (
    EXACT,
    LONGEST_S,
    TOLERANCE,
    InfeasibleBudgetError,
    budget_cost,
    plan_for_budget,
)

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = 200


@cache
def experiment():
    return load_experiment(ROOT / "experiments" / "resnet101_cifar10.yaml")


def cheapest_at(deadline_s: float) -> Plan:
    exp = experiment()
    return compile_plan(exp.spec, exp.model, exp.cloud, deadline_s, samples=SAMPLES)


def for_budget(budget_usd, **kw) -> Plan:
    exp = experiment()
    return plan_for_budget(exp.spec, exp.model, exp.cloud, budget_usd, samples=SAMPLES, **kw)


@pytest.mark.parametrize("deadline_s", [600.0, 1200.0, 2400.0])
def test_the_deadline_optimal_cost_as_budget_meets_that_deadline(deadline_s):
    optimal = cheapest_at(deadline_s)
    budget = optimal.predicted.mean_cost_usd
    plan = for_budget(budget)
    assert plan.predicted.mean_jct_s <= deadline_s
    assert plan.predicted.mean_cost_usd <= budget
    assert plan.info["budget_usd"] == budget and plan.info["budget_confidence"] is None


@pytest.mark.parametrize("budget", [13.0, 15.0, 20.0, 30.0])
def test_no_faster_plan_stays_within_the_budget(budget):
    plan = for_budget(budget)
    jct = plan.predicted.mean_jct_s
    assert plan.predicted.mean_cost_usd <= budget
    # The planner's plan at every shorter deadline, down to the fastest, costs more than the budget.
    fastest = experiment()
    with pytest.raises(InfeasibleDeadlineError, match="shortest achievable JCT") as caught:
        compile_plan(fastest.spec, fastest.model, fastest.cloud, 1.0, samples=SAMPLES)
    for d in np.linspace(caught.value.min_jct_s * (1 + EXACT), jct * (1 - 2 * EXACT), 25):
        assert cheapest_at(float(d)).predicted.mean_cost_usd > budget, d
    # ... and the search settled it with a probe just below the answer that was over budget.
    below = [p for p in plan.info["budget_probes"] if p["deadline_s"] and not p["within_budget"]
             and jct * (1 - 2 * EXACT) <= p["deadline_s"] < jct]
    assert below


def test_a_larger_budget_never_gives_a_slower_plan():
    jcts = [for_budget(b).predicted.mean_jct_s for b in (12.5, 14.0, 16.0, 20.0, 40.0, 100.0)]
    assert jcts == sorted(jcts, reverse=True)
    assert jcts[0] > 1.5 * jcts[-1]


def test_with_a_confidence_the_budget_holds_with_that_probability():
    budget = 15.0
    sure = for_budget(budget, confidence=0.9)
    assert np.mean(sure.predicted.cost_usd <= budget) >= 0.9
    assert sure.info["p_within_budget"] >= 0.9 and sure.info["budget_cost_usd"] <= budget
    # The mean-cost answer would break the budget in more than 10% of samples: the confidence matters.
    mean_only = for_budget(budget)
    assert budget_cost(mean_only, 0.9) > budget
    assert sure.predicted.mean_jct_s > mean_only.predicted.mean_jct_s


def test_a_budget_below_the_cheapest_run_names_the_cheapest_plan():
    cheapest = cheapest_at(LONGEST_S)
    cost = cheapest.predicted.mean_cost_usd
    alloc = ",".join(map(str, cheapest.allocation))
    with pytest.raises(InfeasibleBudgetError,
                       match=rf"^budget_usd: \$11\.00 is below the cheapest possible run, which costs \${cost:.2f} "
                             rf"\(mean JCT .*, allocation {alloc} on p3\.8xlarge\); raise the budget to at least") as caught:
        for_budget(11.0)
    assert caught.value.cheapest.predicted.mean_cost_usd == cost
    # Just at the cheapest cost, the cheapest plan (or one as cheap and faster) is the answer.
    assert for_budget(cost).predicted.mean_cost_usd <= cost


def test_the_cheapest_plan_in_the_message_shows_its_types_per_stage_and_its_packing():
    from dataclasses import replace

    from rubberband.plan.budget import within_budget

    cheapest = cheapest_at(LONGEST_S)
    small = cheapest.cloud.replace(instance_type="p3.2xlarge", gpus_per_instance=1)
    mixed = replace(cheapest, instance_types=("p3.8xlarge", "p3.8xlarge", "p3.2xlarge", "p3.2xlarge"),
                    type_clouds={"p3.8xlarge": cheapest.cloud, "p3.2xlarge": small}, trials_per_gpu=(2, 2, 1, 1))
    alloc = ",".join(map(str, mixed.allocation))
    with pytest.raises(InfeasibleBudgetError, match=rf"allocation {alloc} on p3\.8xlarge,p3\.8xlarge,p3\.2xlarge,"
                                                    rf"p3\.2xlarge per stage, trials per GPU 2,2,1,1\); raise the budget"):
        within_budget(lambda d: mixed, 0.01)


@pytest.mark.parametrize("budget", [0, -5.0, math.nan, math.inf, True, "50"])
def test_a_budget_that_is_not_a_positive_amount_is_one_line(budget):
    with pytest.raises(SpecError, match=r"^budget_usd: expected a positive amount of dollars, e\.g\. 50, got"):
        for_budget(budget)


def test_a_deadline_as_well_rules_plans_out_but_the_budget_still_chooses():
    free = for_budget(30.0)
    assert for_budget(30.0, deadline_s=1200.0).allocation == free.allocation       # the budget's plan meets it
    capped = for_budget(14.0, deadline_s=1200.0)
    assert capped.deadline_s == 1200.0 and capped.predicted.mean_jct_s <= 1200.0
    assert capped.predicted.mean_cost_usd <= 14.0
    need = cheapest_at(600.0).predicted.mean_cost_usd
    with pytest.raises(InfeasibleBudgetError,
                       match=rf"^budget_usd: \$14\.00 is below the cheapest plan that meets the deadline of 10m00s, "
                             rf"which costs \${need:.2f}"):
        for_budget(14.0, deadline_s=600.0)
    with pytest.raises(InfeasibleDeadlineError, match="no plan meets the deadline of 60s"):
        for_budget(14.0, deadline_s=60.0)


@pytest.mark.parametrize("budget", [15.0, 20.0, 30.0])
def test_cut_short_the_search_stays_within_the_budget_and_the_stated_tolerance(monkeypatch, budget):
    import rubberband.plan.budget as budget_mod

    exact = for_budget(budget)
    probes = len(exact.info["budget_probes"])
    # One probe short: the bracket was narrowed to the tolerance, the exact check just below it skipped.
    monkeypatch.setattr(budget_mod, "MAX_PROBES", probes - 1)
    rough = for_budget(budget)
    over = max(p["deadline_s"] for p in rough.info["budget_probes"] if not p["within_budget"])
    assert rough.predicted.mean_cost_usd <= budget
    assert rough.predicted.mean_jct_s <= over * (1 + TOLERANCE)            # the bracket's over-budget end
    assert exact.predicted.mean_jct_s <= rough.predicted.mean_jct_s <= exact.predicted.mean_jct_s * (1 + TOLERANCE)
    # Cut very short, still a plan within the budget (the cheapest, at worst).
    monkeypatch.setattr(budget_mod, "MAX_PROBES", 3)
    assert for_budget(budget).predicted.mean_cost_usd <= budget


def test_the_budget_travels_with_the_plan_json():
    plan = for_budget(20.0)
    back = Plan.from_json(plan.to_json())
    assert back.info["budget_usd"] == 20.0
    assert json.loads(plan.to_json())["info"]["budget_probes"][0]["deadline_s"] is None    # the cheapest plan


def test_without_a_deadline_the_plan_keeps_none():
    # The search's probes are deadlines no one asked for: none of them becomes the plan's.
    exp = experiment()
    plan = for_budget(15.0)
    assert plan.deadline_s == math.inf
    back = Plan.from_json(plan.to_json())
    assert back.deadline_s == math.inf and back.allocation == plan.allocation
    checked = check_plan(back, exp.spec, exp.model, exp.catalog.with_overrides(exp.cloud_overrides), samples=SAMPLES)
    assert checked.deadline_s == math.inf and checked.allocation == plan.allocation


def test_market_and_instance_type_choices_pass_through():
    exp = experiment()
    catalog = exp.catalog.with_overrides(exp.cloud_overrides)
    plan = plan_for_budget(exp.spec, exp.model, catalog, 5.0, samples=100, instance_type="auto", market="auto")
    assert plan.predicted.mean_cost_usd <= 5.0 and any(plan.spot_counts)
    # On-demand alone cannot run the job for $5 at all.
    with pytest.raises(InfeasibleBudgetError, match=r"below the cheapest possible run"):
        plan_for_budget(exp.spec, exp.model, catalog, 5.0, samples=100, instance_type="p3.8xlarge", market="on-demand")


def test_whatif_budget_axis_is_plan_for_budget_per_budget():
    from rubberband.plan import whatif

    exp = experiment()
    budgets = [13.0, 20.0, 40.0]
    scenarios = whatif(exp.spec, exp.model, exp.cloud, math.inf, {"budget_usd": budgets}, ["optimal", "static"],
                       samples=SAMPLES, seed=0)
    for sc, budget in zip(scenarios, budgets):
        alone = for_budget(budget)
        assert sc.jcts["optimal"] == alone.predicted.mean_jct_s and sc.allocations["optimal"] == alone.allocation
        assert sc.costs["optimal"] <= budget and sc.costs["static"] <= budget
        assert sc.jcts["optimal"] <= sc.jcts["static"]
    below = whatif(exp.spec, exp.model, exp.cloud, math.inf, {"budget_usd": [5.0]}, ["optimal"], samples=SAMPLES, seed=0)
    assert below[0].jcts["optimal"] is None and below[0].costs["optimal"] is None


def test_whatif_refuses_a_budget_and_a_deadline_sweep_together():
    from rubberband.plan import whatif

    exp = experiment()
    with pytest.raises(SpecError, match=r"^budget_usd: a budget sweep plans the shortest JCT per budget, with no deadline"):
        whatif(exp.spec, exp.model, exp.cloud, 1200.0, {"budget_usd": [20.0], "deadline_s": [600.0, 1200.0]},
               ["optimal"], samples=SAMPLES, seed=0)
