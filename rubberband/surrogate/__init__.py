"""Surrogate tuning (Hydro, OSDI '23): tune a μP copy of the model ``S`` times narrower, then
train the winner's config at full width. torch is imported lazily, inside the functions that
build models; this package is not part of the pure core."""

from rubberband.surrogate.parametrization import (
           Family,
           Kind,
           ParamRule,
           optimizer_family,
           param_rules,
)
from rubberband.surrogate.trainer import (
           TARGET_KEY,
           MupTrainer,
           SurrogateJob,
           surrogate_trainer,
           target_trainer,
           width_config,
)

__all__ = ["TARGET_KEY", "Family", "Kind", "MupTrainer", "ParamRule", "SurrogateJob", "optimizer_family", "param_rules", "surrogate_trainer",
           "target_trainer", "width_config"]
