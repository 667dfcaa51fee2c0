"""List scheduling a queue of trials a round at a time: the simulator's makespans, faster.

``rubberband.simulator.model.list_schedule`` hands the trials to the GPUs one at a time (each
to the GPU that frees up first), a vectorised step per queued trial. When trials take about
equally long, a whole round goes the same way: the next ``b`` trials go to the ``b`` GPUs that
free up first, in that order, because none of them frees up again before the others have
taken theirs. That holds in a sample exactly when every new finish time is at least the
``b``-th smallest free time (at each step the smallest free time is then an old one, the next
in sorted order); a tie between equal free times changes which GPU takes a trial but not the
set of free times, so the makespan is the same number. ``list_schedule`` below takes rounds
where that holds and, in the samples where a round does not, steps that round one trial at a
time.
"""

from __future__ import annotations

import numpy as np


def list_schedule(durations: np.ndarray, gpus: int) -> np.ndarray:
    """Makespan per sample of ``n`` trials on ``gpus`` GPUs, each GPU taking the next queued
    trial as soon as it frees up (trials in order; ``durations`` has shape ``(n, samples)``):
    the same numbers as the simulator's ``list_schedule``.

    A round that does not go the same way in some samples is stepped one trial at a time for
    those samples only, from their free times then (the simulator's own steps: the set of free
    times after them is the simulator's, whichever of equal GPUs took a trial), and the next
    round starts again a round at a time for every sample."""
    n, samples = durations.shape
    if n <= gpus:
        return np.asarray(durations.max(axis=0))
    free = np.sort(durations[:gpus].T, axis=1)      # (samples, gpus): free times, ascending
    j = gpus
    while j < n:
        b = min(gpus, n - j)
        new = free[:, :b] + durations[j:j + b].T
        off = np.flatnonzero(new.min(axis=1) < free[:, b - 1])
        if len(off):
            steps = free[off]
            rows = np.arange(len(off))
            for t in range(j, j + b):
                steps[rows, steps.argmin(axis=1)] += durations[t, off]
        free = np.sort(np.concatenate([new, free[:, b:]], axis=1), axis=1)
        if len(off):
            free[off] = np.sort(steps, axis=1)
        j += b
    out: np.ndarray = free[:, -1].copy()
    return out
