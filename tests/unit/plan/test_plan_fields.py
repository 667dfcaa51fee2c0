"""A plan says its per-stage fields once per stage (issue #22): ``plan.json`` lists each stage's
instance type, market, spot instances and trials per GPU, whatever the plan, and plan files
written before (empty lists for "the cloud's one type", "no packing") still load and run."""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path

import pytest

from rubberband import SpecError
from rubberband import load_experiment as _load_experiment
from rubberband.plan import Plan, check_plan, plan_allocation, simulate_plan

ROOT = Path(__file__).resolve().parents[3]
CIFAR = ROOT / "experiments" / "resnet101_cifar10.yaml"
# Written by round 3's planner (``plan_allocation(spec, (32, 20, 12, 8), ..., samples=4)``):
# ``instance_types`` and ``trials_per_gpu`` are empty lists there.
ROUND3 = Path(__file__).parent / "data" / "plan-round3-one-type.json"


@cache
def experiment():
    return _load_experiment(CIFAR)


@cache
def one_type_plan() -> Plan:
    exp = experiment()
    return plan_allocation(exp.spec, (32, 20, 12, 8), exp.model, exp.cloud, 1200.0, samples=4)


def spot_plan(spot: tuple[int, ...]) -> Plan:
    cloud = experiment().cloud.replace(spot_price_usd_per_hour=4.0)
    return dataclasses.replace(one_type_plan(), cloud=cloud, spot_instances=spot)


def test_a_one_type_plan_file_names_every_stages_type_market_and_packing():
    plan = one_type_plan()
    data = plan.to_dict()
    n = len(plan.allocation)
    assert plan.instance_types == () and plan.trials_per_gpu == ()      # the plan's own compact fields
    assert data["instance_types"] == [plan.cloud.instance_type] * n
    assert data["trials_per_gpu"] == [1] * n
    assert data["spot_instances"] == [0] * n
    assert data["markets"] == ["on-demand"] * n
    assert plan.stage_types == (plan.cloud.instance_type,) * n and plan.markets == ("on-demand",) * n


def test_markets_say_spot_on_demand_or_mixed_per_stage():
    plan = spot_plan((8, 0, 1, 2))
    assert plan.instances == (8, 5, 3, 2)
    assert plan.markets == ("spot", "on-demand", "mixed", "spot")
    assert plan.to_dict()["markets"] == ["spot", "on-demand", "mixed", "spot"]


def test_a_plan_file_reads_back_as_the_plan_it_was():
    for plan in (one_type_plan(), spot_plan((8, 0, 1, 2))):
        back = Plan.from_json(plan.to_json())
        assert (back.instance_types, back.trials_per_gpu, back.type_clouds) == ((), (), {})
        args, again = back.simulation_args(), plan.simulation_args()
        assert back.spot_counts == plan.spot_counts          # a file always lists them: the same instances
        assert {**args, "spot_instances": None} == {**again, "spot_instances": None}
        written, again = json.loads(plan.to_json()), back.to_dict()
        assert {k: v for k, v in again.items() if k != "predicted"} == {k: v for k, v in written.items() if k != "predicted"}


def test_a_plan_file_written_before_still_loads_checks_and_simulates():
    text = ROUND3.read_text()
    old = json.loads(text)
    assert old["instance_types"] == [] and old["trials_per_gpu"] == [] and "markets" not in old
    plan = Plan.from_json(text)
    assert plan.allocation == (32, 20, 12, 8) and plan.stage_types == (old["cloud"]["instance_type"],) * 4
    exp = experiment()
    checked = check_plan(plan, exp.spec, exp.model, exp.catalog.with_overrides(exp.cloud_overrides), samples=4)
    assert simulate_plan(checked, exp.model, samples=4).allocation == plan.allocation
    data = checked.to_dict()
    assert data["instance_types"] == [old["cloud"]["instance_type"]] * 4 and data["markets"] == ["on-demand"] * 4


def test_a_market_that_disagrees_with_the_spot_instances_names_both():
    data = spot_plan((8, 0, 1, 2)).to_dict()
    data["markets"][1] = "spot"
    with pytest.raises(SpecError, match=r"^plan\.markets\[1\]: says 'spot' but spot_instances\[1\] puts 0 of the "
                                         r"stage's 5 instances on spot, which is 'on-demand'; make them agree"):
        Plan.from_json(json.dumps(data))
    data["markets"] = ["spot"]
    with pytest.raises(SpecError, match=r"^plan\.markets: expected 4 markets, one per stage"):
        Plan.from_json(json.dumps(data))


def test_one_type_for_every_stage_must_be_the_clouds():
    data = one_type_plan().to_dict()
    data["instance_types"] = ["p3.2xlarge"] * 4
    with pytest.raises(SpecError, match=r"^plan\.instance_types: says p3\.2xlarge for every stage but "
                                         r"plan\.cloud\.instance_type is p3\.8xlarge; make them the same"):
        Plan.from_json(json.dumps(data))
