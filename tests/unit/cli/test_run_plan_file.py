"""`rubberband run EXP --plan PLAN_JSON`: an edited plan is checked against the experiment before
anything starts, and the prediction printed is the recomputed one, never the file's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rubberband.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
DEMO = str(ROOT / "experiments" / "demo.yaml")


@pytest.fixture
def plan_file(tmp_path, capsys):
    path = tmp_path / "plan.json"
    assert main(["plan", DEMO, "--samples", "50", "--out", str(path)]) == 0
    capsys.readouterr()
    return path


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (lambda d: d.update(allocation=d["allocation"][:-1]), "plan.allocation: expected a list of 5 integers"),
        (lambda d: d["allocation"].__setitem__(0, -2), "plan.allocation[0]: must be at least 1, got -2"),
        (lambda d: d["allocation"].__setitem__(0, "2"), "plan.allocation[0]: expected an integer, got '2'"),
        (lambda d: d["stages"].__setitem__(0, [32, 2]), "plan.stages: the plan is for 5 stages: 32x2"),
        (lambda d: d["predicted"].update(jct_s=[]), "plan.predicted.jct_s: expected a non-empty list"),
        (lambda d: d["allocation"].__setitem__(0, 5), "plan.instances[0]: 2 cannot hold stage 0"),
    ],
)
def test_an_edited_plan_that_does_not_fit_is_one_error_line_before_anything_starts(plan_file, no_execution, capsys,
                                                                                   change, needle):
    _edit(plan_file, change)
    code = main(["run", DEMO, "--plan", str(plan_file)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --plan {plan_file}: ") and needle in lines[0], err
    assert no_execution == []


def test_a_json_list_is_not_a_plan(tmp_path, no_execution, capsys):
    path = tmp_path / "list.json"
    path.write_text("[1, 2, 3]")
    assert main(["run", DEMO, "--plan", str(path)]) == 2
    assert "plan: expected a JSON object" in capsys.readouterr().err
    assert no_execution == []


def test_run_prints_and_runs_the_recomputed_prediction(plan_file, no_execution, capsys):
    _edit(plan_file, lambda d: d["predicted"].update(jct_s=[1.0] * 50, cost_usd=[0.0001] * 50))
    assert main(["run", DEMO, "--plan", str(plan_file)]) == 2
    out, err = capsys.readouterr()
    assert err.strip() == "error: stopped before execution"
    (plan,) = no_execution
    assert plan.predicted.mean_jct_s > 1.0 and plan.predicted.mean_cost_usd > 0.0001
    assert "mean 1s" not in out and "$0.00 " not in out
