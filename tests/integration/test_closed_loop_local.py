"""Closed-loop real runs on the local provider (issue 15 item 7): the scheduler's budget
guard stops a real run cleanly, and re-planning reacts to a trainer slower than profiled."""

import json
import os
import subprocess
import sys

import pytest

from rubberband.providers.local import LocalCluster

from .conftest import ROOT, trainer

pytestmark = pytest.mark.integration


def _cli(tmp_path, state, exp: str, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RUBBERBAND_STATE_DIR": str(state), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "rubberband", "run", exp, "--provider", "local", "--json",
                           "--runs-dir", str(tmp_path / "runs"), *argv],
                          env=env, capture_output=True, text=True, timeout=240)


def test_a_budget_that_runs_out_mid_job_stops_cleanly_with_nothing_left_running(tmp_path, _isolated_state):
    # $36/h with a 60 s minimum: each instance's minimum charge is $0.60. Stage 0 runs on one
    # instance; stage 1 needs a second one, which a $1.00 budget cannot pay: the run stops at
    # the SYNC with stage 0's best trial.
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"""
name: budget
stages: [[4, 2], [2, 2]]
model_profile: {ROOT / 'profiles' / 'demo_digits_local.yaml'}
cloud: {{profile: {ROOT / 'cloud_profiles' / 'local' / 'local.yaml'}, instance_type: local.2gpu,
         overrides: {{price_usd_per_hour: 36.0}}}}
deadline: 10m
trainer: {trainer('Tiny')}
metric: val_loss
search_space: {{lr: [0.05, 0.1, 0.2, 0.3]}}
""")
    # --no-replan: re-planning would rather move stage 1 onto the instance held (cheaper).
    out = _cli(tmp_path, _isolated_state, str(exp), "--allocation", "2,4", "--budget", "1.0", "--latency-scale", "0.2",
               "--no-replan")
    assert out.returncode == 3, out.stderr[-2000:]          # stopped on the budget: not a failure
    result = json.loads(out.stdout)
    assert result["stopped"].startswith("budget: $0.") and "cannot pay the minimum charge of 1 more local.2gpu" \
        in result["stopped"]
    assert result["budget_usd"] == 1.0 and 0 <= result["budget_left_usd"] <= 1.0
    assert not result["met_deadline"]
    assert [s["index"] for s in result["stages"]] == [0]
    assert result["best"]["trial"] in {"t000", "t001", "t002", "t003"} and result["best"]["step"] == 2 * 5
    ledger = result["ledger"]
    assert len(ledger["instances"]) == 1 and all(i["released_s"] is not None for i in ledger["instances"])
    assert ledger["cost_usd"] <= 1.0
    assert LocalCluster.known() == []                                 # nothing left running


def test_re_planning_meets_the_deadline_a_trainer_three_times_slower_than_profiled_would_miss(tmp_path):
    # SHA (32,1),(8,30) profiled at 0.25 s per iteration on one GPU (perfect scaling); the
    # trainer (tiny_trainer.Sleepy) sleeps three times that. On the profile one 2-GPU instance
    # meets 90 s (~49 s predicted). At SYNC 0 the estimator has seen 32 TRAINs (factor ~2.7-4:
    # each one-iteration TRAIN also carries Ray's per-trial overhead, more on a loaded
    # machine) and stage 1 on the held instance is predicted at 30c s (4 rounds of 30
    # iterations), against 15c + 13.5 s on a second instance (7.5c + 13.5 s on four). With SYNC 0
    # reached at 20-40 s of wall clock, the remaining 50-70 s are missed by the fixed plan for
    # any c >= 2.4 and met by a larger one for any c <= 4.5: a window tens of seconds wide
    # (stage 1 of (4,30) left one of ~5 s, and flaked).
    import statistics

    import rubberband as rb
    from rubberband.executor.run import execute
    from rubberband.plan import compile_plan
    from rubberband.simulator import simulate

    from .tiny_trainer import Sleepy

    deadline = 90.0
    profile = rb.ModelProfile.from_dict({"name": "sleepy", "trial_startup_s": 0.05, "sync_s": 0.02, "iter_latency_s": {
        m: {"dist": "normal", "mean": Sleepy.ITER_S / m, "std": 0.01} for m in (1, 2, 4)}})
    cloud = rb.CloudProfile.load(ROOT / "cloud_profiles" / "local" / "local.yaml", "local.2gpu")
    spec = rb.ExperimentSpec.from_stages([(32, 1), (8, 30)])
    plan = compile_plan(spec, profile, cloud, deadline, samples=100)
    assert plan.instances == (1, 1) and plan.predicted.mean_jct_s < deadline
    result = execute(plan, trainer("Sleepy"), {"lr": {"loguniform": [0.01, 0.3]}}, metric="val_loss", seed=1,
                     runs_dir=tmp_path / "runs", latency_scale=0.2, replan_with=profile)
    (replan,) = result.loop["replans"]
    assert (replan["sync"], replan["old_allocation"], replan["reason"]) == (0, (2,), "to meet the deadline")
    (gpus,) = replan["new_allocation"]
    assert gpus in (4, 8), replan["line"]
    assert [s["actual"]["instances"] for s in result.stages] == [1, gpus // 2]
    assert result.loop["met_deadline"] and result.actual["jct_s"] <= deadline
    # The fixed plan at the pace the run observed: predicted late.
    pace = statistics.mean(x * r["gpus"] for r in result.ledger["trials"] for x in r["iter_s"]) / Sleepy.ITER_S
    slow = profile.replace(iter_latency_s={m: d.with_moments(d.mean * pace, d.std * pace)
                                           for m, d in profile.iter_latency_s.items()})
    assert pace > 2.5
    assert simulate(spec, plan.allocation, slow, cloud, samples=100).mean_jct_s > deadline
    assert LocalCluster.known() == []
