"""Experiment specifications: stages of (trials, iterations), SHA and HyperBand."""

from rubberband.spec.experiment import ExperimentSpec, Stage

__all__ = ["ExperimentSpec", "Stage"]
