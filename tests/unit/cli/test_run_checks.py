"""`rubberband run`: bad options are refused before planning (no plan table first), and
`--budget` plans for the budget as `plan --budget` does."""

from __future__ import annotations

import json

import pytest

from rubberband.cli.main import main

from .helpers import ROOT, assert_one_line_error, run

DEMO = str(ROOT / "experiments" / "demo.yaml")


@pytest.mark.parametrize("argv, needles", [
    (["--latency-scale", "-1"], ["--latency-scale", "positive", "-1"]),
    (["--latency-scale", "0"], ["--latency-scale", "positive"]),
    (["--provider", "sim", "--latency-scale", "0.5"], ["--latency-scale", "rehearsal", "drop it"]),
    (["--budget", "-1"], ["--budget", "positive", "-1"]),
    (["--budget", "nan"], ["--budget", "positive"]),
    (["--provider", "sim", "--truth-model", "/no/such/truth.yaml"], ["--truth-model", "/no/such/truth.yaml"]),
    (["--provider", "sim", "--truth-cloud", "/no/such/cloud.yaml"], ["--truth-cloud", "/no/such/cloud.yaml"]),
    (["--allocation", "2,2", "--market", "spot"], ["--market", "--allocation"]),
])
def test_bad_options_are_one_line_before_any_planning(capsys, no_execution, argv, needles):
    code, out, err = run(capsys, "run", DEMO, "--samples", "50", *argv)
    assert code != 0 and out == ""                   # no plan table printed first
    assert_one_line_error(err, *needles)
    assert no_execution == []


def test_run_budget_plans_for_the_budget_like_plan_budget(capsys, no_execution):
    code, out, _ = run(capsys, "plan", DEMO, "--samples", "50", "--budget", "0.5", "--json")
    assert code == 0
    planned = json.loads(out)
    run(capsys, "run", DEMO, "--samples", "50", "--budget", "0.5", "--json")
    (plan,) = no_execution
    assert list(plan.allocation) == planned["allocation"]
    assert plan.predicted.mean_cost_usd <= 0.5


def test_run_budget_below_the_cheapest_plan_gets_plans_error(capsys, no_execution):
    code, out, err = run(capsys, "run", DEMO, "--samples", "50", "--budget", "0.01")
    assert code != 0 and out == ""
    assert_one_line_error(err, "--budget: $0.0100 is below the cheapest possible run, which costs",
                          "raise the budget to at least")
    assert no_execution == []


def test_a_local_run_says_it_is_starting_its_cluster_before_the_first_event(capsys, no_execution, monkeypatch):
    # issue 21: the first seconds of a local run (Ray's head, the autoscaler) were silent on a terminal.
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    code = main(["run", DEMO, "--provider", "local", "--samples", "50"])
    err = tty.getvalue()
    assert code == 2 and no_execution and "stopped before execution" in err
    starting = [line for line in err.splitlines() if line.startswith("starting a local cluster")]
    assert len(starting) == 1 and "local.1gpu" in starting[0], err
    tty.truncate(0)
    main(["run", DEMO, "--provider", "local", "--samples", "50", "--json"])
    assert "starting a local cluster" not in tty.getvalue()
