"""List scheduling a queue of trials a round at a time: the simulator's makespans, faster.

``rubberband.simulator.model.list_schedule`` hands the trials to the GPUs one at a time (each
to the GPU that frees up first), a vectorised step per queued trial. When trials take about
equally long, a whole round goes the same way: the next ``b`` trials go to the ``b`` GPUs that
free up first, in that order, because none of them frees up again before the others have
taken theirs. That holds in a sample exactly when every new finish time is at least the
``b``-th smallest free time (at each step the smallest free time is then an old one, the next
in sorted order); a tie between equal free times changes which GPU takes a trial but not the
set of free times, so the makespan is the same number. ``list_schedule`` below takes rounds
where that holds and falls back to the one-at-a-time steps, for the samples where it does not.
"""

from __future__ import annotations

import numpy as np

from rubberband.simulator.model import list_schedule as one_at_a_time


def list_schedule(durations: np.ndarray, gpus: int) -> np.ndarray:
    """Makespan per sample of ``n`` trials on ``gpus`` GPUs, each GPU taking the next queued
    trial as soon as it frees up (trials in order; ``durations`` has shape ``(n, samples)``):
    the same numbers as the simulator's ``list_schedule``."""
    n, samples = durations.shape
    if n <= gpus:
        return durations.max(axis=0)
    free = np.sort(durations[:gpus].T, axis=1)      # (samples, gpus): free times, ascending
    rows = np.arange(samples)
    exact = np.ones(samples, dtype=bool)
    j = gpus
    while j < n and exact.any():
        b = min(gpus, n - j)
        new = free[:, :b] + durations[j:j + b].T
        exact &= new.min(axis=1) >= free[:, b - 1]
        free = np.sort(np.concatenate([new, free[:, b:]], axis=1), axis=1)
        j += b
    out = free[:, -1].copy()
    if not exact.all():
        redo = rows[~exact]
        out[redo] = one_at_a_time(np.ascontiguousarray(durations[:, redo]), gpus)
    return out
