"""The type check's configuration: the pure core stays strict, and scripts/test runs mypy."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]
CORE = ("spec", "profiles", "simulator", "plan", "placement", "scheduler")
# What `mypy --strict` switches on that can be set per module (warn_unused_configs,
# warn_redundant_casts and strict_equality are set globally).
STRICT_FLAGS = {
    "disallow_any_generics": True, "disallow_subclassing_any": True, "disallow_untyped_calls": True,
    "disallow_untyped_defs": True, "disallow_incomplete_defs": True, "check_untyped_defs": True,
    "disallow_untyped_decorators": True, "warn_return_any": True, "implicit_reexport": False,
    "extra_checks": True,
}


def _mypy() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]


def _strict_modules() -> set[str]:
    sections = [o for o in _mypy()["overrides"] if "disallow_untyped_defs" in o]
    assert len(sections) == 1, "expected one strict overrides section"
    assert {k: sections[0].get(k) for k in STRICT_FLAGS} == STRICT_FLAGS
    return set(sections[0]["module"])


def test_every_core_package_is_checked_strictly():
    strict = _strict_modules()
    missing = [p for p in CORE if f"rubberband.{p}.*" not in strict or f"rubberband.{p}" not in strict]
    assert missing == []


def test_the_global_options_check_the_whole_package():
    cfg = _mypy()
    assert cfg["files"] == ["rubberband"]
    assert cfg["warn_unused_ignores"] and cfg["warn_redundant_casts"] and cfg["strict_equality"]
    # A per-module `strict = true` would switch strict mode on everywhere; it is spelled out instead.
    assert all("strict" not in o for o in cfg["overrides"])


def test_scripts_test_runs_mypy_and_fails_on_its_errors():
    script = (ROOT / "scripts" / "test").read_text()
    line = next(ln for ln in script.splitlines() if "-m mypy" in ln)
    assert "status=$?" in line
    assert script.index("-m mypy") < script.index("-m pytest")
    assert (ROOT / "requirements" / "pinned.txt").read_text().count("mypy==") == 1


def test_yaml_is_checked_against_its_stubs_which_ci_installs():
    # schema.UniqueKeyLoader subclasses yaml.SafeLoader: without the stubs yaml is Any, which
    # the strict core may not subclass; with "yaml" ignored, a missing stub would go unseen.
    ignored = {m for o in _mypy()["overrides"] if o.get("ignore_missing_imports") for m in o["module"]}
    assert "yaml" not in ignored
    assert (ROOT / "requirements" / "pinned.txt").read_text().count("types-PyYAML==") == 1
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(d.startswith("types-PyYAML") for d in dev)
