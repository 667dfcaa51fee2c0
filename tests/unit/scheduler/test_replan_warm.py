"""Re-planning warm from the job's table (issue 22): the re-plan at a SYNC searches the tail of
the table the plan was compiled on, so it plans what a table built from scratch with the job's
draws of the remaining stages plans, and keeps the tail for the next SYNC."""

from __future__ import annotations

import numpy as np
import pytest

from rubberband import CloudProfile, ExperimentSpec, InfeasibleDeadlineError, ModelProfile
from rubberband.plan import compile_plan
from rubberband.plan.compile import plan_on_table
from rubberband.plan.plan import Plan
from rubberband.plan.table import StageTable
from rubberband.profiles import Constant, Normal
from rubberband.profiles.cloud import CloudCatalog
from rubberband.scheduler import Replanner
from rubberband.simulator import HeldInstances

MODEL = ModelProfile({g: Normal(40.0 / g ** 0.8, 4.0 / g ** 0.8) for g in (1, 2, 4, 8)}, Normal(2.0, 0.5),
                     Constant(1.0), name="m")
CLOUD = CloudProfile.from_dict({
    "instance_type": "p3.8xlarge", "gpus_per_instance": 4, "price_usd_per_hour": 12.0,
    "provision_latency_s": {"dist": "constant", "value": 5}, "init_latency_s": {"dist": "normal", "mean": 20, "std": 5},
})
SPEC = ExperimentSpec.from_stages([(16, 2), (8, 4), (4, 8), (2, 16)])
SAMPLES = 50


def slow_replanner(plan: Plan) -> Replanner:
    """A Replanner that has seen eight TRAINs 50% slower than profiled."""
    replanner = Replanner(plan, MODEL, samples=SAMPLES)
    for _ in range(8):
        replanner.observe(1, 2, 2.0 + 2 * 40.0 * 1.5)
    return replanner


def remaining(first: int) -> ExperimentSpec:
    return ExperimentSpec(SPEC.stages[first:], (), SPEC.eta)


def test_a_warm_re_plan_is_the_plan_of_a_table_built_from_scratch_with_the_jobs_draws():
    plan = compile_plan(SPEC, MODEL, CLOUD, 600, samples=SAMPLES)
    replanner = slow_replanner(plan)
    job = StageTable(SPEC, MODEL, CLOUD, samples=SAMPLES, seed=plan.seed)      # the compiled plan's table
    allocation, instances, spot = list(plan.allocation), list(plan.instances), [0] * 4
    now = 100.0
    for sync in (0, 1):
        found = replanner.replan(sync, now, allocation, instances, spot)
        assert found is not None, f"sync {sync}: the slow job was not re-planned"
        new, record = found
        held = HeldInstances(instances[sync], 0, CLOUD.instance_type)
        cold = plan_on_table(StageTable(remaining(sync + 1), replanner.corrected(), CLOUD, samples=SAMPLES,
                                        seed=plan.seed, draws=job.draws[sync + 1:], held_at_start=held),
                             plan.deadline_s - now, plan.policy)
        assert (new.allocation, new.instances) == (cold.allocation, cold.instances)
        np.testing.assert_array_equal(new.predicted.jct_s, cold.predicted.jct_s)
        np.testing.assert_array_equal(new.predicted.cost_usd, cold.predicted.cost_usd)
        # Fresh streams of the remaining stages (what the re-plan drew before) are other numbers.
        fresh = compile_plan(remaining(sync + 1), replanner.corrected(), CLOUD, plan.deadline_s - now,
                             samples=SAMPLES, seed=plan.seed, held_at_start=held)
        assert not np.array_equal(fresh.predicted.jct_s, new.predicted.jct_s)
        allocation[sync + 1:], instances[sync + 1:] = list(new.allocation), list(new.instances)
        now += 200.0      # stage 1 took 200 s: the plan misses again
        replanner.observe(1, 2, 2.0 + 2 * 40.0 * 1.5)


def test_the_replanner_searches_the_tail_of_its_table_and_keeps_it_for_the_next_sync():
    plan = compile_plan(SPEC, MODEL, CLOUD, 600, samples=SAMPLES)
    replanner = slow_replanner(plan)
    start = replanner.table
    assert start is not None and replanner.table_first == 0 and start.num_stages == 4
    assert replanner.replan(0, 100.0, list(plan.allocation), list(plan.instances), [0] * 4) is not None
    after_0 = replanner.table
    assert replanner.table_first == 1 and after_0.num_stages == 3
    assert all(mine is theirs for mine, theirs in zip(after_0.draws, start.draws[1:], strict=True))
    assert after_0.model == replanner.corrected() and after_0.held_at_start.count == plan.instances[0]
    # A reclaim's re-plan during stage 1, then its SYNC: both from the same kept table's stages 2..
    for trigger in ("reclaim in stage", "sync"):
        replanner.replan(1, 250.0, list(plan.allocation), list(plan.instances), [0] * 4, trigger=trigger)
        assert replanner.table_first == 2
        assert all(mine is theirs for mine, theirs in zip(replanner.table.draws, start.draws[2:], strict=True))


def test_a_plan_read_from_its_file_re_plans_warm_as_the_compiled_one():
    plan = compile_plan(SPEC, MODEL, CLOUD, 600, samples=SAMPLES)
    loaded = Plan.from_json(plan.to_json())
    args = (0, 100.0, list(plan.allocation), list(plan.instances), [0] * 4)
    (a, _), (b, _) = slow_replanner(plan).replan(*args), slow_replanner(loaded).replan(*args)
    assert slow_replanner(loaded).table is not None
    assert (a.allocation, a.instances) == (b.allocation, b.instances)
    np.testing.assert_array_equal(a.predicted.jct_s, b.predicted.jct_s)


def test_a_plan_over_several_types_re_plans_cold_through_compile_plan():
    catalog = CloudCatalog("aws", "us-east-1", {
        name: {"gpus_per_instance": g, "price_usd_per_hour": 3.0 * g, "gpu_model": "V100",
               "provision_latency_s": {"dist": "constant", "value": 5}, "init_latency_s": {"dist": "constant", "value": 20}}
        for name, g in (("p3.2xlarge", 1), ("p3.8xlarge", 4))}, {})
    model = MODEL.replace(measured_on={"gpu_model": "V100"})
    plan = compile_plan(SPEC, model, catalog, 600, samples=SAMPLES, instance_type="auto")
    replanner = Replanner(plan, model, samples=SAMPLES)
    if len(plan.type_clouds) > 1:
        assert replanner.table is None
    else:       # the search kept one type: its table is the plan's
        assert replanner.table is not None and replanner.table.cloud.instance_type == plan.instance_type


def reference(replanner: Replanner, plan: Plan, job: StageTable, sync: int, now: float) -> tuple | None:
    """The re-planning rule (module docstring of ``replan.py``) on the full search of the
    remaining stages' table with the job's draws: the allocation to switch to, or ``None``."""
    first, remaining_s = sync + 1, plan.deadline_s - now
    held = HeldInstances(plan.instances[sync], 0, CLOUD.instance_type)
    table = StageTable(remaining(first), replanner.corrected(), CLOUD, samples=SAMPLES, seed=plan.seed,
                       draws=job.draws[first:], held_at_start=held)
    old = table.simulate(plan.allocation[first:], plan.instances[first:])
    try:
        new = plan_on_table(table, remaining_s, plan.policy)
    except InfeasibleDeadlineError:
        new = None
    if new is not None and (new.allocation, new.instances) == (plan.allocation[first:], plan.instances[first:]):
        return None
    old_ok = old.mean_jct_s <= remaining_s + 0.02 * plan.deadline_s
    new_ok = new is not None and new.predicted.mean_jct_s <= remaining_s
    if not old_ok:
        return "must"          # the full search's own business: not cut
    if new_ok and old.mean_cost_usd - new.predicted.mean_cost_usd >= 0.10 * old.mean_cost_usd:
        return new.allocation
    return None


@pytest.mark.parametrize("pace", [0.5, 0.7, 0.9, 1.0, 1.2])
def test_the_cut_search_of_a_plan_that_keeps_its_promise_decides_as_the_full_one(pace):
    plan = compile_plan(SPEC, MODEL, CLOUD, 900, samples=SAMPLES)
    job = StageTable(SPEC, MODEL, CLOUD, samples=SAMPLES, seed=plan.seed)
    decided = []
    for now in (60.0, 120.0, 180.0):
        replanner = Replanner(plan, MODEL, samples=SAMPLES)
        for _ in range(8):
            replanner.observe(1, 2, 2.0 + 2 * 40.0 * pace)
        expected = reference(replanner, plan, job, 0, now)
        found = replanner.replan(0, now, list(plan.allocation), list(plan.instances), [0] * 4)
        if expected != "must":
            assert (found[0].allocation if found else None) == expected, (pace, now)
            decided.append(expected)
    assert decided, "no case where the plan kept its promise"
