"""Spot reclaims in the simulator (DESIGN §4.1), vectorised over Monte-Carlo samples.

A stage's instances are *positions*: on-demand positions first, then spot ones, each oldest
first. A spot position lives through successive *incarnations*: incarnation ``k`` is billed
from ``start[k]`` (the end of its SCALE) until it is reclaimed at ``down[k]``; work can run on
it from ``up[k] = max(start[k] + INIT, down[k-1])`` until ``down[k]``. After a reclaim the
position is refilled at once:

* ``rate_per_hour`` λ: ``down[k] = start[k] + Exp(λ)``; the replacement is requested at
  ``max(down[k] - notice_s, start[k])`` — with a notice, provisioning overlaps the notice —
  and its SCALE and INIT are drawn like any launch. An instance held from an earlier stage
  is alive at the stage's start, so (lifetimes being memoryless) its remaining life is drawn
  afresh there, from ``max(stage start, start[k])``; a notice that would have come before the
  stage's start comes at it.
* ``trace``: the zone's availability is replayed from a random offset per sample. Every spot
  instance of the zone is reclaimed when it turns unavailable; a replacement (like a first
  request) waits until capacity returns, then provisions. A notice does not help here: the
  zone as a whole is gone.

A TRAIN on positions ``P`` (several when a trial spans instances) runs while all of them are
up. Interrupted at ``r`` it keeps its completed iterations, loses the one in progress, and
resumes on the replacements once they are up, paying ``trial_startup_s`` again. On-demand
positions are never interrupted (``down = inf``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rubberband.profiles.cloud import CloudProfile
from rubberband.profiles.spot import SpotMarket

# Stream ids of the spot components, apart from the per-stage ones in ``model.py`` (0..4).
_LIFE, _RESCALE, _REINIT, _OFFSET = 10, 11, 12, 13
_CHUNK = 4                     # incarnations generated at a time, per position


def _rng(seed: int, stage: int, component: int, position: int = 0) -> np.random.Generator:
    key = (stage, component, position)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key)))


def trace_offsets(market: SpotMarket, seed: int, samples: int) -> np.ndarray:
    """Where in the zone's trace each Monte-Carlo sample's job starts (uniform over the trace)."""
    if market.trace is None:
        return np.zeros(samples)
    return _rng(seed, 0, _OFFSET).uniform(0.0, market.trace.duration_s, samples)


class PositionSchedule:
    """The incarnations of a stage's instance positions, per sample, extended on demand.

    ``up``, ``down`` and ``start`` have shape ``(positions, samples, K)``. On-demand positions
    have a single incarnation that is never reclaimed.
    """

    def __init__(self, cloud: CloudProfile, market: SpotMarket, seed: int, stage: int, t0: np.ndarray,
                 start: np.ndarray, up: np.ndarray, spot: np.ndarray, offset: np.ndarray):
        """
        Args:
            t0: the stage's start per sample, ``(samples,)``.
            start, up: per position, the current incarnation's SCALE end and ready time
                ``(positions, samples)`` (``-inf`` start for instances from long ago is fine).
            spot: per position, whether it is a spot instance ``(positions,)``.
            offset: each sample's offset into the zone's trace (trace market only).
        """
        self.cloud, self.market, self.seed, self.stage = cloud, market, int(seed), int(stage)
        self.spot = np.asarray(spot, dtype=bool)
        self.offset = offset
        self.t0 = t0
        first_down = np.full(start.shape, np.inf)
        spot_rows = np.flatnonzero(self.spot)
        self._streams = {p: (_rng(seed, stage, _LIFE, p), _rng(seed, stage, _RESCALE, p), _rng(seed, stage, _REINIT, p))
                         for p in spot_rows}
        if market.trace is not None and len(spot_rows):
            alive_from = np.maximum(start[spot_rows], t0)
            first_down[spot_rows] = self._zone_next(alive_from, up=False)
        elif market.rate_per_hour > 0:
            for p in spot_rows:
                life = self._streams[p][0].exponential(3600.0 / market.rate_per_hour, start.shape[1])
                first_down[p] = np.maximum(start[p], t0) + life
        self.start, self.up, self.down = start[..., None], up[..., None], first_down[..., None]
        self.up = np.minimum(self.up, self.down)          # reclaimed before it was ever ready: never up

    def _zone_next(self, t: np.ndarray, up: bool) -> np.ndarray:
        """The first time ``>= t`` the zone is up (or down), in the stage's clock; ``inf`` stays."""
        out = np.full(np.shape(t), np.inf)
        finite = np.isfinite(t)
        shifted = (t + self.offset)[finite]
        out[finite] = self.market.trace.next_change(shifted, up=up) - (self.offset * np.ones_like(t))[finite]
        return out

    def extend(self) -> None:
        """Add ``_CHUNK`` more incarnations to every spot position."""
        spot_rows = np.flatnonzero(self.spot)
        P, S, K = self.up.shape
        new_start = np.full((P, S, _CHUNK), np.inf)
        new_up = np.full((P, S, _CHUNK), np.inf)
        new_down = np.full((P, S, _CHUNK), np.inf)
        notice = self.market.notice_s
        cloud = self.cloud
        for p in spot_rows:
            life, rescale, reinit = self._streams[p]
            prev_start, prev_down = self.start[p, :, -1], self.down[p, :, -1]
            for j in range(_CHUNK):
                if self.market.trace is not None:
                    request = self._zone_next(prev_down, up=True)
                else:
                    request = np.maximum(prev_down - notice, np.maximum(prev_start, self.t0))
                scale = cloud.provision_latency_s.sample(rescale, S)
                init = cloud.init_latency_s.sample(reinit, S)
                start = request + scale
                if self.market.trace is not None:
                    down = self._zone_next(start, up=False)
                else:
                    down = start + life.exponential(3600.0 / self.market.rate_per_hour, S)
                up = np.minimum(np.maximum(start + init, prev_down), down)
                new_start[p, :, j], new_up[p, :, j], new_down[p, :, j] = start, up, down
                prev_start, prev_down = start, down
        self.start = np.concatenate([self.start, new_start], axis=2)
        self.up = np.concatenate([self.up, new_up], axis=2)
        self.down = np.concatenate([self.down, new_down], axis=2)

    def window(self, pos: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For position ``pos`` at time ``t`` (same shapes, ``(..., samples)``): the earliest
        time ``>= t`` it is up, and when that up period ends."""
        sidx = np.broadcast_to(np.arange(t.shape[-1]), t.shape)
        while True:
            up, down = self.up[pos, sidx], self.down[pos, sidx]          # (..., samples, K)
            tt = t[..., None]
            inside = (up <= tt) & (tt < down)
            later = np.where((up > tt) & (up < down), up, np.inf)
            k_in = inside.argmax(axis=-1)
            k_next = later.argmin(axis=-1)
            has_in = inside.any(axis=-1)
            start = np.where(has_in, t, np.take_along_axis(later, k_next[..., None], -1)[..., 0])
            end = np.where(has_in, np.take_along_axis(down, k_in[..., None], -1)[..., 0],
                           np.take_along_axis(down, k_next[..., None], -1)[..., 0])
            # Not found among the incarnations drawn so far, yet the last one is reclaimed:
            # the answer lies in incarnations not drawn yet.
            pending = ~np.isfinite(start) & np.isfinite(down[..., -1])
            if not pending.any():
                return start, end
            self.extend()

    def joint_window(self, positions: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Like ``window`` for trials on several positions each, ``positions`` of shape
        ``(..., c, samples)``: the earliest time ``>= t`` (``(..., samples)``) at which all ``c``
        are up, and when the first of them goes down."""
        u = t
        while True:
            starts, ends = self.window(positions, np.broadcast_to(u[..., None, :], positions.shape))
            all_up = (starts == u[..., None, :]).all(axis=-2)
            latest = starts.max(axis=-2)
            settled = all_up | ~np.isfinite(latest)
            if settled.all():
                return np.where(all_up, u, np.inf), np.where(all_up, ends.min(axis=-2), np.inf)
            u = np.where(settled, u, latest)


def run_trials(schedule: PositionSchedule, positions: np.ndarray, t: np.ndarray, iters: int,
               latency: np.ndarray, startup: np.ndarray) -> np.ndarray:
    """Finish times of TRAIN nodes that checkpoint every iteration and resume after reclaims.

    Args:
        positions: ``(n, c, samples)`` — the ``c`` positions each of ``n`` trials runs on.
        t: ``(n, samples)`` — when each trial could start.
        iters: iterations each trial trains.
        latency, startup: ``(n, samples)`` — seconds per iteration and start-up of each TRAIN.
    """
    remaining = np.full(t.shape, float(iters))
    finish = np.full(t.shape, np.nan)
    todo = np.ones(t.shape, dtype=bool)
    now = t.copy()
    while todo.any():
        u, end = schedule.joint_window(positions, now)
        work = startup + remaining * latency
        fits = todo & (u + work <= end)
        finish[fits] = (u + work)[fits]
        todo &= ~fits
        # Interrupted: keep the iterations completed before the reclaim, lose the one in progress.
        done_iters = np.floor(np.maximum(end - u - startup, 0.0) / np.where(latency > 0, latency, np.inf))
        remaining = np.where(todo, remaining - np.minimum(done_iters, remaining), remaining)
        now = np.where(todo, end, now)
    return finish


@dataclass
class SpotBill:
    """What a stage's spot positions cost within the stage window."""

    instance_seconds: np.ndarray     # alive time inside [t0, t_end), per sample
    rounding_s: np.ndarray           # billed minus alive time of incarnations reclaimed in the window
    launches: np.ndarray             # incarnations launched within the window (data cost)


def bill_window(schedule: PositionSchedule, rows: np.ndarray, t0: np.ndarray, t_end: np.ndarray, billing,
                carried: np.ndarray) -> SpotBill:
    """Bill the incarnations of positions ``rows`` within ``[t0, t_end)``.

    Alive time inside the window; for incarnations reclaimed inside it, the rounding up of
    their whole life (granularity, minimum); and the launches whose SCALE ended inside it —
    replacements, and a carried position's pending replacement (``carried``: positions held
    from an earlier stage; a position launched at this stage's start is counted by the caller).
    """
    from rubberband.simulator.engine import billed_seconds

    start, down = schedule.start[rows], schedule.down[rows]                   # (r, samples, K)
    lo, hi = t0[None, :, None], t_end[None, :, None]
    alive = np.clip(np.minimum(down, hi) - np.maximum(start, lo), 0.0, None)
    reclaimed = (down >= lo) & (down < hi) & (start < down)
    life = np.where(reclaimed, down - start, 0.0)
    rounding = np.where(reclaimed, billed_seconds(life, billing) - life, 0.0)
    launched = (start >= lo) & (start < hi)
    launched[..., 0] &= np.asarray(carried, dtype=bool)[rows][:, None]
    return SpotBill(alive.sum(axis=(0, 2)), rounding.sum(axis=(0, 2)), launched.sum(axis=(0, 2)))


def trial_positions(shape, gpus_per_instance: int) -> np.ndarray:
    """``(n, c)``: the instance positions of each of a stage's running trials (DESIGN §4's
    packing: ``floor(G / m)`` trials to an instance, or ``ceil(m / G)`` whole instances each)."""
    m, G = shape.gpus_per_trial, gpus_per_instance
    n = shape.running
    if m <= G:
        return (np.arange(n) // (G // m))[:, None]
    c = -(-m // G)
    return np.arange(n * c).reshape(n, c)


def run_stage(schedule: PositionSchedule, shape, gpus_per_instance: int, ready: np.ndarray, latency: np.ndarray,
              startup: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Finish time of a stage's last TRAIN and the summed TRAIN time, per sample, on positions
    that may be reclaimed. Trials start at ``ready``; when trials queue (``a < n``) each GPU
    takes the next queued trial as soon as it frees up, as on on-demand instances."""
    samples = ready.shape[0]
    positions = trial_positions(shape, gpus_per_instance)
    if shape.running >= shape.num_trials:
        pos = np.broadcast_to(positions[:, :, None], (*positions.shape, samples))
        t = np.broadcast_to(ready, (shape.num_trials, samples))
        finish = run_trials(schedule, pos, t, shape.iters, latency, startup)
        return finish.max(axis=0), (finish - t).sum(axis=0)
    free = np.broadcast_to(ready[:, None], (samples, shape.running)).copy()
    slot_position = positions[:, 0]
    rows = np.arange(samples)
    busy = np.zeros(samples)
    for j in range(shape.num_trials):
        gpu = free.argmin(axis=1)
        start = free[rows, gpu]
        finish = run_trials(schedule, slot_position[gpu][None, None, :], start[None, :], shape.iters,
                            latency[j][None, :], startup[j][None, :])[0]
        free[rows, gpu] = finish
        busy += finish - start
    return free.max(axis=1), busy
