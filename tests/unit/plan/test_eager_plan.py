"""Planning a surrogate job whose target starts early (DESIGN §4.6: ``compile.eager_plan``)."""

from __future__ import annotations

import numpy as np
import pytest

from rubberband import ExperimentSpec, ModelProfile, SpecError
from rubberband.errors import InfeasibleDeadlineError
from rubberband.plan import compile_plan, simulate_plan
from rubberband.plan.compile import peak_instances
from rubberband.plan.plan import Plan
from rubberband.profiles import Constant, Normal
from rubberband.simulator import simulate
from rubberband.spec.experiment import EagerTransfer
from rubberband.testing.builders import cloud_profile

SURROGATE = ModelProfile({1: Normal(0.5, 0.05), 2: Normal(0.3, 0.03)}, Constant(2.0), Constant(1.0), name="w/8")
TARGET = ModelProfile({1: Normal(8.0, 0.8), 2: Normal(4.5, 0.4), 4: Normal(2.5, 0.2)}, Constant(20.0), Constant(3.0),
                      name="full")
CLOUD = cloud_profile("t.4gpu", 4, 36.0, provision_s=10.0, init_s=5.0, minimum_s=0.0)
TUNING = ExperimentSpec.sha(8, 20, 80, 2)
EAGER = TUNING.with_target(100, EagerTransfer(0, 0.5))


def test_the_plan_is_the_sequential_optimum_simulated_with_the_target_started_early():
    seq = compile_plan(EAGER.without_eager(), SURROGATE, CLOUD, 2000, samples=300, seed=4, target_model=TARGET)
    plan = compile_plan(EAGER, SURROGATE, CLOUD, 2000, samples=300, seed=4, target_model=TARGET)
    assert plan.allocation == seq.allocation and plan.instances == seq.instances and plan.spec == EAGER
    again = simulate(EAGER, plan.allocation, SURROGATE, CLOUD, samples=300, seed=4, instances=plan.instances,
                     target_model=TARGET)
    assert np.array_equal(plan.predicted.jct_s, again.jct_s) and np.array_equal(plan.predicted.cost_usd, again.cost_usd)
    info = plan.info["eager_transfer"]
    assert info["after_stage"] == 0 and info["restart_probability"] == 0.5
    assert info["sequential_jct_s_mean"] == pytest.approx(seq.predicted.mean_jct_s)
    assert info["sequential_cost_usd_mean"] == pytest.approx(seq.predicted.mean_cost_usd)
    # The overlap saves time and the target's own instance costs money.
    assert plan.predicted.mean_jct_s < seq.predicted.mean_jct_s and plan.predicted.mean_cost_usd > seq.predicted.mean_cost_usd


def test_a_plan_file_keeps_the_eager_transfer_and_re_simulates_to_its_prediction():
    plan = compile_plan(EAGER, SURROGATE, CLOUD, 2000, samples=200, seed=1, target_model=TARGET)
    back = Plan.from_json(plan.to_json())
    assert back.spec == EAGER and back.spec.eager == EagerTransfer(0, 0.5)
    sim = simulate_plan(back, SURROGATE, target_model=TARGET)
    assert sim.mean_jct_s == pytest.approx(plan.predicted.mean_jct_s) and \
        sim.mean_cost_usd == pytest.approx(plan.predicted.mean_cost_usd)
    data = plan.to_dict()
    data["eager_transfer"] = {"after_stage": 0}
    with pytest.raises(SpecError, match=r"plan.eager_transfer.restart_probability: missing"):
        Plan.from_dict(data)


def test_the_target_counts_against_max_instances_beside_the_stages_it_overlaps():
    plan = compile_plan(EAGER, SURROGATE, CLOUD, 2000, samples=100, target_model=TARGET, max_instances=2)
    assert max(plan.instances) <= 2
    with pytest.raises(SpecError, match=r"max_instances: with the target started early its 1 instance\(s\) run "
                                        r"beside stage 1's 1, 2 t.4gpu in all, over the limit of 1"):
        compile_plan(EAGER, SURROGATE, CLOUD, 2000, samples=100, target_model=TARGET, max_instances=1)


def test_a_plan_over_max_instances_at_the_deadline_gives_way_to_one_within_it():
    # A 1-GPU type: the sequential optimum at the deadline runs the target beside stage 1 on more
    # instances than the limit; a plan of the search's other candidates keeps within it.
    cloud = cloud_profile("t.1gpu", 1, 9.0, provision_s=10.0, init_s=5.0, minimum_s=0.0)
    plan = compile_plan(EAGER, SURROGATE, cloud, 500, samples=50, target_model=TARGET, max_instances=5)
    assert all(n <= 5 for n in [*peak_instances(plan).values(), *plan.instances])
    assert plan.predicted.mean_jct_s <= 500


def test_a_deadline_met_only_with_the_target_after_the_tuning_is_infeasible_eagerly():
    # A short target: run eagerly it waits for a new instance's SCALE and INIT (15 s), which the
    # sequential job does not (it trains on the instance the last stage held).
    spec = ExperimentSpec.sha(8, 20, 80, 2).with_target(2, EagerTransfer(1, 0.0))
    with pytest.raises(InfeasibleDeadlineError) as fastest:
        compile_plan(spec.without_eager(), SURROGATE, CLOUD, 1, samples=100, target_model=TARGET)
    deadline = fastest.value.min_jct_s + 1.0
    compile_plan(spec.without_eager(), SURROGATE, CLOUD, deadline, samples=100, target_model=TARGET)
    with pytest.raises(InfeasibleDeadlineError, match=r"with the target started early"):
        compile_plan(spec, SURROGATE, CLOUD, deadline, samples=100, target_model=TARGET)


def test_spot_is_refused_with_the_flag_to_plan_on_demand():
    spot = CLOUD.replace(spot_price_usd_per_hour=12.0)
    with pytest.raises(SpecError, match=r"market: the plan holds spot instances .*--market on-demand"):
        compile_plan(EAGER, SURROGATE, spot, 2000, samples=50, target_model=TARGET, market="spot")


# --- against brute force: the search's stated tolerance (DESIGN §4.6) ----------------------------------
S_NOISY = ModelProfile({1: Normal(0.5, 0.1), 2: Normal(0.3, 0.06), 4: Normal(0.2, 0.04)}, Constant(2.0), Constant(1.0),
                       name="s")
T_NOISY = ModelProfile({1: Normal(8.0, 0.8), 2: Normal(4.5, 0.4), 4: Normal(2.5, 0.2), 8: Normal(1.5, 0.15)},
                       Constant(20.0), Constant(3.0), name="t")


@pytest.mark.parametrize(("gpus", "price", "minimum", "tuning", "iters", "after", "p"), [
    (4, 36.0, 60.0, ExperimentSpec.sha(8, 20, 80, 2), 100, 0, 0.5),
    (2, 7.0, 0.0, ExperimentSpec.sha(9, 10, 90, 3), 60, 0, 0.5),
    (2, 7.0, 0.0, ExperimentSpec.sha(9, 10, 90, 3), 60, 1, 0.0),
])
def test_the_eager_plan_costs_within_eight_percent_of_the_cheapest_of_all(gpus, price, minimum, tuning, iters,
                                                                        after, p):
    import itertools

    from rubberband.plan.table import valid_allocations

    cloud = cloud_profile("t", gpus, price, provision_s=Normal(20.0, 4.0), init_s=Normal(15.0, 3.0), minimum_s=minimum)
    spec = tuning.with_target(iters, EagerTransfer(after, p))
    every = []
    for a in itertools.product(*[valid_allocations(s.num_trials, T_NOISY if s.target else S_NOISY, gpus)
                                 for s in spec.stages]):
        try:
            sim = simulate(spec, a, S_NOISY, cloud, samples=100, target_model=T_NOISY)
        except SpecError:
            continue
        every.append((sim.mean_jct_s, sim.mean_cost_usd))
    times = sorted(t for t, _ in every)
    for deadline in np.quantile(times, [0.1, 0.3, 0.6]):
        cheapest = min(c for t, c in every if t <= deadline)
        plan = compile_plan(spec, S_NOISY, cloud, deadline, samples=100, target_model=T_NOISY)
        assert plan.predicted.mean_jct_s <= deadline and plan.predicted.mean_cost_usd <= cheapest * 1.08
