"""Placement policy: map trials' GPU demands onto nodes, and pack trials before a scale-down;
``packing`` places several 1-GPU trials per GPU."""

from rubberband.placement.packing import (
    GpuNode,
    PackedDemand,
    PackedPlacement,
    check_packed,
    place_packed,
)
from rubberband.placement.placement import (
    InfeasiblePlacementError,
    Placement,
    ScaleDownPlan,
    Slot,
    place,
    scale_down_plan,
)

__all__ = [
    "GpuNode", "InfeasiblePlacementError", "PackedDemand", "PackedPlacement", "Placement", "ScaleDownPlan", "Slot",
    "check_packed", "place", "place_packed", "scale_down_plan",
]
