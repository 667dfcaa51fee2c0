"""`--max-instances` on `plan` and `run`: the plan, and every re-plan of its run, keep within it."""

from __future__ import annotations

import json

import pytest

from .helpers import ROOT, assert_one_line_error, run

DEMO = str(ROOT / "experiments" / "demo.yaml")


def _plan(capsys, *argv: str) -> dict:
    code, out, err = run(capsys, "plan", DEMO, "--samples", "50", "--json", *argv)
    assert code == 0, err
    return json.loads(out)


def test_the_plan_keeps_within_max_instances_and_records_it(capsys):
    free = _plan(capsys, "--deadline", "40s")
    assert max(free["instances"]) > 2 and "max_instances" not in free["info"]
    capped = _plan(capsys, "--deadline", "55s", "--max-instances", "2")
    assert max(capped["instances"]) == 2 and capped["info"]["max_instances"] == 2
    assert capped["predicted"]["jct_s_mean"] <= 55
    by_type = _plan(capsys, "--deadline", "55s", "--max-instances", "local.1gpu=2,local.2gpu=1")
    assert by_type["instances"] == capped["instances"] and by_type["info"]["max_instances"] == {"local.1gpu": 2, "local.2gpu": 1}


def test_the_fastest_plan_an_infeasible_deadline_names_is_the_fastest_within_max_instances(capsys):
    code, _, err = run(capsys, "plan", DEMO, "--samples", "50", "--deadline", "1s", "--max-instances", "1")
    assert code == 2
    assert_one_line_error(err, "no plan meets the deadline of 1s", "allocation 1,1,1,1,1")


@pytest.mark.parametrize("value, needles", [
    ("0", ["--max-instances", "positive number of instances", "'0'"]),
    ("two", ["--max-instances", "positive number of instances", "'two'"]),
    ("local.1gpu=x", ["--max-instances", "TYPE=COUNT", "'local.1gpu=x'"]),
    ("local.1gpu=0", ["--max-instances", "TYPE=COUNT", "positive COUNT"]),
    ("local.9gpu=2", ["max_instances['local.9gpu']", "no such instance type", "local.1gpu"]),
])
def test_a_bad_max_instances_is_one_line_naming_it(capsys, value, needles):
    code, out, err = run(capsys, "plan", DEMO, "--samples", "50", "--max-instances", value)
    assert code == 2 and out == ""
    assert_one_line_error(err, *needles)


def test_run_plans_within_max_instances(capsys, no_execution):
    run(capsys, "run", DEMO, "--samples", "50", "--deadline", "55s", "--max-instances", "2", "--json")
    (plan,) = no_execution
    assert max(plan.instances) <= 2 and plan.info["max_instances"] == 2


@pytest.mark.parametrize("given", [["--allocation", "2,2,2,2,1"], ["--plan", "plan.json"]])
def test_max_instances_with_a_plan_made_already_is_refused(capsys, no_execution, given):
    code, out, err = run(capsys, "run", DEMO, *given, "--max-instances", "2")
    assert code == 2 and out == ""
    assert_one_line_error(err, "--max-instances: only used when run plans the job", f"drop {given[0]}")
    assert no_execution == []

