"""Which model profile an instance type runs by, when an experiment has one per GPU model.

``model_profile: {V100: p3.yaml, A10G: g5.yaml}`` gives each GPU model its own curves
(issue #14); the planner, the simulator and the timeline all pick a type's profile here, so
they cannot disagree about it.
"""

from __future__ import annotations

from collections.abc import Mapping

from rubberband.errors import SpecError
from rubberband.profiles.cloud import CloudProfile
from rubberband.profiles.model import ModelProfile


def model_of(models: Mapping[str, ModelProfile] | ModelProfile, cloud: CloudProfile,
             where: str = "model") -> ModelProfile:
    """The profile ``cloud``'s type runs by: ``models`` itself, or its GPU model's when there
    are several. ``where`` names the field a type without a profile is reported under."""
    if isinstance(models, ModelProfile):
        return models
    if str(cloud.gpu_model) not in models:
        raise SpecError(f"{where}: {cloud.instance_type} has {cloud.gpu_model} GPUs but the model profiles cover "
                        f"{', '.join(models)} only; add a {cloud.gpu_model} profile or use another type")
    return models[str(cloud.gpu_model)]
