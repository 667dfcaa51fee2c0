"""rb.profile: measure a job's model profile and the provider's latencies, and fit distributions.

``fit`` is pure (numpy and scipy); ``measure`` runs small stages through the real executor and
imports ``ray`` only when it starts a cluster.
"""

import sys
import types

from rubberband.profile.fit import fit_latency, split_train_durations, to_profile_entry
from rubberband.profile.measure import (
    PROVIDERS,
    GpuCountResult,
    ProfileResult,
    check_request,
    profile,
)

__all__ = [
    "PROVIDERS", "GpuCountResult", "ProfileResult", "check_request", "fit_latency", "profile",
    "split_train_durations", "to_profile_entry",
]


class _CallableModule(types.ModuleType):
    """``rb.profile(...)`` works whether ``rb.profile`` resolves to this module or its function."""

    def __call__(self, *args, **kwargs):
        return profile(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
