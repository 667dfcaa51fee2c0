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


def run_local(experiment, tmp_path, state, *flags: str) -> tuple[dict, object, dict]:
    """`rubberband run EXPERIMENT --provider local FLAGS`: its result.json, run directory and environment."""
    env = {**os.environ, "RUBBERBAND_STATE_DIR": str(state), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "rubberband", "run", str(experiment), "--provider", "local", *flags,
                           "--runs-dir", str(tmp_path / "runs"), "--json"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    return json.loads((run_dir / "result.json").read_text()), run_dir, env


def test_the_demo_surrogate_job_trains_its_winner_at_full_width(tmp_path, _isolated_state):
    result, run_dir, env = run_local(ROOT / "experiments" / "demo_surrogate.yaml", tmp_path, _isolated_state)
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


def test_an_eager_target_trains_on_its_own_instance_while_the_tuning_goes_on(tmp_path, _isolated_state):
    """Eager transfer on real Ray (DESIGN §4.6): the target's instance is asked for at the SYNC by
    which 3/4 of the trials are done, apart from the tuning's; kept or restarted, the trial that
    stands trains the winner's config there and the report says which way it went."""
    experiment = tmp_path / "eager.yaml"
    text = (ROOT / "experiments" / "demo_surrogate.yaml").read_text().replace("../", f"{ROOT}/")
    experiment.write_text(text.replace("  # eager_transfer: 0.75 ", "  eager_transfer: 0.75 "))
    result, _, _ = run_local(experiment, tmp_path, _isolated_state, "--max-instances", "2")
    s = result["surrogate"]
    eager, winner, target = s["eager_transfer"], s["winner"], s["target"]
    assert eager["after_stage"] == 1 and eager["handed_over"].startswith("target-")
    assert target["trial"] == f"target-{winner['trial']}" == result["best"]["trial"]
    assert eager["restarted"] == (eager["handed_over"] != target["trial"])
    timeline = result["timeline"]
    (owned,) = [e for e in timeline if e["event"] == "owned"]
    syncs = {e["index"]: e["t"] for e in timeline if e["event"] == "sync"}
    # Asked for at SYNC 1 (whether it trains before the tuning's end depends on this machine's INIT).
    (record,) = [r for r in result["ledger"]["instances"] if r["instance_id"] == owned["instance"]]
    assert record["requested_s"] == pytest.approx(syncs[1], abs=2.0)
    first = next(e["t"] for e in timeline if e["event"] == "start" and e["trial"] == target["trial"])
    assert first >= syncs[1]
    assert result["trials"][target["trial"]]["history"][-1]["instances"] == [owned["instance"]]
    tuning = {i for t, rec in result["trials"].items() if not t.startswith("target-")
              for h in rec["history"] for i in h["instances"]}
    assert owned["instance"] not in tuning
    # Its instance is billed to the target stage, the tuning's to theirs: together the run's cost.
    parts = s["cost"]
    assert sum(p["actual_cost_usd"] for p in parts.values()) == pytest.approx(result["actual"]["cost_usd"], rel=0.01)
