"""`rubberband run EXP --provider sim`: a rehearsal prints or emits a run's result; bad input is one line."""

from __future__ import annotations

import json

import pytest

from tests.unit.cli.helpers import ROOT, assert_one_line_error, run, spot_experiment

EXP = str(ROOT / "experiments" / "resnet101_cifar10.yaml")
RUN_FIELDS = {"predicted", "actual", "deadline_s", "met_deadline", "replans", "ledger", "stages", "trials", "best"}


def test_one_rehearsal_as_json_has_the_fields_of_a_run(capsys):
    code, out, err = run(capsys, "run", EXP, "--provider", "sim", "--json", "--samples", "50", "--seed", "3")
    assert code == 0, err
    result = json.loads(out)
    assert RUN_FIELDS <= set(result)
    assert result["deadline_s"] == 1200.0 and result["seed"] == 3 and result["replans"] == []
    assert result["met_deadline"] == (result["actual"]["jct_s"] <= 1200.0)
    assert result["ledger"]["cost_usd"] == pytest.approx(result["actual"]["cost_usd"])
    assert len(result["ledger"]["instances"]) == 8


def test_a_rehearsal_of_a_type_per_stage_says_what_each_stage_ran_on_as_a_real_run_does(capsys):
    code, out, err = run(capsys, "run", str(ROOT / "experiments" / "resnet101_spot.yaml"), "--provider", "sim",
                         "--instance-type", "auto", "--json", "--seed", "5", "--samples", "100", "--no-replan")
    assert code == 0, err
    result = json.loads(out)
    planned = result["plan"]["instance_types"]
    assert len(set(planned)) == 2
    for stage in result["stages"]:
        assert stage["instance_type"] == stage["predicted"]["instance_type"] == planned[stage["index"]]
        assert {"spot_instances", "reclaimed"} <= set(stage["actual"]) and "spot_instances" in stage["predicted"]


def test_one_rehearsal_prints_predicted_vs_actual(capsys):
    code, out, err = run(capsys, "run", EXP, "--provider", "sim", "--samples", "50")
    assert code == 0, err
    assert "predicted vs actual" in out
    assert "rehearsal (sim, seed 0): " in out and " the deadline 20m00s; 0 spot reclaim(s), " in out


def test_repeated_rehearsals_summarise_p_meet_jct_and_cost(capsys):
    code, out, err = run(capsys, "run", EXP, "--provider", "sim", "--repeat", "4", "--json", "--samples", "50")
    assert code == 0, err
    result = json.loads(out)
    assert [r["seed"] for r in result["runs"]] == [0, 1, 2, 3]
    assert all(RUN_FIELDS <= set(r) for r in result["runs"])
    summary = result["summary"]
    assert summary["p_meet"] == sum(r["met_deadline"] for r in result["runs"]) / 4
    assert summary["jct_s_mean"] == pytest.approx(sum(r["actual"]["jct_s"] for r in result["runs"]) / 4)
    code, out, err = run(capsys, "run", EXP, "--provider", "sim", "--repeat", "3", "--samples", "50")
    assert code == 0, err
    assert "3 rehearsals (sim, seeds 0..2):\nP(met 20m00s, not stopped) = " in out and "cost mean $" in out
    # Stopped by the budget, every run ends early (well inside the deadline) and meets nothing.
    code, out, err = run(capsys, "run", EXP, "--provider", "sim", "--repeat", "3", "--json", "--samples", "50",
                         "--budget", "8", "--allocation", "32,20,12,12")
    result = json.loads(out)
    assert all(r["stopped"] and r["actual"]["jct_s"] < 1200.0 for r in result["runs"])
    assert result["summary"]["p_meet"] == 0.0


def test_a_spot_rehearsal_reclaims_instances(capsys, tmp_path):
    # The plan misses its 20m deadline on spot, so the safety net would move it all to on-demand at once.
    code, out, err = run(capsys, "run", spot_experiment(tmp_path, rate_per_hour=8.0), "--provider", "sim", "--json",
                         "--allocation", "32,20,12,8", "--no-safety-net")
    assert code == 0, err
    result = json.loads(out)
    assert result["reclaims"] > 0
    assert any(i["release_reason"] == "interrupted" for i in result["ledger"]["instances"])


def test_a_wrong_truth_model_is_rehearsed(capsys, tmp_path):
    slow = tmp_path / "slow.yaml"
    profile = (ROOT / "profiles" / "resnet101_cifar10_p3.yaml").read_text()
    slow.write_text(profile.replace("trial_startup_s: {dist: normal, mean: 8", "trial_startup_s: {dist: normal, mean: 300"))
    assert slow.read_text() != profile
    code, out, err = run(capsys, "run", EXP, "--provider", "sim", "--json", "--samples", "50", "--truth-model", str(slow))
    assert code == 0, err
    assert json.loads(out)["actual"]["jct_s"] > 1200 + 4 * 250      # four stages, each ~290 s later


@pytest.mark.parametrize("argv, needles", [
    (["--repeat", "0"], ["--repeat: expected a whole number of rehearsals >= 1, got 0"]),
    (["--cluster", "c.yaml"], ["--cluster: the sim provider takes no Ray cluster YAML"]),
    (["--truth-model", str(ROOT / "profiles" / "resnet50_bs2048_p3.yaml")],
     ["--truth-model: profile 'resnet50-bs2048' is of another model than the plan's 'resnet101-cifar10-bs1024'"]),
])
def test_bad_rehearsal_input_is_one_line_naming_the_flag(capsys, argv, needles):
    code, _, err = run(capsys, "run", EXP, "--provider", "sim", "--samples", "50", *argv)
    assert code != 0
    assert_one_line_error(err, *needles)


def test_a_truth_model_without_the_plans_gpu_counts_is_refused(capsys, tmp_path):
    narrow = tmp_path / "narrow.yaml"
    narrow.write_text("""
name: resnet101-cifar10-bs1024
iter_latency_s: {1: {dist: constant, value: 90}, 2: {dist: constant, value: 50}}
""")
    code, _, err = run(capsys, "run", EXP, "--provider", "sim", "--allocation", "32,20,12,8", "--truth-model", str(narrow))
    assert code != 0
    assert_one_line_error(err, "--truth-model", "covers 1..2 GPUs per trial, but the plan runs trials on 4, 8 GPUs")


def test_a_truth_cloud_is_checked_like_overrides(capsys, tmp_path):
    bad = tmp_path / "cloud.yaml"
    bad.write_text("provison_latency_s: {dist: constant, value: 60}\n")
    code, _, err = run(capsys, "run", EXP, "--provider", "sim", "--samples", "50", "--truth-cloud", str(bad))
    assert code != 0
    assert_one_line_error(err, "--truth-cloud", "provison_latency_s")
    good = tmp_path / "slow_cloud.yaml"
    good.write_text("provision_latency_s: {dist: constant, value: 400}\n")
    # Followed as it is (re-planning would start the rest from the instances held and catch up).
    code, out, err = run(capsys, "run", EXP, "--provider", "sim", "--allocation", "32,20,12,8", "--json",
                         "--truth-cloud", str(good), "--no-replan")
    assert code == 0, err
    result = json.loads(out)     # stage 0 alone scales up: its SCALE is 385 s longer than planned
    assert result["actual"]["jct_s"] - result["predicted"]["jct_s"] > 385 - 60


def test_rehearsal_options_need_the_sim_provider(capsys):
    code, _, err = run(capsys, "run", EXP, "--provider", "local", "--repeat", "2")
    assert code != 0
    assert_one_line_error(err, "--repeat: only a rehearsal takes it; add --provider sim or drop it")


def test_a_rehearsal_replans_a_slow_job_one_line_per_replan_unless_told_not_to(capsys):
    slow = ROOT / "tests" / "unit" / "cli" / "slow_resnet101.yaml"
    argv = ["run", EXP, "--provider", "sim", "--samples", "200", "--deadline", "25m", "--truth-model", str(slow)]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("sync ")]
    assert lines and lines[0].startswith("sync 0: 1.2") and "x slower than profiled; stages 1-3 re-planned " in lines[0]
    code, out, err = run(capsys, *argv, "--no-replan", "--json")
    assert code == 0, err
    assert json.loads(out)["replans"] == []


def test_a_budget_that_runs_out_stops_the_rehearsal_with_exit_code_3(capsys):
    # The deadline's plan, given: planning for $8 would refuse it (the cheapest plan costs more).
    code, out, err = run(capsys, "run", EXP, "--provider", "sim", "--samples", "50", "--budget", "8", "--json",
                         "--allocation", "32,20,12,12")
    assert code == 3, err
    result = json.loads(out)
    assert result["stopped"].startswith("budget: ") and not result["met_deadline"]
    assert result["actual"]["cost_usd"] <= 8.0 and result["budget_left_usd"] >= 0 and result["budget_usd"] == 8.0
    assert result["best"]["trial"]       # stage 0 finished: the best trial so far
    code, out, err = run(capsys, "run", EXP, "--provider", "sim", "--samples", "50", "--budget", "8",
                         "--allocation", "32,20,12,12")
    assert code == 3, err
    assert "\nstopped: budget: $7.9" in out and " left" in out
    assert "note: the plan is predicted to cost $14.06, more than the budget $8.00: expect it to stop" in out
    code, out, err = run(capsys, "run", EXP, "--provider", "sim", "--samples", "50", "--budget", "30", "--json")
    assert code == 0, err
    assert json.loads(out)["stopped"] is None


@pytest.mark.parametrize("argv, needles", [
    (["--budget", "0"], ["--budget: expected a positive amount of dollars, e.g. 50, got 0.0"]),
    (["--budget", "0.5"], ["--budget: $0.5000 is below the cheapest possible run, which costs $12.07"]),
    (["--budget", "0.5", "--allocation", "32,20,12,12"],
     ["--budget: $0.5000 is below the cheapest possible run of this job, $1.11"]),
])
def test_bad_budgets_are_one_line_naming_the_flag(capsys, argv, needles):
    code, _, err = run(capsys, "run", EXP, "--provider", "sim", "--samples", "50", *argv)
    assert code != 0
    assert_one_line_error(err, *needles)


def test_a_rehearsal_prints_the_safety_nets_switch_unless_told_not_to(capsys, tmp_path):
    exp = spot_experiment(tmp_path, rate_per_hour=12.0)
    argv = ["run", exp, "--provider", "sim", "--allocation", "32,20,12,12", "--deadline", "22m", "--no-replan"]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    (line,) = [x for x in out.splitlines() if x.startswith("safety net: ")]
    assert " slack < 1m30s needed; stage" in line     # twice SCALE (30 s) + INIT (15 s) and line.endswith(" move to on-demand")
    code, out, err = run(capsys, *argv, "--no-safety-net", "--json")
    assert code == 0, err
    assert json.loads(out)["safety_net"] == []


def test_a_rehearsal_too_large_to_hold_is_refused_up_front_in_one_line():
    """A million-trial SHA grew past 3.6 GB before (issue 21): refused before any rehearsal."""
    from types import SimpleNamespace

    from rubberband.errors import SpecError
    from rubberband.executor.rehearse import rehearse, rehearse_runs
    from rubberband.spec import ExperimentSpec

    huge = SimpleNamespace(spec=ExperimentSpec.sha(num_trials=1_000_000, min_iters=1, max_iters=81, eta=3))
    with pytest.raises(SpecError) as err:
        rehearse_runs(huge, model=None, seeds=[0])       # refused before it touches the model
    message = str(err.value)
    assert "\n" not in message and message.startswith("job too large: rehearsing") and "1,493,826 trials" in message and "5.8 GB" in message
    with pytest.raises(SpecError, match=r"^job too large: rehearsing .* 1,493,826 trials in all needs about 5\.8 GB"):
        rehearse(huge, model=None)
    # The estimate itself (sizes, repeats, the advice): tests/unit/test_limits.py.


def test_repeated_rehearsals_show_progress_on_stderr_after_two_seconds():
    """``run --provider sim --repeat 200`` was silent for ~45 s (issue 21)."""
    import argparse
    import io

    from rubberband.cli.rehearse import RepeatProgress

    times = iter([0.0, 1.0, 2.5, 2.6, 3.2, 9.0])
    stream = io.StringIO()
    with RepeatProgress(argparse.Namespace(json=False), stream=stream, clock=lambda: next(times), tty=True) as show:
        for done in range(1, 6):
            show(done, 200)
    lines = stream.getvalue().split("\r")
    assert [line.strip() for line in lines if line.strip()] == ["rehearsing: 2 of 200 (sim, 2s)",
                                                               "rehearsing: 4 of 200 (sim, 3s)",
                                                               "rehearsing: 5 of 200 (sim, 9s)"]
    quiet = io.StringIO()
    with RepeatProgress(argparse.Namespace(json=True), stream=quiet, clock=lambda: 100.0, tty=True) as show:
        show(1, 200)
    assert quiet.getvalue() == ""


def test_rehearse_runs_reports_each_rehearsal_done():
    from rubberband import load_experiment
    from rubberband.executor.rehearse import rehearse_runs
    from rubberband.plan import compile_plan

    exp = load_experiment(EXP)
    plan = compile_plan(exp.spec, exp.model, exp.cloud, exp.deadline_s, samples=50)
    seen = []
    results, runs = rehearse_runs(plan, exp.model, seeds=range(3), progress=lambda k, n: seen.append((k, n)))
    assert seen == [(1, 3), (2, 3), (3, 3)] and [r["seed"] for r in runs] == [0, 1, 2] and len(results) == 3
