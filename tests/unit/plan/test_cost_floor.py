"""The billed-cost floor of a plan (plan/table.py ``StageTable.cost_floor``): the surrogate plus
the billing minimum's top-up of each instance's mean life. It is below the mean billed cost of
the plan's full simulation on every kind of table it adds anything on, and ``choose`` passes over
the candidates it rules out without changing the plan (issue 22: re-plans in milliseconds)."""

from __future__ import annotations

import numpy as np
import pytest

from rubberband import ExperimentSpec
from rubberband.plan import policies
from rubberband.plan.policies import choose, optimal_policy
from rubberband.plan.table import StageTable
from rubberband.profiles.cloud import Market
from rubberband.simulator.engine import HeldInstances
from rubberband.testing.builders import cloud_profile, scaling_model, spot_cloud, spot_market

SPEC = ExperimentSpec.sha(16, 2, 16, 2)      # 16x2, 8x4, 4x8, 2x16, 1x32 iterations: short stages


def model():
    return scaling_model(one_gpu_s=4.0, one_gpu_std_s=0.4, gpus=(1, 2, 4, 8), startup_s=3.0, sync_s=1.0)


def random_plans(table, rng, count):
    """Plans of the search space: a random candidate per stage, each holding what it needs or
    what a later stage needs, so launches, keeps and releases all occur."""
    for _ in range(count):
        alloc = [int(rng.choice(table.candidates(i))) for i in range(table.num_stages)]
        needs = [table.need(i, a) for i, a in enumerate(alloc)]
        yield alloc, [int(rng.choice([need, *[h for h in needs[i + 1:] if h > need]])) for i, need in enumerate(needs)]


def tables():
    """One GPU per instance (many instances, lives shorter than the minimum) and four, from
    nothing and from instances held at the start, on-demand, on spot that is never reclaimed and
    switching market (a switch releases every instance), with a minimum of 60 s and of 5 min."""
    n = SPEC.num_stages()
    vectors = [(Market.ON_DEMAND,) * n, (Market.SPOT,) * n, (Market.SPOT,) * 2 + (Market.ON_DEMAND,) * (n - 2)]
    for G in (1, 4):
        for minimum in (60.0, 300.0):
            cloud = spot_cloud(gpus_per_instance=G, minimum_s=minimum, market=Market.ON_DEMAND)
            for held in (None, HeldInstances(3, spot=1)):
                table = StageTable(SPEC, model(), cloud, samples=30, seed=4, held_at_start=held)
                for v in vectors:
                    yield table.for_markets(v)


def test_the_floor_is_between_the_surrogate_and_the_billed_cost():
    rng = np.random.default_rng(7)
    tighter = 0
    for table in tables():
        plans = list(random_plans(table, rng, 5))
        floors = table.cost_floors(np.array([a for a, _ in plans]), np.array([h for _, h in plans]))
        for (alloc, held), floor in zip(plans, floors):
            surrogate = table.evaluate(alloc, held)[1]
            billed = table.simulate(alloc, held).mean_cost_usd
            assert surrogate <= floor <= billed * (1 + 1e-12), (table.markets, alloc, held)
            assert table.cost_floor(alloc, held) == floor
            tighter += floor > surrogate * (1 + 1e-6)
    assert tighter > 50      # what makes it worth anything: most plans launch short-lived instances


@pytest.mark.parametrize("cloud", [cloud_profile(per_function=True, gpus_per_instance=1),
                                   spot_cloud(spot=spot_market(rate_per_hour=2.0), gpus_per_instance=1)],
                         ids=["per-function", "spot-reclaimed"])
def test_where_billing_has_no_minimum_or_instances_are_reclaimed_it_is_the_surrogate(cloud):
    table = StageTable(SPEC, model(), cloud, samples=30, seed=4)
    for alloc, held in random_plans(table, np.random.default_rng(3), 5):
        assert table.cost_floor(alloc, held) == table.evaluate(alloc, held)[1]


def test_choose_passes_over_what_the_floor_rules_out_and_chooses_the_same_plan(monkeypatch):
    """One GPU per instance and a 5 min minimum: most candidates cheaper in surrogate than the
    plan chosen bill far more than it; ``choose`` simulates fewer and keeps the very same plan."""
    cloud = spot_cloud(gpus_per_instance=1, minimum_s=300.0, market=Market.ON_DEMAND)
    spec = ExperimentSpec.sha(64, 2, 64, 2)

    def run(floor: bool):
        if not floor:
            monkeypatch.setattr(StageTable, "cost_floors", lambda self, a, h: self.evaluate_many(a, h)[1])
        table = StageTable(spec, model(), cloud, samples=30, seed=5)
        deadline = 1.3 * policies.StageGraph(table).fastest().jct_s
        candidates = optimal_policy(table, deadline)
        sims = len(table._simulations)
        chosen = choose(table, candidates, deadline, None)
        monkeypatch.undo()
        return chosen, len(table._simulations) - sims

    (cand, result), sims = run(floor=True)
    (cand_all, result_all), sims_all = run(floor=False)
    assert (cand.allocation, cand.instances) == (cand_all.allocation, cand_all.instances)
    assert result.mean_cost_usd == result_all.mean_cost_usd
    assert sims < sims_all
