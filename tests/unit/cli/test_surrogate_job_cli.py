"""`plan`, `simulate`, `run` and `whatif --surrogate-ratio` on a surrogate job (DESIGN §4.6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rubberband.plan.whatif import approximate_surrogate
from rubberband.profiles.model import ModelProfile
from rubberband.testing.builders import write_profile

from .helpers import ROOT, assert_one_line_error, run

RESNET = ROOT / "profiles" / "resnet101_cifar10_p3.yaml"


def surrogate_experiment(tmp_path: Path, with_profile: bool = True) -> str:
    """ResNet-101's SHA(32, 1, 50, 3) tuned on a surrogate at S = 8, then 50 epochs at full width."""
    surrogate = write_profile(tmp_path / "w8.yaml", approximate_surrogate(ModelProfile.load(RESNET), 8))
    path = tmp_path / "sur.yaml"
    path.write_text(f"""
sha: {{num_trials: 32, min_iters: 1, max_iters: 50, eta: 3}}
model_profile: {RESNET}
cloud:
  profile: {ROOT / 'cloud_profiles' / 'aws' / 'us-east-1.yaml'}
  instance_type: p3.8xlarge
  overrides: {{init_latency_s: {{dist: constant, value: 15}}}}
deadline: 20m
samples: 60
trainer: rubberband.examples.digits:DigitsMLP
search_space: {{hidden: 128, lr: {{loguniform: [0.01, 0.5]}}}}
surrogate:
  width_ratio: 8
  transfer: [lr]
  target_iters: 50
""" + (f"  model_profile: {surrogate}\n" if with_profile else ""))
    return str(path)


def test_plan_prints_the_whole_job_with_the_target_stage_marked(capsys, tmp_path):
    exp = surrogate_experiment(tmp_path)
    code, out, err = run(capsys, "plan", exp)
    assert code == 0, err
    rows = [line.split() for line in out.splitlines() if line.split()[:2] == ["4", "target"]]
    assert len(rows) == 1 and rows[0][2:4] == ["1", "50"]          # 1 trial, 50 iterations
    assert "stage 4 is the target: the surrogate winner's config trained at full width" in out
    code, out, err = run(capsys, "plan", exp, "--json")
    data = json.loads(out)
    assert data["target_stage"] == 4 and data["stages"][-1] == [1, 50]


def test_simulate_runs_the_target_stage_by_the_full_width_profile(capsys, tmp_path):
    exp = surrogate_experiment(tmp_path)
    code, out, err = run(capsys, "simulate", exp, "--allocation", "32,10,3,1,4", "--json")
    assert code == 0, err
    stages = json.loads(out)["stages"]
    # 50 epochs of ResNet-101 at full width on 4 GPUs: ~28 s each, far above the surrogate's stages.
    assert stages[-1]["mean_duration_s"] > 50 * 25 and stages[-1]["num_trials"] == 1


def test_a_rehearsal_runs_the_target_stage_as_simulate_predicts_it(capsys, tmp_path):
    """`run --provider sim` draws the target stage from the full-width profile (50 epochs at
    ~28 s on 4 GPUs): its mean JCT and cost agree with `simulate`'s (they would be ~8x short on
    the surrogate's profile)."""
    exp = surrogate_experiment(tmp_path)
    alloc = ("--allocation", "32,10,3,1,4")
    code, out, err = run(capsys, "run", exp, "--provider", "sim", *alloc, "--repeat", "40", "--no-replan", "--json")
    assert code == 0, err
    rehearsed = json.loads(out)
    code, out, err = run(capsys, "simulate", exp, *alloc, "--json")
    assert code == 0, err
    simulated = json.loads(out)
    summary = rehearsed["summary"]
    assert summary["jct_s_mean"] == pytest.approx(simulated["jct_s_mean"], rel=0.03)
    assert summary["cost_usd_mean"] == pytest.approx(simulated["cost_usd_mean"], rel=0.03)
    one = rehearsed["runs"][0]["surrogate"]
    assert one["target"]["trial"] == "target-" + one["winner"]["trial"] and one["width_ratio"] == 8
    assert one["target"]["config"] == one["winner"]["config"] and one["target"]["config"]["hidden"] == 128
    assert one["cost"]["target"]["actual_duration_s"] > 50 * 25


def test_a_rehearsal_re_plans_a_surrogate_job_by_both_profiles(capsys, tmp_path):
    """The plan misses its 20-minute deadline (the target alone takes ~23 min): each rehearsal
    re-plans at its first SYNC, which prices the target stage by the full-width profile."""
    code, out, err = run(capsys, "run", surrogate_experiment(tmp_path), "--provider", "sim", "--allocation",
                         "32,10,3,1,4", "--repeat", "3", "--json")
    assert code == 0, err
    runs = json.loads(out)["runs"]
    assert all(r["replans"] and r["surrogate"]["target"]["metric"] is not None for r in runs)


def test_planning_without_the_surrogate_profile_names_the_field(capsys, tmp_path):
    code, _, err = run(capsys, "plan", surrogate_experiment(tmp_path, with_profile=False))
    assert code != 0
    assert_one_line_error(err, "surrogate.model_profile:", "rubberband profile")
    # So does a run of an allocation of one's own (it named the library's target_model= keyword).
    code, _, err = run(capsys, "run", surrogate_experiment(tmp_path, with_profile=False), "--provider", "sim",
                       "--allocation", "32,10,3,1,4")
    assert code != 0
    assert_one_line_error(err, "surrogate.model_profile:", "rubberband profile")


def test_whatif_weighs_width_ratios_measured_or_approximated(capsys, tmp_path):
    exp = str(ROOT / "experiments" / "resnet101_cifar10.yaml")
    code, out, err = run(capsys, "whatif", exp, "--surrogate-ratio", "1,8", "--samples", "60", "--json")
    assert code == 0, err
    one, eight = json.loads(out)["ratios"]
    assert (one["profile"], eight["profile"]) == ("full width", "approximation")
    assert one["target_s"] is None and eight["target_s"] > 0
    assert eight["cost_usd"] < one["cost_usd"]
    measured = write_profile(tmp_path / "w8.yaml", approximate_surrogate(ModelProfile.load(RESNET), 8, 0.5))
    code, out, err = run(capsys, "whatif", exp, "--surrogate-ratio", "8", "--surrogate-profiles", f"8={measured}",
                         "--samples", "60")
    assert code == 0, err
    assert "measured" in out and "approximation:" not in out


@pytest.mark.parametrize(("argv", "needle"), [
    (["--surrogate-ratio", "0,8"], "--surrogate-ratio: expected whole width ratios of at least 1"),
    (["--surrogate-ratio", "1,8", "--trials", "32,64"], "--surrogate-ratio: weighs width ratios alone; drop --trials"),
    (["--surrogate-ratio", "8", "--surrogate-profiles", "eight=x.yaml"], "--surrogate-profiles: expected S=YAML"),
])
def test_bad_surrogate_sweeps_are_one_line(capsys, argv, needle):
    code, _, err = run(capsys, "whatif", str(ROOT / "experiments" / "resnet101_cifar10.yaml"), *argv)
    assert code != 0
    assert_one_line_error(err, needle)


def test_validate_shows_the_target_stage_from_scratch(capsys):
    code, out, err = run(capsys, "validate", str(ROOT / "experiments" / "demo_surrogate.yaml"))
    assert code == 0, err
    assert "(target))" in out.splitlines()[0]
    row = next(line.split() for line in out.splitlines() if line.split()[:2] == ["5", "target"])
    assert row[2:] == ["1", "40", "40"]           # 40 iterations, counted from scratch
