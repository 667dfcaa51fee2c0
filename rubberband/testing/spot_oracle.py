"""Independent references for spot reclaims: one spot instance as a renewal process
(``one_instance_job``), and instances under a zone's replayed availability trace, a gang
trace's count capping how many are held (``gang_trace_job``).

``one_instance_job``: the simplest job DESIGN §4.1 covers — every stage on a single one-GPU spot instance, trials one
after another, or ``k`` at once when packed — simulated sample by sample with plain Python events and its own random
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
                     usd_per_launch: float, samples: int, seed: int,
                     trials_per_gpu: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """JCT and cost per sample of ``stages`` ((trials, iterations) each) on one spot instance.

    ``latency`` (one, or one per stage), ``startup``, ``sync``, ``provision`` and ``init`` are
    distributions with a ``sample(rng, size)`` method (seconds). ``trials_per_gpu`` (per
    stage, default 1) packs ``k`` trials on the instance's GPU: ``k`` slots, each taking the
    next trial in order when it frees up; a reclaim interrupts every trial running on it.
    """
    rng = np.random.default_rng(seed)
    mean_life = 3600.0 / rate_per_hour if rate_per_hour > 0 else math.inf
    latencies = latency if isinstance(latency, (list, tuple)) else [latency] * len(stages)
    packing = trials_per_gpu or [1] * len(stages)
    jct, cost = np.zeros(samples), np.zeros(samples)

    def draw(dist) -> float:
        return float(dist.sample(rng, 1)[0])

    def billed(life: float) -> float:
        return max(math.ceil(round(life / granularity_s, 9)) * granularity_s, minimum_s)

    for s in range(samples):
        lives: list[tuple[float, float, float]] = []      # (billing start, ready, reclaim) of each incarnation

        def launch(request: float, after: float = -math.inf, lives: list = lives) -> None:
            start = request + draw(provision)
            lives.append((start, max(start + draw(init), after), start + rng.exponential(mean_life)))

        def alive_at(t: float, strict: bool = True, lives: list = lives) -> tuple[float, float, float]:
            """The first incarnation not reclaimed by ``t``, replacing reclaimed ones as needed
            (each requested ``notice_s`` before its predecessor's reclaim, not before it started)."""
            for life in lives:
                if life[2] > t or (not strict and life[2] == t):
                    return life
            while True:
                start, _, down = lives[-1]
                launch(max(down - notice_s, start), after=down)
                if lives[-1][2] > t or (not strict and lives[-1][2] == t):
                    return lives[-1]

        def train(t: float, lat: float, boot: float, left: int) -> float:
            """When a TRAIN that can start at ``t`` finishes, through the reclaims it meets."""
            while True:
                _, ready, down = alive_at(t)
                t = max(t, ready)
                if t >= down:                    # gone before the work could start
                    continue
                if t + boot + left * lat <= down:
                    return t + boot + left * lat
                done = math.floor(max(down - t - boot, 0.0) / lat) if lat > 0 else left
                left -= min(done, left)
                t = down

        launch(0.0)
        t = 0.0
        for (trials, iters), dist, k in zip(stages, latencies, packing):
            free = [t] * min(trials, k)
            for _ in range(trials):
                lat, boot = draw(dist), draw(startup)
                slot = free.index(min(free))
                free[slot] = train(free[slot], lat, boot, iters)
            t = max(free) + draw(sync)
            alive_at(t, strict=False)            # reclaimed during the SYNC: replaced all the same
        # Reclaimed ones are billed their life; the last is released at the end, and a
        # replacement still provisioning then is cancelled, never launched.
        spent = usd_per_launch * len(lives)
        for start, _, down in lives:
            if down < t:
                spent += billed(down - start) * usd_per_hour / 3600.0
            elif start < t:
                spent += billed(t - start) * usd_per_hour / 3600.0
            else:
                spent -= usd_per_launch
        jct[s], cost[s] = t, spent
    return jct, cost


def gang_trace_job(stages: list[int], iters: list[int], counts: list[tuple[float, int]], duration_s: float,
                   offsets: np.ndarray, latency, startup, sync, provision, init, seed: int,
                   gang: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """JCT and reclaims per sample of a job whose stage ``i`` runs ``stages[i]`` one-GPU trials of
    ``iters[i]`` iterations at once, each on its own one-GPU spot instance, under a zone's
    replayed availability ``counts`` (``[(seconds, instances available), ...]`` from 0,
    repeating every ``duration_s``), read from ``offsets[s]`` in sample ``s``.

    With ``gang`` the count is a cap (DESIGN §4.1): the instance of rank ``j`` (the j-th held,
    oldest first; a replacement takes its rank) is held only while at least ``j + 1`` are
    available; without it every instance needs one. A request waits for that, then
    provisions; the instance is reclaimed when the count falls below it. Stages keep their
    lowest ranks (the newest are released at each SYNC). Plain Python, instance by instance,
    with its own random numbers: nothing here comes from the vectorised simulator.
    """
    rng = np.random.default_rng(seed)
    times = [t for t, _ in counts]

    def draw(dist) -> float:
        return float(dist.sample(rng, 1)[0])

    def available(t: float) -> int:
        local = t % duration_s
        i = 0
        while i + 1 < len(times) and times[i + 1] <= local:
            i += 1
        return counts[i][1]

    def next_time(t: float, need: int, up: bool) -> float:
        """First time >= t with at least ``need`` available (``up``) or fewer; inf if never."""
        if all((c >= need) != up for _, c in counts):
            return math.inf
        cycle = math.floor(t / duration_s) * duration_s
        if (available(t) >= need) == up:
            return t
        while True:
            for start, c in counts:
                if cycle + start > t and (c >= need) == up:
                    return cycle + start
            cycle += duration_s

    def launch(offset: float, request: float, rank: int, after: float = -math.inf) -> list[float]:
        """[start, ready, reclaim] of the instance of ``rank`` asked for at ``request``."""
        need = rank + 1 if gang else 1
        start = next_time(request + offset, need, up=True) - offset + draw(provision)
        down = next_time(start + offset, need, up=False) - offset
        return [start, min(max(start + draw(init), after), down), down]

    jct, reclaims = np.zeros(len(offsets)), np.zeros(len(offsets))
    for s, offset in enumerate(offsets):
        held: list[list[float]] = []                 # per rank: [start, ready, reclaim] in the job's clock
        now, lost = 0.0, 0

        for n, k in zip(stages, iters):
            del held[n:]
            fresh = len(held)
            held += [launch(offset, now, rank) for rank in range(fresh, n)]
            for inst in held[:fresh]:               # still held: its reclaim from the stage's start on
                need = held.index(inst) + 1 if gang else 1
                inst[2] = next_time(max(inst[0], now) + offset, need, up=False) - offset
            begin = max([now] + [inst[1] for inst in held[fresh:]])
            finish = []
            for rank, inst in enumerate(held):
                lat, boot, left, t = draw(latency), draw(startup), k, begin
                while True:
                    t = max(t, inst[1])
                    if t < inst[2] and t + boot + left * lat <= inst[2]:
                        finish.append(t + boot + left * lat)
                        break
                    if t < inst[2]:
                        left -= min(math.floor(max(inst[2] - t - boot, 0.0) / lat), left)
                        t = inst[2]
                    lost += inst[0] < inst[2]
                    inst[:] = launch(offset, inst[2], rank, after=inst[2])
            end = max(finish) + draw(sync)
            for rank, inst in enumerate(held):      # reclaimed during the SYNC: replaced all the same
                while inst[2] < end:
                    lost += inst[0] < inst[2]
                    inst[:] = launch(offset, inst[2], rank, after=inst[2])
            now = end
        jct[s], reclaims[s] = now, lost
    return jct, reclaims
