"""market="auto": spot or on-demand per stage, chosen under the chance constraint with reclaims
(DESIGN §4.1, §5)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from rubberband import load_experiment
from rubberband.errors import SpecError
from rubberband.plan import compile_plan, policies, simulate_plan
from rubberband.plan.compile import market_label, market_vectors, plan_markets
from rubberband.plan.policies import optimal_policy
from rubberband.plan.search import StageGraph
from rubberband.plan.table import StageTable
from rubberband.profiles.cloud import Market
from rubberband.profiles.spot import SpotMarket

ROOT = Path(__file__).resolve().parents[3]
OD, SPOT = Market.ON_DEMAND, Market.SPOT


@cache
def experiment():
    return load_experiment(ROOT / "experiments" / "resnet101_cifar10.yaml")


def cloud(rate: float, spot_share: float = 0.3, notice: float = 120.0):
    c = experiment().cloud
    return c.replace(spot_price_usd_per_hour=spot_share * c.price_usd_per_hour,
                     spot=SpotMarket(notice_s=notice, rate_per_hour=rate, explicit=True))


def test_market_vectors_weigh_all_of_each_and_every_split():
    vectors = market_vectors(3)
    assert vectors[:2] == [(OD, OD, OD), (SPOT, SPOT, SPOT)]
    assert set(vectors[2:]) == {(SPOT, OD, OD), (SPOT, SPOT, OD), (OD, SPOT, SPOT), (OD, OD, SPOT)}
    assert len(vectors) == len(set(vectors)) == 6


def test_without_reclaims_auto_is_the_on_demand_plan_at_the_spot_price():
    exp = experiment()
    od = compile_plan(exp.spec, exp.model, cloud(0.0), 1200.0, samples=100, confidence=0.9)
    auto = compile_plan(exp.spec, exp.model, cloud(0.0), 1200.0, samples=100, confidence=0.9, market="auto")
    assert auto.allocation == od.allocation and auto.instances == od.instances
    assert auto.spot_counts == auto.instances and market_label(auto) == "spot"
    assert np.array_equal(auto.predicted.jct_s, od.predicted.jct_s)
    assert auto.warnings == ()      # a model that says "never reclaimed" was given
    bare = compile_plan(exp.spec, exp.model, exp.cloud, 1200.0, samples=100, confidence=0.9, market="auto")
    assert any("has no spot preemption model" in w for w in bare.warnings)
    data = od.cloud.data.usd_per_launch * sum(s.new_instances for s in od.predicted.stages)
    assert auto.predicted.mean_cost_usd - data == pytest.approx(0.3 * (od.predicted.mean_cost_usd - data), rel=1e-9)


def test_auto_keeps_its_promise_out_of_sample_and_beats_on_demand():
    exp = experiment()
    c = cloud(0.3)
    od = compile_plan(exp.spec, exp.model, c, 1200.0, samples=200, confidence=0.95)
    auto = compile_plan(exp.spec, exp.model, c, 1200.0, samples=200, confidence=0.95, market="auto")
    assert auto.predicted.p_meet(1200.0) >= 0.95
    assert od.predicted.mean_cost_usd / auto.predicted.mean_cost_usd >= 2.0
    again = simulate_plan(auto, exp.model, samples=2000, seed=123)
    assert again.p_meet(1200.0) >= 0.93
    assert sum(s.mean_reclaims for s in again.stages) > 0
    labels = [c.get("market") for c in auto.considered]
    assert labels == ["all on-demand", "all spot", "chosen: spot"]


def test_when_spot_cannot_carry_the_job_auto_falls_back_to_on_demand_stages_and_says_so():
    exp = experiment()
    c = cloud(7.0)                    # a reclaim every 8.6 minutes per instance (a 2-minute notice)
    deadline = 640.0
    auto = compile_plan(exp.spec, exp.model, c, deadline, samples=100, confidence=0.9, market="auto")
    assert auto.predicted.p_meet(deadline) >= 0.9
    assert market_label(auto) == "spot 0-2, on-demand 3"
    assert auto.warnings == ("market auto: all spot cannot meet the deadline; stage(s) 3 run on on-demand instances",)
    assert any("infeasible" in c for c in auto.considered if c.get("market") == "all spot")


def test_the_table_s_spot_means_are_within_the_stated_tolerance_of_full_simulation():
    """The planner's stage means for spot stages assume instances fresh at each stage's start;
    the full simulation carries them (and their pending replacements) across stages. Stated
    tolerance: 3% of the mean JCT, 5% of the mean cost."""
    exp = experiment()
    c = cloud(1.0)
    table = StageTable(exp.spec, exp.model, c.replace(market=OD), samples=400, seed=0).for_markets((SPOT,) * 4)
    for allocation in [(32, 20, 12, 8), (32, 10, 6, 4), (8, 10, 3, 8)]:
        held = tuple(table.need(i, a) for i, a in enumerate(allocation))
        jct, cost = table.evaluate(allocation, held)
        from rubberband.simulator import simulate

        full = simulate(exp.spec, allocation, exp.model, c, samples=400, seed=0, instances=held, spot_instances=held)
        assert jct == pytest.approx(full.mean_jct_s, rel=0.03)
        assert cost == pytest.approx(full.mean_cost_usd, rel=0.05)


def test_a_market_needs_a_spot_price():
    exp = experiment()
    with pytest.raises(SpecError, match=r"market: p3\.8xlarge has no spot_price_usd_per_hour"):
        StageTable(exp.spec, exp.model, exp.cloud.replace(spot_price_usd_per_hour=None), samples=10).for_markets((SPOT,) * 4)
    with pytest.raises(SpecError, match=r"market: unknown value 'cheap'; choose one of on-demand, spot, auto"):
        compile_plan(exp.spec, exp.model, exp.cloud, 1200.0, samples=10, market="cheap")


def test_a_traced_market_is_planned_on_no_reclaim_means_and_judged_in_full():
    """Stage means can not start fairly in a zone's trace, so the planner searches with the
    no-reclaim means and keeps only plans the full simulation (with the trace) says meet the
    deadline: a plan that meets it is never refused for the surrogate's sake."""
    from rubberband.profiles.spot import load_trace
    from rubberband.simulator import simulate

    exp = experiment()
    traces = ROOT / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json"
    c = exp.cloud.replace(market=SPOT, spot=SpotMarket(notice_s=120, trace=load_trace(traces, "us-west-2b"),
                                                         trace_file=str(traces)))
    plan = compile_plan(exp.spec, exp.model, c, 3600.0, samples=100)
    again = simulate(exp.spec, plan.allocation, exp.model, c, samples=100, seed=0, instances=plan.instances)
    assert again.mean_jct_s <= 3600.0


def test_auto_under_per_function_billing_plans_on_demand():
    from rubberband.profiles.cloud import Billing, BillingModel

    exp = experiment()
    c = cloud(0.5).replace(billing=Billing(BillingModel.PER_FUNCTION))
    plan = compile_plan(exp.spec, exp.model, c, 1200.0, samples=60, market="auto")
    assert not any(plan.spot_counts)


@pytest.mark.parametrize("rate", [0.3, 2.0])
@pytest.mark.parametrize("notice", [0.0, 120.0, 600.0])
def test_spot_plans_are_predicted_by_their_full_simulation_within_the_stated_tolerance(rate, notice):
    """The planner's spot stage means against the full simulation of the plan it chose
    (``StageTable``'s stated tolerance: JCT 2%; cost 3% at notices up to 120 s, 15% at 600 s);
    the plan's prediction is that full simulation, bit for bit."""
    exp = experiment()
    c = cloud(rate, notice=notice).replace(market=SPOT)
    plan = compile_plan(exp.spec, exp.model, c, 1200.0 * (1.5 if rate > 1 else 1.0), samples=200, seed=0)
    assert any(plan.spot_counts)
    jct, cost = StageTable(exp.spec, exp.model, c, samples=200, seed=0).evaluate(plan.allocation, plan.instances)
    assert jct == pytest.approx(plan.predicted.mean_jct_s, rel=0.02)
    assert cost == pytest.approx(plan.predicted.mean_cost_usd, rel=0.03 if notice <= 120 else 0.15)
    again = simulate_plan(plan, exp.model)
    assert np.array_equal(again.jct_s, plan.predicted.jct_s) and np.array_equal(again.cost_usd, plan.predicted.cost_usd)


def test_under_a_cost_cap_auto_returns_only_a_cheaper_plan():
    """The type-per-stage search of ``instance_type="auto"`` x ``market="auto"`` is cut at the
    cheapest single-type plan: under a cap it returns the uncapped plan if that is cheaper, ``None``
    if no plan's surrogate is under the cap — never a claim about all spot that it did not plan."""
    exp = experiment()
    c = cloud(0.3)
    args = (exp.spec, exp.model, c, 1200.0, "optimal", 100, exp.seed, 0.95)
    free = plan_markets(*args)
    assert plan_markets(*args, cost_cap=0.5 * free.predicted.mean_cost_usd) is None
    capped = plan_markets(*args, cost_cap=1.01 * free.predicted.mean_cost_usd)
    assert (capped.allocation, capped.instances, capped.spot_counts) == (free.allocation, free.instances,
                                                                          free.spot_counts)
    assert capped.predicted.mean_cost_usd == free.predicted.mean_cost_usd
    assert capped.warnings == free.warnings


def test_a_cap_no_plan_can_beat_ends_the_optimal_search_after_its_first_pass(monkeypatch):
    """By duality every plan meeting the deadline costs at least min(C + λT) − λD on the first,
    optimistic pass: at or under that, nothing is searched further (same candidates under the cap)."""
    exp = experiment()
    table = StageTable(exp.spec, exp.model, cloud(0.3).replace(market=SPOT), samples=100, seed=exp.seed)
    best = min(c.cost_usd for c in optimal_policy(table, 1200.0, 0.95))
    graphs = []
    monkeypatch.setattr(policies, "StageGraph", lambda *a, **k: graphs.append(1) or StageGraph(*a, **k))
    cands = optimal_policy(table, 1200.0, 0.95, cost_cap=0.5 * best)
    assert len(graphs) == 1
    assert not [c for c in cands if c.cost_usd < 0.5 * best]


@pytest.mark.parametrize("spot_held", [8, 0])
def test_held_spot_instances_serve_a_spot_stage_and_held_on_demand_ones_do_not(spot_held):
    """``market="auto"`` from 8 instances held: a spot stage 0 keeps held spot instances and
    launches the rest; held on-demand ones are another market's (released at t = 0)."""
    from rubberband.simulator import HeldInstances

    exp = experiment()
    c = cloud(0.5)
    plan = compile_plan(exp.spec, exp.model, c, 1500, samples=200, market="auto",
                        held_at_start=HeldInstances(8, spot_held))
    assert plan.spot_counts[0] == plan.instances[0] <= 8
    assert plan.predicted.stages[0].new_instances == (0 if spot_held else plan.instances[0])
    replay = simulate_plan(plan, exp.model)
    assert np.array_equal(replay.jct_s, plan.predicted.jct_s) and np.array_equal(replay.cost_usd, plan.predicted.cost_usd)
