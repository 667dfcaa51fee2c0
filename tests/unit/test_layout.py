"""The pure core (spec, profiles, simulate, plan, place) never imports ray, boto3 or torch."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = ["spec", "profiles", "simulator", "plan", "placement"]
HEAVY = ("ray", "torch", "boto3", "botocore")


@pytest.mark.parametrize("package", PURE)
def test_pure_package_sources_do_not_import_sdks(package):
    pattern = re.compile(r"^\s*(import|from)\s+(ray|torch|boto3|botocore)\b", re.MULTILINE)
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "rubberband" / package).rglob("*.py")
                 if pattern.search(p.read_text())]
    assert offenders == []


def test_importing_the_core_and_the_cli_loads_no_sdk():
    code = ("import sys, rubberband, rubberband.config, rubberband.cli.main\n"
            + "".join(f"import rubberband.{p}\n" for p in PURE)
            + f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
