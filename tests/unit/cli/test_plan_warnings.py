"""`rubberband plan` prints the plan's warnings as one `warning: ...` line each on stderr."""

from __future__ import annotations

from pathlib import Path

from rubberband.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
CIFAR = str(ROOT / "experiments" / "resnet101_cifar10.yaml")


def test_a_v100_profile_planned_on_g5_warns_in_one_line(capsys):
    assert main(["plan", CIFAR, "--instance-type", "g5.12xlarge", "--samples", "50"]) == 0
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: ") and "A10G" in lines[0] and "V100" in lines[0], err
    assert "plan (optimal) on g5.12xlarge" in out


def test_the_profiled_type_plans_without_warnings(capsys):
    assert main(["plan", CIFAR, "--samples", "50"]) == 0
    assert "warning" not in capsys.readouterr().err
