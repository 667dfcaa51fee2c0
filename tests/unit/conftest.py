"""Fixtures for every unit test."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _runs_in_tmp(tmp_path, monkeypatch):
    """Runs and rehearsals a test starts without ``--runs-dir`` write under its own tmp_path,
    not into the checkout's ``runs/``."""
    monkeypatch.setenv("RUBBERBAND_RUNS_DIR", str(tmp_path / "runs"))
