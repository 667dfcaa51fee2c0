"""Execution: run a plan on a Ray cluster (trainer API, driver, ledger)."""

from rubberband.execute.trainer import Trainer

__all__ = ["Trainer"]
