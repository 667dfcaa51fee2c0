"""`plan`, `simulate`, `whatif --eager-transfer` and `run` on a surrogate job whose target starts early
(DESIGN §4.6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import ROOT, assert_one_line_error, run
from .test_surrogate_job_cli import surrogate_experiment


def eager_experiment(tmp_path: Path, eager: str = "0.5") -> str:
    path = Path(surrogate_experiment(tmp_path))
    path.write_text(path.read_text() + f"  eager_transfer: {eager}\n")
    return str(path)


def test_plan_prints_the_early_target_and_the_plans_weighed_after_the_tuning(capsys, tmp_path):
    code, out, err = run(capsys, "plan", eager_experiment(tmp_path))
    assert code == 0, err
    assert "stage 4 is the target, started early (eager transfer): at the SYNC ending stage 0" in out
    assert "probability 0.9 in the model" in out             # 1 - 1/10: 10 of SHA(32, eta 3)'s trials go on
    assert "optimal (target after tuning)" in out and "static (target after tuning)" in out
    code, out, err = run(capsys, "plan", eager_experiment(tmp_path), "--json")
    data = json.loads(out)
    assert data["eager_transfer"] == {"after_stage": 0, "restart_probability": pytest.approx(1 - 1 / 10)}
    seq = data["info"]["eager_transfer"]
    # ResNet-101's 50 epochs at full width overlap the surrogate stages after the first SYNC.
    assert data["predicted"]["jct_s_mean"] < seq["sequential_jct_s_mean"]


def test_simulate_and_the_plan_file_agree(capsys, tmp_path):
    exp = eager_experiment(tmp_path, "{after: 0.7, restart_probability: 0.2}")
    plan_file = tmp_path / "plan.json"
    code, out, err = run(capsys, "plan", exp, "--out", str(plan_file))
    assert code == 0, err
    data = json.loads(plan_file.read_text())
    assert data["eager_transfer"] == {"after_stage": 1, "restart_probability": 0.2}
    code, out, err = run(capsys, "simulate", exp, "--allocation", ",".join(map(str, data["allocation"])),
                         "--instances", ",".join(map(str, data["instances"])), "--samples", str(data["samples"]),
                         "--seed", str(data["seed"]), "--json")
    assert code == 0, err
    assert json.loads(out)["jct_s_mean"] == pytest.approx(data["predicted"]["jct_s_mean"])


def test_whatif_weighs_when_the_target_starts(capsys, tmp_path):
    code, out, err = run(capsys, "whatif", surrogate_experiment(tmp_path), "--eager-transfer", "off,0.5,0.9",
                         "--restart-probability", "0.5", "--json")
    assert code == 0, err
    rows = json.loads(out)["fractions"]
    assert [r["after_stage"] for r in rows] == [None, 0, 1]      # done: 22/32 after stage 0, 29/32 after 1
    assert rows[0]["restart_probability"] is None and rows[1]["restart_probability"] == 0.5
    assert rows[1]["jct_s"] < rows[0]["jct_s"] and rows[1]["cost_usd"] > rows[0]["cost_usd"]
    code, out, err = run(capsys, "whatif", surrogate_experiment(tmp_path), "--eager-transfer", "off,0.5")
    assert "target starts" in out and "0.5 (after stage 0)" in out and "after tuning" in out


@pytest.mark.parametrize(("argv", "needles"), [
    (["--eager-transfer", "half"], ["--eager-transfer: expected fractions", "'half'"]),
    (["--eager-transfer", "0.99"], ["--eager-transfer 0.99: 0.99 of the trials are done only at the tuning's end"]),
    (["--restart-probability", "0.5"], ["--restart-probability: it goes with --eager-transfer"]),
    (["--eager-transfer", "0.5", "--restart-probability", "1.5"], ["--restart-probability: expected a probability",
                                                                   "1.5"]),
    (["--eager-transfer", "0.5", "--trials", "8,16"], ["--eager-transfer: weighs when the target starts, alone",
                                                       "--trials"]),
])
def test_whatifs_bad_eager_flags_are_one_line_errors(capsys, tmp_path, argv, needles):
    code, _, err = run(capsys, "whatif", surrogate_experiment(tmp_path), *argv)
    assert code != 0
    assert_one_line_error(err, *needles)


def test_whatif_eager_needs_a_surrogate_job(capsys):
    code, _, err = run(capsys, "whatif", str(ROOT / "experiments" / "demo.yaml"), "--eager-transfer", "0.5")
    assert code != 0
    assert_one_line_error(err, "--eager-transfer", "has no `surrogate:`")


@pytest.mark.parametrize(("eager", "needles"), [
    ("half", ["surrogate.eager_transfer: expected the fraction"]),
    ("{after: 0.5, when: 2}", ["surrogate.eager_transfer", "when"]),
    ("{restart_probability: 0.5}", ["surrogate.eager_transfer", "after"]),
    ("0.99", ["surrogate.eager_transfer.after: 0.99"]),
    ("{after: 0.95, restart_probability: 0.3}", ["surrogate.eager_transfer.restart_probability: after stage 2 one "
                                                 "trial goes on"]),
])
def test_a_bad_eager_transfer_in_the_experiment_is_one_line_error(capsys, tmp_path, eager, needles):
    code, _, err = run(capsys, "plan", eager_experiment(tmp_path, eager))
    assert code != 0
    assert_one_line_error(err, *needles)
