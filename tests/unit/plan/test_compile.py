"""compile_plan: the advice of an infeasible deadline, and which instance types `auto` weighs."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import pytest

from rubberband import InfeasibleDeadlineError, ModelProfile
from rubberband import load_experiment as _load_experiment
from rubberband.errors import SpecError
from rubberband.plan import Plan, compile_plan
from rubberband.plan.compile import usable_profile

ROOT = Path(__file__).resolve().parents[3]
CIFAR = ROOT / "experiments" / "resnet101_cifar10.yaml"


@cache
def load_experiment(path: Path):
    return _load_experiment(path)


# --- infeasible deadlines ----------------------------------------------------------------------

def test_infeasible_under_confidence_names_the_deadline_that_meets_the_confidence():
    exp = load_experiment(CIFAR)
    args = dict(samples=200, seed=0, confidence=0.99)
    # The fastest plan's mean JCT (~451 s) is below 460 s, but its 99th percentile is not.
    with pytest.raises(InfeasibleDeadlineError, match=r"with probability 0\.99.*raise the deadline to at least \d+s") as info:
        compile_plan(exp.spec, exp.model, exp.cloud, 460.0, **args)
    err = info.value
    assert err.min_jct_s < 460.0 < err.needed_s
    needed = math.ceil(err.needed_s)
    assert f"at least {needed}s" in str(err)
    assert f"at least {err.min_jct_s:.0f}s" not in str(err)
    # The advice is exact for these samples: a second less is still infeasible.
    plan = compile_plan(exp.spec, exp.model, exp.cloud, float(needed), **args)
    assert plan.predicted.p_meet(needed) >= 0.99
    with pytest.raises(InfeasibleDeadlineError):
        compile_plan(exp.spec, exp.model, exp.cloud, math.floor(err.needed_s - 1e-9) - 0.5, **args)


def test_infeasible_mean_deadline_advice_is_rounded_up():
    exp = load_experiment(CIFAR)
    with pytest.raises(InfeasibleDeadlineError, match="shortest achievable JCT") as info:
        compile_plan(exp.spec, exp.model, exp.cloud, 300.0, samples=100)
    err = info.value
    assert err.needed_s == err.min_jct_s and err.confidence is None
    assert f"at least {math.ceil(err.min_jct_s)}s" in str(err)


# --- instance type `auto` ------------------------------------------------------------------------

def _catalog(exp):
    return exp.catalog.with_overrides(exp.cloud_overrides)


def test_auto_plans_one_gpu_trials_on_a_narrower_type_of_the_same_gpu_when_cheaper():
    exp = load_experiment(CIFAR)    # profiled on p3.8xlarge (4 V100s per instance)
    plan = compile_plan(exp.spec, exp.model, _catalog(exp), 5400.0, instance_type="auto", samples=100)
    # At 90 minutes one V100 per trial is fast enough, and p3.2xlarge sells V100s one at a time.
    assert plan.instance_type == "p3.2xlarge"
    assert set(plan.gpus_per_trial) == {1}
    wider = [c for c in plan.considered if c["instance_type"] != "p3.2xlarge" and "infeasible" not in c
             and c["policy"] == "optimal"]
    assert wider and all(plan.predicted.mean_cost_usd < c["cost_usd_mean"] for c in wider)
    # The plan is what the optimal planner finds on p3.2xlarge for the counts that fit there.
    alone = compile_plan(exp.spec, usable_profile(exp.model, 4, 1), exp.cloud_for("p3.2xlarge"), 5400.0, samples=100)
    assert alone.allocation == plan.allocation
    assert plan.predicted.mean_cost_usd == pytest.approx(alone.predicted.mean_cost_usd)
    assert plan.warnings == ()


def test_auto_never_spreads_a_trial_over_instances_narrower_than_the_profiled_ones():
    exp = load_experiment(CIFAR)
    plan = compile_plan(exp.spec, exp.model, _catalog(exp), 1200.0, instance_type="auto", samples=100, confidence=0.9)
    narrow = [c for c in plan.considered if c["instance_type"] == "p3.2xlarge"]
    # At 20 minutes the last stage needs more than one GPU: p3.2xlarge could only spread it over
    # 1-GPU instances, which the profile never measured.
    assert narrow and all("infeasible" in c for c in narrow)
    assert all(m <= plan.cloud.gpus_per_instance or plan.cloud.gpus_per_instance >= 4 for m in plan.gpus_per_trial)


def test_usable_profile_keeps_the_counts_that_fit_one_narrower_instance():
    model = ModelProfile.from_dict({"name": "m", "iter_latency_s": {
        1: {"dist": "normal", "mean": 8.0, "std": 0.8}, 4: {"dist": "normal", "mean": 2.5, "std": 0.3},
        8: {"dist": "normal", "mean": 1.5, "std": 0.2}}})
    assert usable_profile(model, 4, 4) is model and usable_profile(model, 4, 8) is model
    assert usable_profile(model, None, 1) is model          # where it was measured is unknown
    two = usable_profile(model, 4, 2)
    assert two.gpu_counts == (1, 2)
    assert two.latency(2).mean == pytest.approx(model.latency(2).mean)    # the log2 interpolation stays
    assert two.latency(2).std == pytest.approx(model.latency(2).std)
    assert usable_profile(model.replace(iter_latency_s={4: model.latency(4)}), 4, 2) is None


# --- warnings ------------------------------------------------------------------------------------

def test_a_profile_planned_on_another_gpu_model_warns():
    exp = load_experiment(CIFAR)
    plan = compile_plan(exp.spec, exp.model, _catalog(exp), 1200.0, instance_type="g5.12xlarge", samples=50)
    (warning,) = plan.warnings
    assert "measured on V100 GPUs (p3.8xlarge) but g5.12xlarge has A10G GPUs" in warning
    assert "\n" not in warning
    assert Plan.from_json(plan.to_json()).warnings == plan.warnings


def test_a_trial_spread_over_narrower_instances_than_profiled_warns():
    exp = load_experiment(CIFAR)
    plan = compile_plan(exp.spec, exp.model, _catalog(exp), 1200.0, instance_type="p3.2xlarge", samples=50)
    assert max(plan.gpus_per_trial) > 1
    (warning,) = plan.warnings
    assert "over" in warning and "p3.2xlarge instances" in warning and "likely optimistic" in warning


@pytest.mark.parametrize("instance_type", ["p3.8xlarge", "p3.16xlarge", "auto"])
def test_no_warning_on_the_profiled_gpu(instance_type):
    exp = load_experiment(CIFAR)
    assert compile_plan(exp.spec, exp.model, _catalog(exp), 1200.0, instance_type=instance_type, samples=50).warnings == ()


# --- max_instances: the room a cluster has ------------------------------------------------------

def test_max_instances_keeps_auto_and_market_auto_plans_within_each_type_s_room():
    exp = load_experiment(CIFAR)
    free = compile_plan(exp.spec, exp.model, _catalog(exp), 1500.0, instance_type="auto", samples=60, market="auto")
    caps = {name: 2 for name in _catalog(exp).types}
    plan = compile_plan(exp.spec, exp.model, _catalog(exp), 1500.0, instance_type="auto", samples=60, market="auto",
                        max_instances=caps)
    assert max(free.instances) > 2          # the cap binds
    assert max(plan.instances) <= 2 and plan.predicted.mean_jct_s <= 1500.0
    # On p3.8xlarge alone, 2 instances queue stage 0's trials: 1500 s is out of reach, 2400 s is not.
    with pytest.raises(InfeasibleDeadlineError, match="shortest achievable JCT"):
        compile_plan(exp.spec, exp.model, exp.cloud, 1500.0, samples=60, market="auto", max_instances=2)
    spot = compile_plan(exp.spec, exp.model, exp.cloud, 2400.0, samples=60, market="auto", max_instances=2)
    assert max(spot.instances) <= 2 and spot.predicted.mean_jct_s <= 2400.0


@pytest.mark.parametrize("value,match", [
    (0, r"max_instances: expected a positive number of instances, got 0"),
    (True, r"max_instances: expected a positive number"),
    ({"p3.8xlarg": 4}, r"max_instances\['p3.8xlarg'\]: no such instance type \(did you mean `p3.8xlarge`\?\)"),
    ({"p3.8xlarge": 2.5}, r"max_instances\['p3.8xlarge'\]: expected a positive number of instances, got 2.5"),
])
def test_bad_max_instances_is_one_line_naming_it(value, match):
    exp = load_experiment(CIFAR)
    with pytest.raises(SpecError, match=match):
        compile_plan(exp.spec, exp.model, exp.cloud, 3600.0, samples=10, max_instances=value)


def test_a_stage_that_cannot_run_within_max_instances_says_how_many_it_needs():
    exp = load_experiment(CIFAR)
    wide = exp.model.replace(iter_latency_s={g: d for g, d in exp.model.iter_latency_s.items() if g >= 8})
    least = exp.spec.stages[0].num_trials * 8 // exp.cloud.gpus_per_instance
    with pytest.raises(SpecError, match=rf"max_instances: stage 0 \(\d+ trials\) needs at least {least} p3.8xlarge "
                                        r"instances, more than the 1 allowed"):
        compile_plan(exp.spec, wide, exp.cloud, 3600.0, samples=10, max_instances=1)


def test_a_traced_zone_is_screened_within_max_instances_where_every_stage_queues():
    """The zone screen weighs the fastest plan of trials all at once; within 2 instances some
    stages can only queue, and the screen weighs their queues (it failed on no allocation)."""
    from rubberband.profiles.cloud import Market
    from rubberband.profiles.spot import SpotMarket, load_trace

    exp = load_experiment(CIFAR)
    traces = ROOT / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json"
    cloud = exp.cloud.replace(spot_price_usd_per_hour=0.3 * exp.cloud.price_usd_per_hour,
                              spot=SpotMarket(notice_s=120, trace=load_trace(traces, "us-west-2b"), trace_file=str(traces)))
    plan = compile_plan(exp.spec, exp.model, cloud, 3600.0, samples=40, market="auto", max_instances=2)
    assert max(plan.instances) <= 2 and plan.cloud.market in (Market.ON_DEMAND, Market.SPOT)
