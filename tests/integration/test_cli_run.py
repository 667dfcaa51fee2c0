"""`rubberband run` ended by Ctrl-C, SIGTERM or SIGKILL leaves nothing running (after `down`)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rubberband.providers.local import _session_pids

from .conftest import ROOT, trainer

pytestmark = pytest.mark.integration


def _experiment(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(f"""
name: interrupted
stages: [[2, 40]]
model_profile: {ROOT / 'profiles' / 'demo_digits_local.yaml'}
cloud: {{profile: {ROOT / 'cloud_profiles' / 'local' / 'local.yaml'}, instance_type: local.2gpu}}
deadline: 10m
trainer: {trainer('Slow')}
metric: val_loss
search_space: {{lr: [0.05, 0.1]}}
""")
    return path


def _start(tmp_path, state):
    env = {**os.environ, "RUBBERBAND_STATE_DIR": str(state), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rubberband", "run", str(_experiment(tmp_path)), "--allocation", "2",
         "--latency-scale", "0.2", "--runs-dir", str(tmp_path / "runs")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    for line in proc.stderr:       # progress lines: wait until trials are training
        if "stage 0" in line or time.time() > deadline:
            break
    time.sleep(1.0)
    states = list((state / "local").glob("*.json"))
    assert len(states) == 1, "the run recorded no cluster"
    return proc, json.loads(states[0].read_text())["sid"], env


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_releases_every_node(tmp_path, _isolated_state, sig):
    proc, sid, _ = _start(tmp_path, _isolated_state)
    assert _session_pids(sid), "the cluster should be running"
    proc.send_signal(sig)
    proc.communicate(timeout=90)
    assert proc.returncode == 130
    assert _session_pids(sid) == []
    assert list((_isolated_state / "local").glob("*.json")) == []


def test_sigkill_then_down_stops_everything(tmp_path, _isolated_state):
    proc, sid, env = _start(tmp_path, _isolated_state)
    proc.kill()
    proc.communicate(timeout=30)
    assert _session_pids(sid), "a SIGKILLed driver cannot clean up; its cluster is still running"
    down = subprocess.run([sys.executable, "-m", "rubberband", "down", "--provider", "local"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 0 and "stopped local cluster" in down.stdout
    assert _session_pids(sid) == []


def test_run_json_prints_the_run_result(tmp_path, _isolated_state):
    path = tmp_path / "tiny.yaml"
    path.write_text(f"""
name: tiny
sha: {{num_trials: 4, min_iters: 1, max_iters: 3, eta: 2}}
model_profile: {ROOT / 'profiles' / 'demo_digits_local.yaml'}
cloud: {{profile: {ROOT / 'cloud_profiles' / 'local' / 'local.yaml'}, instance_type: local.2gpu}}
deadline: 10m
trainer: {trainer('Tiny')}
metric: val_loss
search_space: {{lr: {{loguniform: [0.01, 0.3]}}}}
""")
    env = {**os.environ, "RUBBERBAND_STATE_DIR": str(_isolated_state), "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "rubberband", "run", str(path), "--provider", "local", "--json",
                          "--latency-scale", "0.2", "--runs-dir", str(tmp_path / "runs")],
                         env=env, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    for side in ("predicted", "actual"):
        assert result[side]["jct_s"] > 0 and result[side]["cost_usd"] > 0
    assert len(result["stages"]) == 2               # SHA(4, 1, 3, 2): (4, 1) then (2, 2)
    assert all({"predicted", "actual"} <= set(s) for s in result["stages"])
    assert set(result["best"]) >= {"config", "metric"} and "lr" in result["best"]["config"]
