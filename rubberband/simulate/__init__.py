"""The simulator: a plan's task graph and its Monte-Carlo JCT and cost (DESIGN §4)."""

from rubberband.simulate.dag import build_dag
from rubberband.simulate.engine import layout, simulate
from rubberband.simulate.model import StageDraws, gpus_per_trial, instances_needed
from rubberband.simulate.result import SimResult, StageStats

__all__ = ["SimResult", "StageDraws", "StageStats", "build_dag", "gpus_per_trial", "instances_needed", "layout", "simulate"]
