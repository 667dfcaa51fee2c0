"""Placement policy: map trials' GPU demands onto nodes, and pack trials before a scale-down."""

from rubberband.placement.placement import (
    InfeasiblePlacementError,
    Placement,
    ScaleDownPlan,
    Slot,
    place,
    scale_down_plan,
)

__all__ = ["InfeasiblePlacementError", "Placement", "ScaleDownPlan", "Slot", "place", "scale_down_plan"]
