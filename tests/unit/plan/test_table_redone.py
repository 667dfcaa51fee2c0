"""Redone iterations in the planner (DESIGN §4): a function trainable that checkpoints every
``c`` reports trains ``D mod c`` iterations again in each stage that resumes it. The table's
stage work comes from the simulator's own rule (``simulator.model.redone_iters``), so its
added-up stage means are the simulation's, and a re-plan's tail keeps the job's counts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from rubberband import ExperimentSpec
from rubberband.plan.table import StageTable, valid_allocations
from rubberband.simulator import simulate
from rubberband.simulator.model import redone_iters
from rubberband.testing.builders import cloud_profile, model_profile

SPEC = ExperimentSpec.from_stages([(6, 2), (3, 4), (1, 6)])         # D = 0 2 6
EXACT = {"granularity_s": 1e-6, "minimum_s": 0}


def job(every):
    model = model_profile({1: 20.0, 2: 12.0}, startup_s=5.0, sync_s=1.0).replace(checkpoint_every=every)
    cloud = cloud_profile("test.large", 2, 6.0, provision_s=20.0, init_s=30.0, **EXACT)
    return model, cloud


@pytest.mark.parametrize(("every", "redone"), [(1, (0, 0, 0)), (3, (0, 2, 0)), (4, (0, 2, 2)), (None, (0, 2, 6))])
def test_the_tables_stage_means_add_up_to_the_simulation(every, redone):
    model, cloud = job(every)
    table = StageTable(SPEC, model, cloud, samples=20, seed=3)
    assert table.redone == redone
    valid = [valid_allocations(s.num_trials, model, cloud.gpus_per_instance) for s in SPEC.stages]
    for allocation in itertools.product(*valid):
        jct, cost = table.evaluate(allocation)
        result = simulate(SPEC, allocation, model, cloud, samples=20, seed=3, draws=table.draws)
        assert jct == pytest.approx(result.mean_jct_s, rel=1e-9), allocation
        assert cost == pytest.approx(result.mean_cost_usd, rel=1e-6), allocation


def test_redone_iterations_make_the_plan_slower_by_their_work():
    (plain, cloud), (every3, _) = job(1), job(3)
    a = (6, 3, 1)     # every trial on one GPU at once: stage 1 trains 4 + 2 iterations at 20 s
    slow = StageTable(SPEC, every3, cloud, samples=5, seed=0).evaluate(a)[0]
    fast = StageTable(SPEC, plain, cloud, samples=5, seed=0).evaluate(a)[0]
    assert slow - fast == pytest.approx(2 * 20.0)


def test_a_tail_keeps_the_jobs_redone_counts():
    model, cloud = job(3)
    table = StageTable(SPEC, model, cloud, samples=20, seed=3)
    tail = table.tail(1, 3)
    # On its own the remaining spec would start a bracket at stage 1 and redo nothing there.
    assert redone_iters(tail.spec, model) == (0, 1)
    assert tail.redone == table.redone[1:] == (2, 0)
    allocation, held = (3, 1), (3, 3)
    result = tail.simulate(allocation, held)
    assert [s.redone for s in result.stages] == [2, 0]
    assert tail.evaluate(allocation, held)[0] == pytest.approx(result.mean_jct_s, rel=1e-9)
    assert np.all(result.jct_s > 0)


def test_a_plan_json_keeps_each_stages_redone_iterations():
    from rubberband.plan import Plan, compile_plan

    model, cloud = job(3)
    plan = compile_plan(SPEC, model, cloud, 10_000.0, samples=10, seed=0)
    assert [s.redone for s in plan.predicted.stages] == [0, 2, 0]
    stages = plan.to_dict()["predicted"]["stages"]
    assert ["redone" in s for s in stages] == [False, True, False]     # written only where some are
    assert Plan.from_json(plan.to_json()).predicted.stages == plan.predicted.stages
