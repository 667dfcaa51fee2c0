"""Experiment specifications: stages of (trials, iterations), SHA and HyperBand."""

from rubberband.spec.experiment import EagerTransfer, ExperimentSpec, Stage

__all__ = ["EagerTransfer", "ExperimentSpec", "Stage"]
