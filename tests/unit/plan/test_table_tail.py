"""``StageTable.tail`` (plan/table.py): a re-plan at a SYNC from the parent's table, warm, is the
re-plan a table built from scratch for the remaining stages gives with the same draws."""

from __future__ import annotations

import numpy as np
import pytest

from rubberband import ExperimentSpec
from rubberband.errors import SpecError
from rubberband.plan import table as table_module
from rubberband.plan.compile import fastest_plan, plan_on_table
from rubberband.plan.table import StageTable
from rubberband.profiles.cloud import Market
from rubberband.profiles.spot import SpotMarket
from rubberband.simulator.engine import HeldInstances

from .test_search import fig12, wide_model


def scratch(parent: StageTable, first: int, held, model=None) -> StageTable:
    spec = parent.spec
    remaining = ExperimentSpec(spec.stages[first:], tuple(b - first for b in spec.bracket_starts if b > first), spec.eta)
    return StageTable(remaining, model or parent.model, parent.cloud, parent.samples, parent.seed,
                      markets=parent.markets[first:], draws=parent.draws[first:], held_at_start=held,
                      max_instances=parent.max_instances)


def same_plan(a, b) -> bool:
    return ((a.allocation, a.instances, a.spot_instances) == (b.allocation, b.instances, b.spot_instances)
            and np.array_equal(a.predicted.jct_s, b.predicted.jct_s)
            and np.array_equal(a.predicted.cost_usd, b.predicted.cost_usd))


@pytest.mark.parametrize("market", ["on-demand", "spot"])
@pytest.mark.parametrize("first,held,slack", [(1, 8, 1.3), (2, HeldInstances(3), 1.1), (3, 0, 2.0), (1, 40, 1.6)])
def test_a_replan_from_the_tail_is_the_replan_from_scratch(first, held, slack, market, monkeypatch):
    exp = fig12()
    cloud = exp.cloud.replace(spot_price_usd_per_hour=3.0, spot=SpotMarket(notice_s=120, rate_per_hour=1.0))
    spec = ExperimentSpec.sha(64, 4, 512, 2)
    parent = StageTable(spec, wide_model(8), cloud, samples=40, seed=5)
    if market == "spot":
        parent = parent.for_markets((Market.ON_DEMAND,) + (Market.SPOT,) * (spec.num_stages() - 1))
    plan_on_table(parent, 2400.0, "optimal")            # the plan the job runs: the parent's caches fill
    cold = scratch(parent, first, held)
    deadline_s = slack * fastest_plan(cold).jct_s
    expected = plan_on_table(cold, deadline_s, "optimal")
    known = [set(parent.entries[i]) for i in range(first, parent.num_stages)]
    scheduled = []
    original = table_module.list_schedule
    monkeypatch.setattr(table_module, "list_schedule", lambda d, g: scheduled.append(g) or original(d, g))
    warm = parent.tail(first, held)
    got = plan_on_table(warm, deadline_s, "optimal")
    assert same_plan(got, expected)
    if market == "on-demand":      # the tail's stage means are the parent's: no queue it knew is scheduled again
        assert all(warm.entries[j] is parent.entries[first + j] for j in range(warm.num_stages))
        fresh = sum(len(set(warm.entries[j]) - known[j]) for j in range(warm.num_stages))
        assert len(scheduled) <= fresh
    again, cold = warm.tail(1, 2), scratch(parent, first + 1, 2)     # the next SYNC, from the tail's tail
    deadline_s = slack * fastest_plan(cold).jct_s
    assert same_plan(plan_on_table(again, deadline_s, "optimal"), plan_on_table(cold, deadline_s, "optimal"))


def test_a_corrected_model_shares_the_draws_only():
    exp = fig12()
    spec = ExperimentSpec.sha(32, 4, 256, 2)
    parent = StageTable(spec, wide_model(8), exp.cloud, samples=30, seed=2)
    plan_on_table(parent, 2000.0, "optimal")
    slow = parent.model.replace(iter_latency_s={g: d.with_moments(d.mean * 1.3, d.std * 1.3)
                                                for g, d in parent.model.iter_latency_s.items()})
    warm = parent.tail(2, 4, model=slow)
    assert warm.entries[0] is not parent.entries[2] and warm.draws[0] is parent.draws[2]
    cold = scratch(parent, 2, 4, slow)
    deadline_s = 1.4 * fastest_plan(cold).jct_s
    assert same_plan(plan_on_table(warm, deadline_s, "optimal"), plan_on_table(cold, deadline_s, "optimal"))


@pytest.mark.parametrize("first", [-1, 6, 1.0, True])
def test_a_tail_outside_the_stages_is_refused_in_one_line(first):
    parent = StageTable(ExperimentSpec.sha(32, 4, 256, 2), wide_model(8), fig12().cloud, samples=10, seed=2)
    with pytest.raises(SpecError, match=r"^first: expected a stage index in 0\.\.5"):
        parent.tail(first, 0)
