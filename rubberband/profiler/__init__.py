"""rb.profile: measure a job's model profile and the provider's latencies, and fit distributions.

``fit`` is pure (numpy and scipy); ``measure`` runs small stages through the real executor and
imports ``ray`` only when it starts a cluster.
"""

from rubberband.profiler.fit import fit_latency, split_train_durations, to_profile_entry
from rubberband.profiler.measure import (
    GpuCountResult,
    ProfileResult,
    check_request,
    profile,
)

__all__ = [
    "GpuCountResult", "ProfileResult", "check_request", "fit_latency", "profile",
    "split_train_durations", "to_profile_entry",
]

