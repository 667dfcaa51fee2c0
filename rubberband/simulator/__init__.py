"""The simulator: a plan's task graph and its Monte-Carlo JCT and cost (DESIGN §4)."""

from rubberband.simulator.dag import build_dag
from rubberband.simulator.engine import HeldInstances, layout, simulate, stage_clouds
from rubberband.simulator.model import StageDraws, gpus_per_trial, instances_needed
from rubberband.simulator.result import SimResult, StageStats

__all__ = ["HeldInstances", "SimResult", "StageDraws", "StageStats", "build_dag", "gpus_per_trial", "instances_needed", "layout", "simulate", "stage_clouds"]
