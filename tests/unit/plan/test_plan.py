"""Plan files: `Plan.from_json` checks every field's shape, `check_plan` checks a plan against the
experiment it is to run (DESIGN §4) and predicts it again."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from rubberband import SpecError
from rubberband import load_experiment as _load_experiment
from rubberband.plan import Plan, check_plan, compile_plan, plan_allocation
from rubberband.simulator import simulate

ROOT = Path(__file__).resolve().parents[3]
CIFAR = ROOT / "experiments" / "resnet101_cifar10.yaml"


@cache
def load_experiment(path: Path):
    return _load_experiment(path)


@cache
def _plan_json() -> str:
    exp = load_experiment(CIFAR)
    return compile_plan(exp.spec, exp.model, exp.cloud, 1200.0, samples=100, seed=0).to_json()


def plan_dict() -> dict:
    return json.loads(_plan_json())


def edited(**changes) -> str:
    data = plan_dict()
    data.update(changes)
    return json.dumps(data)


def check(text: str) -> Plan:
    exp = load_experiment(CIFAR)
    return check_plan(Plan.from_json(text), exp.spec, exp.model, exp.catalog.with_overrides(exp.cloud_overrides))


# --- Plan.from_json: the shape of every field ---------------------------------------------------

@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("[1, 2]", r"^plan: expected a JSON object .* got a list"),
        ("{not json", r"^plan: not a JSON plan"),
        ('"plan"', r"^plan: expected a JSON object"),
        (edited(allocation=[32, 20, 12]), r"^plan\.allocation: expected a list of 4 integers, one per stage"),
        (edited(allocation=[-32, 20, 12, 8]), r"^plan\.allocation\[0\]: must be at least 1, got -32"),
        (edited(allocation=["32", 20, 12, 8]), r"^plan\.allocation\[0\]: expected an integer, got '32'"),
        (edited(allocation="32,20,12,8"), r"^plan\.allocation: expected a list of 4 integers"),
        (edited(instances=[8, 5, 3, 0]), r"^plan\.instances\[3\]: must be at least 1, got 0"),
        (edited(gpus_per_trial=[1, 2, 4, 2.5]), r"^plan\.gpus_per_trial\[3\]: expected an integer, got 2\.5"),
        (edited(stages=[]), r"^plan\.stages: expected a non-empty list"),
        (edited(stages=[[32, 1], [10, 3], [3, 9], [1]]), r"^plan\.stages\[3\]: expected \[num_trials, iters\]"),
        (edited(deadline_s=-5), r"^plan\.deadline_s: must be greater than 0"),
        (edited(confidence=1.5), r"^plan\.confidence: must be between 0 and 1"),
        (edited(seed=-1), r"^plan\.seed: must be at least 0"),
        (edited(policy=3), r"^plan\.policy: expected a policy name"),
        (edited(warnings="careful"), r"^plan\.warnings: expected a list of strings"),
        (edited(allocaton=[1]), r"^plan\.allocaton: unknown key \(did you mean `allocation`\?\)"),
    ],
)
def test_malformed_plan_files_are_one_line_naming_the_field(text, pattern):
    with pytest.raises(SpecError, match=pattern):
        Plan.from_json(text)


@pytest.mark.parametrize("key", ["jct_s", "cost_usd"])
def test_a_plan_with_empty_predictions_is_an_error_not_a_numpy_warning(key, recwarn):
    data = plan_dict()
    data["predicted"][key] = []
    with pytest.raises(SpecError, match=rf"^plan\.predicted\.{key}: expected a non-empty list"):
        Plan.from_json(json.dumps(data))
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_a_plan_missing_a_field_names_it():
    data = plan_dict()
    del data["instances"]
    with pytest.raises(SpecError, match=r"^plan\.instances: missing required field"):
        Plan.from_json(json.dumps(data))


def test_a_plan_without_a_deadline_round_trips():
    exp = load_experiment(CIFAR)
    plan = plan_allocation(exp.spec, (32, 20, 12, 8), exp.model, exp.cloud, math.inf, samples=20)
    assert Plan.from_json(plan.to_json()).deadline_s == math.inf


def test_warnings_round_trip():
    data = plan_dict()
    data["warnings"] = ["profile measured on V100, planned on A10G"]
    assert Plan.from_json(json.dumps(data)).warnings == ("profile measured on V100, planned on A10G",)


# --- check_plan: the plan against the experiment ------------------------------------------------

@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        # One instance cannot hold 32 one-GPU trials on 4-GPU instances (DESIGN §4).
        ({"instances": [1, 1, 1, 1]}, r"^plan\.instances\[0\]: 1 cannot hold stage 0; it needs at least 8"),
        ({"allocation": [33, 20, 12, 8], "instances": [8, 5, 3, 2]}, r"^plan\.allocation\[0\]: 33 GPUs do not fit"),
        ({"allocation": [32, 20, 12, 64], "gpus_per_trial": [1, 2, 4, 64], "instances": [8, 5, 3, 16]},
         r"^plan\.allocation\[3\]: 64 GPUs for 1 trials is outside the valid range 1\.\.32"),
        ({"stages": [[32, 1], [10, 3], [3, 9], [1, 38]]},
         r"^plan\.stages: the plan is for 4 stages: 32x1 10x3 3x9 1x38 but the experiment has 4 stages: 32x1 10x3 3x9 1x37"),
        ({"gpus_per_trial": [1, 2, 4, 4]}, r"^plan\.gpus_per_trial: \[1, 2, 4, 4\] is not what allocation"),
    ],
)
def test_plans_that_do_not_fit_the_experiment_are_rejected(changes, pattern):
    data = plan_dict()
    data.update(changes)
    with pytest.raises(SpecError, match=pattern):
        check(json.dumps(data))


def test_a_plan_on_a_type_outside_the_experiments_catalog_is_rejected():
    data = plan_dict()
    data["cloud"]["instance_type"] = "p9.mega"
    data["instance_types"] = ["p9.mega"] * len(data["instance_types"])    # the file names each stage's type
    with pytest.raises(SpecError, match=r"^plan\.cloud\.instance_type: 'p9\.mega' is not in the experiment's cloud profile"):
        check(json.dumps(data))


def test_a_plan_on_another_type_than_a_single_profile_is_rejected():
    exp = load_experiment(CIFAR)
    plan = Plan.from_json(_plan_json())
    with pytest.raises(SpecError, match=r"^plan\.cloud\.instance_type: the plan is for p3\.8xlarge but the experiment runs on p3\.2xlarge"):
        check_plan(plan, exp.spec, exp.model, exp.cloud_for("p3.2xlarge"))


def test_the_prediction_is_recomputed_not_read_from_the_file():
    exp = load_experiment(CIFAR)
    data = plan_dict()
    # An edited but valid plan: another allocation, with the old (now wrong) prediction and a
    # made-up price in the file.
    data.update(allocation=[32, 20, 12, 16], gpus_per_trial=[1, 2, 4, 16], instances=[8, 5, 3, 4])
    data["predicted"]["jct_s"] = [1.0] * 100
    data["predicted"]["cost_usd"] = [0.01] * 100
    data["cloud"]["price_usd_per_hour"] = 0.001
    plan = check(json.dumps(data))
    expected = simulate(exp.spec, (32, 20, 12, 16), exp.model, exp.cloud, samples=100, seed=0, instances=(8, 5, 3, 4))
    np.testing.assert_array_equal(plan.predicted.jct_s, expected.jct_s)
    np.testing.assert_array_equal(plan.predicted.cost_usd, expected.cost_usd)
    assert plan.cloud.price_usd_per_hour == exp.cloud.price_usd_per_hour
    assert plan.allocation == (32, 20, 12, 16) and plan.instances == (8, 5, 3, 4)


def test_an_unedited_plan_checks_to_the_same_prediction():
    original = Plan.from_json(_plan_json())
    plan = check(_plan_json())
    assert plan.allocation == original.allocation and plan.instances == original.instances
    np.testing.assert_allclose(plan.predicted.jct_s, original.predicted.jct_s, atol=1e-4)
    np.testing.assert_allclose(plan.predicted.cost_usd, original.predicted.cost_usd, atol=1e-6)


# --- simulate_plan and spot instances in plan files (DESIGN §4.1) ----------------------------
def test_simulate_plan_replays_the_plan_s_own_prediction_and_checks_it_out_of_sample():
    from rubberband.plan import simulate_plan

    exp = load_experiment(CIFAR)
    plan = compile_plan(exp.spec, exp.model, exp.cloud, 1200.0, samples=200, seed=4)
    again = simulate_plan(plan, exp.model)
    assert np.array_equal(again.jct_s, plan.predicted.jct_s) and np.array_equal(again.cost_usd, plan.predicted.cost_usd)
    other = simulate_plan(plan, exp.model, samples=2000, seed=99)
    assert other.samples == 2000
    assert other.mean_jct_s == pytest.approx(plan.predicted.mean_jct_s, rel=0.02)


def test_a_spot_plan_says_which_instances_are_spot_and_survives_its_json():
    from rubberband.plan import simulate_plan
    from rubberband.profiles.cloud import Market
    from rubberband.profiles.spot import SpotMarket

    exp = load_experiment(CIFAR)
    cloud = exp.cloud.replace(market=Market.SPOT, spot=SpotMarket(notice_s=120, rate_per_hour=0.5))
    plan = plan_allocation(exp.spec, (32, 20, 12, 8), exp.model, cloud, 1200.0, samples=200, seed=1)
    assert plan.spot_counts == plan.instances
    data = json.loads(plan.to_json())
    assert data["spot_instances"] == list(plan.instances)
    # The file says each stage's market too (issue #22): an edit of the spot instances keeps it.
    mixed = Plan.from_dict({**data, "spot_instances": [8, 0, 0, 0], "markets": ["spot"] + ["on-demand"] * 3})
    assert mixed.spot_counts == (8, 0, 0, 0)
    replayed = simulate_plan(mixed, exp.model, samples=200, seed=1)
    assert replayed.stages[0].spot_instances == 8 and replayed.stages[1].spot_instances == 0
    assert sum(s.mean_reclaims for s in replayed.stages[1:]) == 0


@pytest.mark.parametrize(("spot", "pattern"), [([1, 2], r"plan\.spot_instances: expected a list of 4 integers"),
                                               ([-1, 0, 0, 0], r"plan\.spot_instances\[0\]: must be at least 0")])
def test_bad_spot_counts_in_a_plan_file_name_the_field(spot, pattern):
    with pytest.raises(SpecError, match=pattern):
        Plan.from_json(edited(spot_instances=spot))


def test_a_plan_made_in_another_zone_checks_in_its_own_zone():
    # The experiment replays us-west-2a; a plan made with --zone keeps its zone's trace and price.
    from rubberband.plan.zones import plan_zones

    exp = load_experiment(ROOT / "experiments" / "resnet101_spot.yaml")
    catalog = exp.catalog.with_overrides(exp.cloud_overrides)
    assert exp.cloud.spot.trace.zone == "us-west-2a"
    made = plan_zones(exp.spec, exp.model_for_planning, catalog, 7200, ["us-west-2b"], instance_type=exp.instance_type,
                      market="spot", samples=40, seed=3)
    checked = check_plan(Plan.from_json(made.to_json()), exp.spec, exp.model_for_planning, catalog)
    assert checked.cloud.spot.trace.zone == "us-west-2b"
    assert checked.cloud.spot_price_usd_per_hour == made.cloud.spot_price_usd_per_hour
    np.testing.assert_allclose(checked.predicted.jct_s, made.predicted.jct_s, atol=1e-4)
    np.testing.assert_allclose(checked.predicted.cost_usd, made.predicted.cost_usd, atol=1e-6)


def test_a_plan_on_a_gpu_model_the_experiment_has_no_profile_for_names_the_field():
    exp = load_experiment(CIFAR)
    plan = Plan.from_json(_plan_json())
    with pytest.raises(SpecError, match=r"^plan\.cloud\.instance_type: p3\.8xlarge has V100 GPUs but the model profiles "
                                        r"cover A10G only; add a V100 profile"):
        check_plan(plan, exp.spec, {"A10G": exp.model}, exp.catalog.with_overrides(exp.cloud_overrides))


def test_a_plan_from_instances_held_at_the_start_keeps_them_through_its_json():
    """A re-plan's ``held_at_start`` is part of the plan: its prediction, ``simulate_plan`` and a
    plan file read back all start from the instances held."""
    from rubberband.plan import simulate_plan
    from rubberband.simulator import HeldInstances

    exp = load_experiment(CIFAR)
    plan = compile_plan(exp.spec, exp.model, exp.cloud, 1200.0, samples=100, seed=2, held_at_start=6)
    assert plan.held_at_start == HeldInstances(6, 0, exp.cloud.instance_type)
    assert plan.predicted.stages[0].new_instances == max(0, plan.instances[0] - 6)
    again = Plan.from_json(plan.to_json())
    assert again.held_at_start == plan.held_at_start
    for replay in (simulate_plan(plan, exp.model), simulate_plan(again, exp.model)):
        assert np.array_equal(replay.jct_s, plan.predicted.jct_s) and np.array_equal(replay.cost_usd, plan.predicted.cost_usd)
    fresh = simulate(exp.spec, plan.allocation, exp.model, exp.cloud, samples=100, seed=2, instances=plan.instances)
    assert fresh.mean_jct_s > plan.predicted.mean_jct_s


def test_a_plan_from_instances_held_cannot_start_a_run():
    exp = load_experiment(CIFAR)
    plan = compile_plan(exp.spec, exp.model, exp.cloud, 1200.0, samples=50, seed=0, held_at_start=4)
    with pytest.raises(SpecError, match=r"^plan\.held_at_start: the plan starts from 4 instances held .* a run starts "
                                        r"with none; plan it again"):
        check(plan.to_json())


@pytest.mark.parametrize(("held", "pattern"), [
    ({"count": 2, "spot": 3}, r"^plan\.held_at_start\.spot: 3 spot instances of 2 held; at most 2"),
    ({"count": -1}, r"^plan\.held_at_start\.count: must be at least 0"),
    ({"spot": 1}, r"^plan\.held_at_start\.count: missing required field"),
])
def test_bad_held_instances_in_a_plan_file_name_the_field(held, pattern):
    with pytest.raises(SpecError, match=pattern):
        Plan.from_json(edited(held_at_start=held))
