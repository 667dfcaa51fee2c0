"""The command line's entry points: every way of starting it lists every command."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
COMMANDS = ("validate", "plan", "simulate", "whatif", "profile", "run", "status", "down")


@pytest.mark.parametrize("entry", [["-m", "rubberband.cli.main"], ["-m", "rubberband"]])
def test_every_entry_point_lists_every_command(entry):
    out = subprocess.run([sys.executable, *entry, "--help"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("    ") and line.split()[0] in COMMANDS]
    assert listed == list(COMMANDS)
