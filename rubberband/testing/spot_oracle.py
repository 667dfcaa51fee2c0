"""An independent reference for spot reclaims: one spot instance as a renewal process.

The simplest job DESIGN §4.1 covers — every stage on a single one-GPU spot instance, trials one
after another — simulated sample by sample with plain Python events and its own random
numbers, written without the vectorised simulator's schedules, so the two can be compared in
distribution (mean JCT and cost). Lifetimes are exponential with rate λ from the end of each
instance's SCALE; a reclaimed TRAIN keeps its completed iterations, loses the one in progress,
and resumes on a replacement requested ``notice_s`` before the reclaim (not before the
instance started), paying ``trial_startup_s`` again.
"""

from __future__ import annotations

import math

import numpy as np


def one_instance_job(stages: list[tuple[int, int]], latency, startup, sync, provision, init, rate_per_hour: float,
                     notice_s: float, usd_per_hour: float, granularity_s: float, minimum_s: float,
                     usd_per_launch: float, samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """JCT and cost per sample of ``stages`` ((trials, iterations) each) on one spot instance.

    ``latency``, ``startup``, ``sync``, ``provision`` and ``init`` are distributions with a
    ``sample(rng, size)`` method (seconds).
    """
    rng = np.random.default_rng(seed)
    mean_life = 3600.0 / rate_per_hour if rate_per_hour > 0 else math.inf
    jct, cost = np.zeros(samples), np.zeros(samples)

    def draw(dist) -> float:
        return float(dist.sample(rng, 1)[0])

    def billed(life: float) -> float:
        return max(math.ceil(round(life / granularity_s, 9)) * granularity_s, minimum_s)

    for s in range(samples):
        spent = 0.0

        def launch(request: float) -> tuple[float, float, float]:
            """(start of billing, ready, reclaim) of an instance requested at ``request``."""
            nonlocal spent
            start = request + draw(provision)
            spent += usd_per_launch
            return start, start + draw(init), start + rng.exponential(mean_life)

        start, ready, down = launch(0.0)

        def replace(at_least: float) -> None:
            """Reclaim the instance at ``down`` and bring up its replacement."""
            nonlocal start, ready, down, spent
            spent += billed(down - start) * usd_per_hour / 3600.0
            old_down = down
            start, ready, down = launch(max(down - notice_s, start))
            ready = max(ready, old_down)

        t = 0.0
        for trials, iters in stages:
            for _ in range(trials):
                lat, boot = draw(latency), draw(startup)
                left = iters
                while True:
                    t = max(t, ready)
                    while down <= t:                 # gone before the work could start
                        replace(t)
                        t = max(t, ready)
                    if t + boot + left * lat <= down:
                        t += boot + left * lat
                        break
                    done = math.floor(max(down - t - boot, 0.0) / lat) if lat > 0 else left
                    left -= min(done, left)
                    t = down
                    replace(t)
            t += draw(sync)
            while down < t:                          # reclaimed during the SYNC: replaced all the same
                replace(t)
        # Released at the end; a replacement still provisioning is cancelled, never launched.
        spent += billed(t - start) * usd_per_hour / 3600.0 if start < t else -usd_per_launch
        jct[s], cost[s] = t, spent
    return jct, cost
