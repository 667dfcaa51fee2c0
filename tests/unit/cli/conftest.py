"""Fixtures shared by the CLI's tests."""

from __future__ import annotations

import pytest

from rubberband.errors import SpecError


@pytest.fixture
def no_execution(monkeypatch):
    """Stop `run` where it would start the cluster, keeping the plan it was about to run."""
    seen = []

    def execute(plan, *args, **kwargs):
        seen.append(plan)
        raise SpecError("stopped before execution")

    monkeypatch.setattr("rubberband.executor.run.execute", execute)
    return seen
