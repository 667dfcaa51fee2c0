"""Execution: run a plan on a Ray cluster (trainer API, driver, ledger)."""

from rubberband.executor.trainer import Trainer


def execute(*args, **kwargs):
    """Run a plan for real; see ``rubberband.executor.run.execute``."""
    from rubberband.executor.run import execute as _execute

    return _execute(*args, **kwargs)

__all__ = ["Trainer", "execute"]
