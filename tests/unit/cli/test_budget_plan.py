"""`rubberband plan --budget`: the shortest JCT within a budget, its table, JSON and one-line errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from .helpers import assert_one_line_error, run

ROOT = Path(__file__).resolve().parents[3]
CIFAR = str(ROOT / "experiments" / "resnet101_cifar10.yaml")


def plan_json(capsys, *argv: str) -> dict:
    code, out, err = run(capsys, "plan", CIFAR, "--json", "--samples", "200", *argv)
    assert code == 0, err
    return json.loads(out)


def test_plan_budget_at_the_deadline_optimal_cost_meets_that_deadline(capsys):
    # The check: C = the cost of the cheapest plan for the 20-minute deadline.
    optimal = plan_json(capsys, "--deadline", "20m")
    cost = optimal["predicted"]["cost_usd_mean"]
    plan = plan_json(capsys, "--budget", repr(cost))
    assert plan["predicted"]["jct_s_mean"] <= 1200.0
    assert plan["predicted"]["cost_usd_mean"] <= cost
    assert plan["info"]["budget_usd"] == cost


def test_plan_budget_prints_the_budget_line_and_the_deadlines_probed(capsys):
    code, out, err = run(capsys, "plan", CIFAR, "--samples", "200", "--budget", "15")
    assert code == 0, err
    assert "budget $15.00 (mean cost): shortest mean JCT 16m51s, mean cost $14.83" in out
    assert "deadlines probed (the cheapest plan at each)" in out and "none (cheapest)" in out
    assert "considered plans" not in out and "note:" not in out
    code, out, err = run(capsys, "plan", CIFAR, "--samples", "200", "--budget", "15", "--confidence", "0.9")
    assert code == 0, err
    assert "budget $15.00 (P(cost <= budget) >= 0.9)" in out and "cost p90" in out


def test_plan_budget_with_a_deadline_meets_both(capsys):
    plan = plan_json(capsys, "--budget", "14", "--deadline", "20m")
    assert plan["deadline_s"] == 1200.0 and plan["predicted"]["jct_s_mean"] <= 1200.0
    assert plan["predicted"]["cost_usd_mean"] <= 14.0
    # Without --deadline the experiment's 20 minutes are no constraint: $13 buys a slower plan.
    assert plan_json(capsys, "--budget", "13")["predicted"]["jct_s_mean"] > 1200.0


def test_plan_budget_without_a_deadline_promises_none_and_runs(capsys, tmp_path):
    # Before: "deadline 17m42s ... P(JCT <= 17m42s)", a search probe shown and stored as the deadline.
    out_file = tmp_path / "plan.json"
    code, out, err = run(capsys, "plan", CIFAR, "--samples", "200", "--budget", "15", "--out", str(out_file))
    assert code == 0, err
    assert out.splitlines()[0].endswith(", no deadline") and "P(JCT <=" not in out
    assert json.loads(out_file.read_text())["deadline_s"] == math.inf
    # The plan runs as written: no deadline to keep, so no re-planning and no safety net.
    code, out, err = run(capsys, "run", CIFAR, "--plan", str(out_file), "--provider", "sim")
    assert code == 0, err
    assert "rehearsal (sim, seed 0): no deadline to meet; 0 spot reclaim(s), 0 re-plan(s)" in out
    assert "P(JCT <=" not in out and "deadline inf" not in out
    code, out, err = run(capsys, "run", CIFAR, "--plan", str(out_file), "--provider", "sim", "--repeat", "2")
    assert code == 0, err
    assert "2 rehearsals" in out and "P(JCT <=" not in out
    code, out, err = run(capsys, "run", CIFAR, "--plan", str(out_file), "--provider", "sim", "--json")
    assert code == 0, err
    assert json.loads(out)["deadline_s"] == math.inf


@pytest.mark.parametrize(("argv", "needles"), [
    (["--budget", "0"], ["--budget: expected a positive amount of dollars"]),
    (["--budget", "-3"], ["--budget: expected a positive amount of dollars"]),
    (["--budget", "5"], ["--budget: $5.00 is below the cheapest possible run, which costs $12.05",
                         "allocation 4,4,3,4 on p3.8xlarge", "raise the budget to at least $12.06"]),
    (["--budget", "13", "--deadline", "10m"], ["--budget: $13.00 is below the cheapest plan that meets the deadline "
                                               "of 10m00s"]),
])
def test_bad_budgets_are_one_line(capsys, argv, needles):
    code, _, err = run(capsys, "plan", CIFAR, "--samples", "200", *argv)
    assert code != 0
    assert_one_line_error(err, *needles)


def test_plan_budget_with_zones_chooses_a_zone_at_every_probe(capsys, tmp_path):
    from .test_plan_types import TRACES, profile

    path = tmp_path / "zones.yaml"
    path.write_text(f"""
sha: {{num_trials: 8, min_iters: 2, max_iters: 8, eta: 2}}
model_profile: {profile(tmp_path, measured_on="instance_type: p3.2xlarge")}
cloud:
  profile: {ROOT / 'cloud_profiles' / 'aws' / 'us-west-2.yaml'}
  instance_type: p3.2xlarge
  overrides: {{spot: {{notice_s: 120, preemption: {{trace: {{file: {TRACES}, zone: us-west-2a}}}}}}}}
deadline: 2h
samples: 30
""")
    code, out, err = run(capsys, "plan", str(path), "--zone", "us-west-2a,us-west-2b", "--json")
    assert code == 0, err
    by_deadline = json.loads(out)
    cost = by_deadline["predicted"]["cost_usd_mean"]
    code, out, err = run(capsys, "plan", str(path), "--zone", "us-west-2a,us-west-2b", "--budget", repr(cost), "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["info"]["zone"] in ("us-west-2a", "us-west-2b") and plan["info"]["budget_usd"] == cost
    assert plan["predicted"]["cost_usd_mean"] <= cost and plan["predicted"]["jct_s_mean"] <= 7200.0
    assert plan["cloud"]["market"] == "spot"           # zones differ in their spot markets: planned on spot
