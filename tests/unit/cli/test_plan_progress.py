"""`rubberband plan` and `whatif` show the planner's progress on a terminal, and only there."""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import pytest

from rubberband.cli import plan_cmd
from rubberband.cli.main import main
from rubberband.cli.plan_cmd import ProgressLine
from rubberband.plan.search import PlanProgress

ROOT = Path(__file__).resolve().parents[3]
CIFAR = str(ROOT / "experiments" / "resnet101_cifar10.yaml")


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch):
    """Installs a terminal as stderr (inside the test: pytest swaps its own in before the call)."""
    monkeypatch.setattr(plan_cmd, "PROGRESS_AFTER_S", 0.0)     # every plan is slow enough to show it
    monkeypatch.setattr(plan_cmd, "PROGRESS_EVERY_S", 0.0)

    def install() -> Terminal:
        tty = Terminal()
        monkeypatch.setattr(sys, "stderr", tty)
        return tty

    return install


def test_plan_shows_progress_on_a_terminal_and_wipes_it(capsys, terminal):
    terminal = terminal()
    assert main(["plan", CIFAR]) == 0
    err = terminal.getvalue()
    assert "\rplanning: stage 1 of 4, " in err and " candidates kept" in err
    assert err.endswith("\r")     # the line is wiped before the tables print
    last = err.rstrip("\r").rsplit("\r", 1)[-1]
    assert last.strip() == ""
    assert "planning:" not in capsys.readouterr().out


def test_plan_json_is_quiet_on_a_terminal(capsys, terminal):
    terminal = terminal()
    assert main(["plan", CIFAR, "--json"]) == 0
    assert "planning:" not in terminal.getvalue()


def test_plan_is_quiet_when_stderr_is_not_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(plan_cmd, "PROGRESS_AFTER_S", 0.0)
    assert main(["plan", CIFAR]) == 0
    assert "planning:" not in capsys.readouterr().err


def test_whatif_progress_names_the_scenario(capsys, terminal):
    terminal = terminal()
    assert main(["whatif", CIFAR, "--deadline", "15m,25m", "--policies", "optimal"]) == 0
    err = terminal.getvalue()
    assert "planning: scenario 1 of 2, stage " in err and "planning: scenario 2 of 2, stage " in err


def test_whatif_json_is_quiet_on_a_terminal(capsys, terminal):
    terminal = terminal()
    assert main(["whatif", CIFAR, "--deadline", "15m,25m", "--policies", "optimal", "--json"]) == 0
    assert "planning:" not in terminal.getvalue()


def test_progress_line_waits_until_planning_is_slow(monkeypatch):
    tty = Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    now = [100.0]
    line = ProgressLine(argparse.Namespace(json=False), clock=lambda: now[0])
    with line:
        now[0] = 101.0
        line(PlanProgress(1, 7, 40))
        assert tty.getvalue() == ""          # a fast plan shows nothing
        now[0] = 102.5
        line(PlanProgress(2, 7, 1234))
        assert tty.getvalue() == "\rplanning: stage 2 of 7, 1,234 candidates kept"
        now[0] = 102.55
        line(PlanProgress(3, 7, 5))
        assert tty.getvalue().count("planning:") == 1   # redrawn at most every PROGRESS_EVERY_S
        now[0] = 103.0
        line(PlanProgress(4, 7, 5))
    width = len("planning: stage 2 of 7, 1,234 candidates kept")
    assert tty.getvalue().endswith("\rplanning: stage 4 of 7, 5 candidates kept".ljust(width + 1) + "\r" + " " * width + "\r")


def test_plan_zone_auto_with_a_budget_shows_the_probe_and_the_zone(capsys, terminal):
    # issue 21: `plan --zone auto --budget` sat on "stage 1 of 4" for 23 s while it planned zone
    # after zone, probe after probe: the line now says which.
    spot = str(ROOT / "experiments" / "resnet101_spot.yaml")
    terminal = terminal()
    assert main(["plan", spot, "--zone", "auto", "--budget", "3", "--samples", "40"]) == 0, capsys.readouterr().err
    err = terminal.getvalue()
    assert "\rplanning: budget probe 1, zone us-west-2a (1 of 3), stage 1 of 4, " in err
    assert "budget probe 2, zone us-west-2b (2 of 3), stage " in err
