"""Options every command shares: --samples, --seed, empty values and output files give one error line, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

import rubberband.cli.run_cmd  # noqa: F401  registers `run`
from rubberband.cli.main import main

from .helpers import assert_one_line_error, run

ROOT = Path(__file__).resolve().parents[3]
CIFAR = str(ROOT / "experiments" / "resnet101_cifar10.yaml")
DEMO = str(ROOT / "experiments" / "demo.yaml")

# Each command with what it needs besides the option under test; `run` fails before it starts anything.
COMMANDS = {
    "plan": ["plan", CIFAR],
    "simulate": ["simulate", CIFAR, "--allocation", "32,20,12,8"],
    "whatif": ["whatif", CIFAR, "--init-latency", "1s,10s"],
    "run": ["run", DEMO],
}


def one_error_line(capsys, argv: list[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(("option", "expected"), [
    (["--samples", "0"], "error: --samples: expected a positive integer, got 0"),
    (["--samples", "-1"], "error: --samples: expected a positive integer, got -1"),
    (["--seed", "-1"], "error: --seed: expected a whole number >= 0, got -1"),
    (["--deadline", ""], "error: --deadline: is empty; give a value or leave the option out"),
    (["--deadline", " "], "error: --deadline: is empty; give a value or leave the option out"),
])
def test_bad_shared_options_are_one_line_naming_the_option(capsys, command, option, expected):
    assert one_error_line(capsys, [*COMMANDS[command], *option]) == expected


@pytest.mark.parametrize(("command", "flag", "example"), [
    ("plan", "--out", "plan.json"),
    ("simulate", "--gantt", "run.png"),
    ("whatif", "--plot", "cost.png"),
])
def test_an_output_file_is_checked_before_any_work(capsys, tmp_path, command, flag, example):
    # A deadline no plan meets (or a bad allocation) would fail later: the output file is named first.
    doomed = {"plan": ["--deadline", "1m"], "simulate": ["--allocation", "1,2"], "whatif": ["--deadline", "1m"]}[command]
    argv = [*COMMANDS[command], *doomed]
    missing = tmp_path / "no" / "such" / "dir" / "f"
    assert one_error_line(capsys, [*argv, flag, str(missing)]) == (
        f"error: {flag}: directory '{missing.parent}' does not exist; create it or write elsewhere")
    assert one_error_line(capsys, [*argv, flag, str(tmp_path)]) == (
        f"error: {flag}: '{tmp_path}' is a directory; name a file in it, e.g. {tmp_path / example}")
    assert one_error_line(capsys, [*argv, flag, ""]) == f"error: {flag}: is empty; give a value or leave the option out"


def test_an_unwritable_output_file_is_one_line(capsys, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        import os

        if os.access(locked, os.W_OK):          # root writes anywhere: nothing to check
            pytest.skip("running as a user who may write into a read-only directory")
        line = one_error_line(capsys, ["plan", CIFAR, "--out", str(locked / "plan.json")])
    finally:
        locked.chmod(0o700)
    assert line == f"error: --out: cannot write '{locked / 'plan.json'}' (permission denied)"


@pytest.mark.parametrize("argv", [
    ["simulate", "--allocation", "32,12,12,4", "--gantt", "{dir}/x.txt"],
    ["whatif", "--deadline", "20m:30m:10m", "--plot", "{dir}/a.txt"],
    ["whatif", "--deadline", "20m:30m:10m", "--plot", "{dir}/noext"],
])
def test_a_figure_file_of_no_image_type_is_refused_before_any_work(capsys, tmp_path, argv):
    # issue 21: these exited 1 ("a bug") after the whole computation.
    argv = [a.replace("{dir}", str(tmp_path)) for a in argv]
    code, out, err = run(capsys, argv[0], CIFAR, *argv[1:])
    assert code == 2 and out == ""
    assert_one_line_error(err, f"{argv[-2]}: ", "is no image file", ".png", ".svg", ".pdf")
