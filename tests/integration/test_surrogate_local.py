"""A surrogate job end to end on the local provider (DESIGN §4.6, issue #24's "Done when"):
`rubberband run experiments/demo_surrogate.yaml` tunes the digits MLP at hidden 128 / 8 = 16,
then trains the winner's config at full width from scratch; result.json names both."""

import json
import math
import os
import subprocess
import sys

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.integration


def test_the_demo_surrogate_job_trains_its_winner_at_full_width(tmp_path, _isolated_state):
    env = {**os.environ, "RUBBERBAND_STATE_DIR": str(_isolated_state), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "rubberband", "run", str(ROOT / "experiments" / "demo_surrogate.yaml"),
                           "--provider", "local", "--runs-dir", str(tmp_path / "runs"), "--json"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    result = json.loads((run_dir / "result.json").read_text())
    s = result["surrogate"]
    winner, target = s["winner"], s["target"]
    assert target["trial"] == f"target-{winner['trial']}" and result["best"]["trial"] == target["trial"]
    assert s["width_ratio"] == 8
    # The target trained the winner's config at full width; the winner's model was built at 16.
    assert target["config"] == winner["config"] and target["config"]["hidden"] == 128
    assert winner["model_config"]["hidden"] == 16
    assert math.isfinite(target["metric"]) and math.isfinite(winner["metric"])
    # From scratch: one TRAIN of the target stage's 40 iterations, nothing before it.
    (train,) = result["trials"][target["trial"]]["history"]
    assert train["stage"] == s["target_stage"] == 5 and train["iters"] == 40
    # Each part's cost, predicted and actual; together the run's (the stages' costs leave out the
    # moments between the last SYNC and the release, which the run's total counts).
    parts = s["cost"]
    assert sum(p["actual_cost_usd"] for p in parts.values()) == pytest.approx(result["actual"]["cost_usd"], rel=0.01)
    assert all(p["predicted_cost_usd"] > 0 for p in parts.values())
    # `report RUN_DIR` prints it again.
    report = subprocess.run([sys.executable, "-m", "rubberband", "report", str(run_dir)], env=env,
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    assert f"surrogate winner {winner['trial']} (width / 8)" in report.stdout
    assert f"target trial {target['trial']} (full width" in report.stdout
