"""Fused trials: several trials of one model shape trained as one program on one device.

``FusedGroup`` trains F members with ``torch.func.vmap`` over stacked parameters and one
optimizer step for all (``optim``); ``why_not_fusable`` and ``group_by_shape`` say which
trials can share a group (``detect``). torch is imported inside functions only: importing
this package costs nothing.
"""

from rubberband.fusion.detect import group_by_shape, why_not_fusable
from rubberband.fusion.group import FusedGroup, signature

__all__ = ["FusedGroup", "group_by_shape", "signature", "why_not_fusable"]
