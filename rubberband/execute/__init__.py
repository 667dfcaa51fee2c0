"""Execution: run a plan on a Ray cluster (trainer API, driver, ledger)."""

from rubberband.execute.trainer import Trainer


def execute(*args, **kwargs):
    """Run a plan for real; see ``rubberband.execute.run.execute``."""
    from rubberband.execute.run import execute as _execute

    return _execute(*args, **kwargs)

__all__ = ["Trainer", "execute"]
