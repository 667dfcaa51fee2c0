"""Ray Tune function trainables, unmodified, under `rubberband run --provider local`: promoted
trials resume from their checkpoints on their next stage's GPUs (their own step counters go
on), a function that checkpoints every third report trains the reports since again (and the
run says how many), and the best trial reported is the best."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.integration


def _run(tmp_path, state, function: str, stages: str = "[[4, 2], [2, 3]]", allocation: str = "4,4",
         profile: str = "") -> dict:
    exp = tmp_path / "exp.yaml"
    # SHA of 4 trials: 2 iterations on 1 GPU each, then the best 2 for 3 more on 2 GPUs each
    # (DDP over gloo), all on one 4-GPU instance (by default).
    exp.write_text(f"""
name: tune-function-test
stages: {stages}
model_profile: {profile or ROOT / 'profiles' / 'demo_digits_local.yaml'}
cloud: {{profile: {ROOT / 'cloud_profiles' / 'local' / 'local.yaml'}, instance_type: local.4gpu}}
deadline: 10m
trainer: rubberband.examples.tune_function:{function}
metric: val_loss
search_space: {{lr: {{loguniform: [0.002, 0.3]}}}}
""")
    env = {**os.environ, "RUBBERBAND_STATE_DIR": str(state), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "rubberband", "run", str(exp), "--provider", "local", "--allocation", allocation,
                          "--latency-scale", "0.2", "--no-replan", "--json", "--runs-dir", str(tmp_path / "runs")],
                         env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    result["stderr"] = out.stderr
    return result


def _check(result: dict) -> dict:
    trials = result["trials"]
    promoted = {tid: t for tid, t in trials.items() if len(t["history"]) == 2}
    assert len(promoted) == 2 and len(trials) == 4
    for t in trials.values():
        first = t["history"][0]
        assert first["gpus"] == 1 and first["iteration"] == first["training_iteration"] == 2
    for t in promoted.values():
        second = t["history"][1]
        # The function's own counter goes on from its checkpoint: 2 + 3, not 3.
        assert second["gpus"] == 2 and second["iteration"] == 5 and t["step"] == 5
        assert t["ranks_in_sync"], "prepare_model should keep the two DDP ranks identical"
    # SHA kept the better half at the SYNC, and the best reported is the best finalist.
    ran = {tid: t["history"][0]["val_loss"] for tid, t in trials.items()}
    assert max(ran[t] for t in promoted) <= min(v for t, v in ran.items() if t not in promoted)
    best = min(promoted, key=lambda tid: promoted[tid]["metric"])
    assert result["best"]["trial"] == best and result["best"]["metric"] == promoted[best]["history"][-1]["val_loss"]
    return promoted


def test_a_tune_function_checkpointing_every_report_resumes_where_it_stopped(tmp_path, _isolated_state):
    promoted = _check(_run(tmp_path, _isolated_state, "train_digits"))
    assert all("redone" not in t for t in promoted.values())


def test_a_tune_function_checkpointing_every_third_report_redoes_the_rest(tmp_path, _isolated_state):
    result = _run(tmp_path, _isolated_state, "train_digits_every3")
    promoted = _check(result)
    # Its first checkpoint comes at report 3: after stage 0's two reports it has none, so
    # stage 1 starts it from scratch and it trains those 2 again before counting new ones.
    for t in promoted.values():
        assert t["redone"] == 2 and t["history"][1]["redone"] == 2
    assert "trained 2 iteration(s) again" in result["stderr"]


def test_a_kept_gang_restarts_its_function_from_the_checkpoint_as_the_model_counts(tmp_path, _isolated_state):
    """Stage 1 keeps the promoted trials on 1 GPU each, so the driver keeps their gangs: their
    functions still stop at the SYNC and resume from their latest checkpoint, redoing what the
    model counts (DESIGN §4: r_1 = 2 mod 3 = 2; a kept function trained on: predicted 4, actual 0)."""
    profile = tmp_path / "every3.yaml"
    profile.write_text((ROOT / "profiles" / "demo_digits_local.yaml").read_text() + "\ncheckpoint_every: 3\n")
    result = _run(tmp_path, _isolated_state, "train_digits_every3", allocation="4,2", profile=str(profile))
    trials = result["trials"]
    promoted = {tid: t for tid, t in trials.items() if len(t["history"]) == 2}
    assert len(promoted) == 2
    gangs = [e for e in result["timeline"] if e.get("event") == "gang"]
    for tid, t in promoted.items():
        assert [e["trial"] for e in gangs].count(tid) == 1            # its gang was kept at the SYNC
        first, second = t["history"]
        assert second["gpus"] == 1 and second["iteration"] == 5 and t["step"] == 5     # its counter went on
        assert second.get("gpu_ids") == first.get("gpu_ids")
        assert t["redone"] == 2 and second["redone"] == 2
    assert result["stages"][1]["predicted"]["redone"] == 2
    assert sum(t.get("redone", 0) for t in trials.values()) == sum(
        s["trials"] * s["predicted"].get("redone", 0) for s in result["stages"])


# ("4,4", (2, 4)), a gang raised from 2 to 4 GPUs (its two workers join a group of four), passes
# too (35 s); it is left out of CI for time: the raise from 1 to 2 GPUs is tested above.
@pytest.mark.parametrize(("allocation", "gpus"), [("4,2", (2, 2))])
def test_a_ddp_gang_raised_in_rank_or_kept_resumes_its_function(tmp_path, _isolated_state, allocation, gpus):
    """The multi-GPU cases of a stage boundary: 2 trials on 2 GPUs each (DDP), then the best on
    4 (its two workers join a group of four: their rank and world raised) or kept on its 2 (its
    DDP gang handed back to it, the function restarted on both ranks). Neither hangs; the
    function resumes from its checkpoint on every rank, its counter going on, ranks in sync."""
    import yaml

    data = yaml.safe_load((ROOT / "profiles" / "demo_digits_local.yaml").read_text())
    data["iter_latency_s"][4] = data["iter_latency_s"][2]         # (the profile stops at 2 GPUs)
    profile = tmp_path / "every3.yaml"
    profile.write_text(yaml.safe_dump({**data, "checkpoint_every": 3}))
    result = _run(tmp_path, _isolated_state, "train_digits_every3", stages="[[2, 2], [1, 2]]", allocation=allocation,
                  profile=str(profile))
    (winner,) = [t for t in result["trials"].values() if len(t["history"]) == 2]
    first, second = winner["history"]
    assert (first["gpus"], second["gpus"]) == gpus
    assert second["iteration"] == 4 and winner["step"] == 4 and winner["ranks_in_sync"]
    assert winner["redone"] == second["redone"] == 2 == result["stages"][1]["predicted"]["redone"]


FAILING = '''
import os, tempfile
from ray import tune

def train_fn(config):
    step = 0
    ckpt = tune.get_checkpoint()
    if ckpt:
        with ckpt.as_directory() as d:
            step = int(open(os.path.join(d, "step")).read())
    while True:
        step += 1
        if config["lr"] > 0.1 and step == 2:
            raise ValueError(f"diverged at step {step}")
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "step"), "w") as fh:
                fh.write(str(step))
            tune.report({"loss": config["lr"] / step, "step": step}, checkpoint=tune.Checkpoint.from_directory(d))
'''


def test_a_function_that_raises_is_retried_then_failed_and_the_job_goes_on(tmp_path, _isolated_state):
    (tmp_path / "failing.py").write_text(FAILING)
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"""
name: failing-function
stages: [[2, 3], [1, 2]]
model_profile: {ROOT / 'profiles' / 'demo_digits_local.yaml'}
cloud: {{profile: {ROOT / 'cloud_profiles' / 'local' / 'local.yaml'}, instance_type: local.2gpu}}
deadline: 10m
trainer: failing.py:train_fn
metric: loss
max_failures: 1
search_space: {{lr: {{grid: [0.05, 0.2]}}}}
""")
    env = {**os.environ, "RUBBERBAND_STATE_DIR": str(_isolated_state), "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "rubberband", "run", str(exp), "--provider", "local", "--allocation", "2,1",
                          "--latency-scale", "0.2", "--no-replan", "--json", "--runs-dir", str(tmp_path / "runs")],
                         env=env, capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    bad, good = result["trials"]["t001"], result["trials"]["t000"]
    assert bad["failures"] == 2 and "ValueError: diverged at step 2" in bad["failed"]
    assert bad["eliminated_after"] == 0 and result["best"]["trial"] == "t000" and good["step"] == 5
    failures = (Path(result["run_dir"]) / "failures" / "t001.txt").read_text()
    assert failures.count("--- failure") == 2 and "raise ValueError" in failures
