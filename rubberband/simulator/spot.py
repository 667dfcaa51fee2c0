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
  afresh there, from ``max(stage start, start[k])``, which keeps stages independent; a notice
  may then reach back before the stage's start, and the replacement is billed from its SCALE
  end all the same.
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

from rubberband.errors import SpecError
from rubberband.profiles.cloud import CloudProfile
from rubberband.profiles.spot import SpotMarket
from rubberband.simulator.model import billed_seconds

# Stream ids of the spot components, apart from the per-stage ones in ``model.py`` (0..4).
_LIFE, _RESCALE, _REINIT, _OFFSET = 10, 11, 12, 13
_CHUNK = 2                     # incarnations drawn at a time, per spot position
# Incarnations of one position in one stage past which no trial is making progress: the
# instances are reclaimed faster than they can be replaced and do any work.
MAX_INCARNATIONS = 2000


def _rng(seed: int, stage: int, component: int, chunk: int = 0) -> np.random.Generator:
    """The stream of one component of one stage's spot draws; each chunk of incarnations has its own."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(stage, component, chunk))))


def trace_offsets(market: SpotMarket, seed: int, samples: int) -> np.ndarray:
    """Where in the zone's trace each Monte-Carlo sample's job starts (uniform over the trace)."""
    if market.trace is None:
        return np.zeros(samples)
    return _rng(seed, 0, _OFFSET).uniform(0.0, market.trace.duration_s, samples)


class PositionSchedule:
    """The incarnations of a stage's instance positions, per sample, drawn on demand.

    ``starts[k]``, ``ups[k]`` and ``downs[k]`` are ``(positions, samples)`` arrays for the
    k-th incarnation of every position (``up``, ``down``, ``start`` stack them on a last axis).
    On-demand positions have a single incarnation that is never reclaimed.
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
        # Spot positions, oldest first. The j-th spot position reads row j of each stream, and
        # each chunk of incarnations has streams of its own: plans that hold more instances
        # share the draws of the ones they have in common.
        self._rows = np.flatnonzero(self.spot)
        self._chunks = 0
        self._mean_life = 3600.0 / market.rate_per_hour if market.rate_per_hour > 0 else np.inf
        first_down = np.full(start.shape, np.inf)
        rows = self._rows
        if market.trace is not None and len(rows):
            first_down[rows] = self._zone_next(np.maximum(start[rows], t0), up=False)
        elif market.rate_per_hour > 0 and len(rows):
            life = _rng(seed, stage, _LIFE, 0).standard_exponential((len(rows), start.shape[1]))
            first_down[rows] = np.maximum(start[rows], t0) + life * self._mean_life
        self.starts = [np.asarray(start, dtype=float)]
        self.ups = [np.minimum(up, first_down)]          # reclaimed before it was ever ready: never up
        self.downs = [first_down]
        self._stacked: dict[str, np.ndarray] = {}

    @property
    def start(self) -> np.ndarray:
        return self._stack("start", self.starts)

    @property
    def up(self) -> np.ndarray:
        return self._stack("up", self.ups)

    @property
    def down(self) -> np.ndarray:
        return self._stack("down", self.downs)

    def _stack(self, name: str, arrays: list[np.ndarray]) -> np.ndarray:
        cached = self._stacked.get(name)
        if cached is None or cached.shape[-1] != len(arrays):
            cached = self._stacked[name] = np.stack(arrays, axis=-1)
        return cached

    @property
    def incarnations(self) -> int:
        return len(self.downs)

    def _zone_next(self, t: np.ndarray, up: bool) -> np.ndarray:
        """The first time ``>= t`` the zone is up (or down), in the stage's clock; ``inf`` stays."""
        out = np.full(np.shape(t), np.inf)
        finite = np.isfinite(t)
        offset = np.broadcast_to(self.offset, np.shape(t))[finite]
        out[finite] = self.market.trace.next_change(t[finite] + offset, up=up) - offset
        return out

    def extend(self) -> None:
        """Draw ``_CHUNK`` more incarnations of every spot position (on-demand ones get ``inf``)."""
        if self.incarnations > MAX_INCARNATIONS:
            cause = f"rate_per_hour {self.market.rate_per_hour:g}" if self.market.trace is None else \
                f"zone {self.market.trace.zone}'s available stretches"
            raise SpecError(f"spot.preemption: spot instances are reclaimed faster than they can start and train "
                            f"({cause}; over {MAX_INCARNATIONS} replacements of one instance in stage {self.stage}); "
                            "lower the rate, choose another zone, or plan on-demand")
        self._chunks += 1
        rows = self._rows
        P, S = self.downs[0].shape
        shape = (len(rows), _CHUNK, S)
        seed, stage, j, cloud = self.seed, self.stage, self._chunks, self.cloud
        scale = cloud.provision_latency_s.sample(_rng(seed, stage, _RESCALE, j), shape)
        init = cloud.init_latency_s.sample(_rng(seed, stage, _REINIT, j), shape)
        life = _rng(seed, stage, _LIFE, j).standard_exponential(shape) * self._mean_life \
            if self.market.trace is None else None
        prev_start, prev_down = self.starts[-1][rows], self.downs[-1][rows]
        for c in range(_CHUNK):
            if life is None:      # the zone is gone: wait for capacity, then provision
                start = self._zone_next(prev_down, up=True) + scale[:, c]
                down = self._zone_next(start, up=False)
            else:                 # requested at the notice, not before the instance started
                start = np.maximum(prev_down - self.market.notice_s, prev_start) + scale[:, c]
                down = start + life[:, c]
            for arrays, value in ((self.starts, start), (self.downs, down),
                                  (self.ups, np.minimum(np.maximum(start + init[:, c], prev_down), down))):
                full = np.full((P, S), np.inf)
                full[rows] = value
                arrays.append(full)
            prev_start, prev_down = start, down

    def current(self, rows: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per position of ``rows``: SCALE end and ready time of the incarnation alive (or still
        provisioning) at ``t`` — the first one not reclaimed by then. ``(len(rows), samples)``."""
        start, up = self.starts[0][rows].copy(), self.ups[0][rows].copy()
        found = (self.downs[0][rows] >= t) | ~np.isfinite(t)
        k = 1
        while not found.all():
            if k == self.incarnations:
                self.extend()
            take = ~found
            start[take], up[take] = self.starts[k][rows][take], self.ups[k][rows][take]
            found |= self.downs[k][rows] >= t
            k += 1
        return start, up

    def window(self, pos: np.ndarray, sample: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For position ``pos`` in Monte-Carlo sample ``sample`` at time ``t`` (arrays of one
        shape): the earliest time ``>= t`` it is up, and when that up period ends."""
        while True:
            up, down = self.up[pos, sample], self.down[pos, sample]          # (..., K)
            tt = t[..., None]
            inside = (up <= tt) & (tt < down)
            later = np.where((up > tt) & (up < down), up, np.inf)
            k_in, k_next = inside.argmax(axis=-1)[..., None], later.argmin(axis=-1)[..., None]
            has_in = inside.any(axis=-1)
            start = np.where(has_in, t, np.take_along_axis(later, k_next, -1)[..., 0])
            end = np.take_along_axis(down, np.where(has_in[..., None], k_in, k_next), -1)[..., 0]
            # Not among the incarnations drawn so far, yet the last one is reclaimed: the answer
            # lies in incarnations not drawn yet.
            if not (~np.isfinite(start) & np.isfinite(down[..., -1])).any():
                return start, end
            self.extend()

    def joint_window(self, positions: np.ndarray, sample: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Like ``window`` for trials on ``c`` positions each (``positions`` of shape ``(E, c)``,
        ``sample`` and ``t`` of shape ``(E,)``): the earliest time ``>= t`` at which all are up,
        and when the first of them goes down (``inf`` and ``inf`` if never)."""
        u = t
        samples = np.broadcast_to(sample[:, None], positions.shape)
        while True:
            starts, ends = self.window(positions, samples, np.broadcast_to(u[:, None], positions.shape))
            all_up = (starts == u[:, None]).all(axis=1)
            latest = starts.max(axis=1)
            settled = all_up | ~np.isfinite(latest)
            if settled.all():
                return np.where(all_up, u, np.inf), np.where(all_up, ends.min(axis=1), np.inf)
            u = np.where(settled, u, latest)


def run_trials(schedule: PositionSchedule, positions: np.ndarray, t: np.ndarray, iters: int,
               latency: np.ndarray, startup) -> np.ndarray:
    """Finish times of TRAIN nodes that checkpoint every iteration and resume after reclaims.

    Args:
        positions: ``(n, c, samples)`` — the ``c`` positions each of ``n`` trials runs on.
        t: ``(n, samples)`` — when each trial could start.
        iters: iterations each trial trains.
        latency, startup: ``(n, samples)`` — seconds per iteration and start-up of each TRAIN
            (a constant start-up may be one number).

    Each (trial, sample) runs through its up periods in order: it finishes in one if its work
    fits, else it keeps the iterations completed before the period ends and loses the one in
    progress. Only the interrupted ones go round again. One that can never finish (its zone
    never has capacity again) finishes at ``inf``.
    """
    n, c, S = positions.shape
    per_iter = np.broadcast_to(latency, (n, S))
    boot = np.broadcast_to(startup, (n, S))
    now = np.array(np.broadcast_to(t, (n, S)), dtype=float)
    finish = np.full((n, S), np.inf)
    active = np.ones((n, S), dtype=bool)
    if c == 1 and (positions[:, 0, :] == positions[:, 0, :1]).all():
        # The usual first look, whole rows at a time: most TRAINs fit in their position's
        # current up period; only the others go on below.
        rows = positions[:, 0, 0]
        done = np.maximum(schedule.ups[0][rows], now) + (boot + iters * per_iter)
        active = ~(done <= schedule.downs[0][rows])
        np.copyto(finish, done, where=~active)
    # Then element by element, only the (trial, sample) pairs a reclaim interrupted.
    idx = np.flatnonzero(active)
    trial, sample = np.divmod(idx, S)
    pos = positions[trial, :, sample]                                  # (E, c)
    at, lat, b = now[trial, sample], per_iter[trial, sample], boot[trial, sample]
    left = np.full(idx.size, float(iters))
    out = finish.reshape(-1)
    k = 0
    while idx.size:
        if c == 1:          # one position: its k-th incarnation is the next up period to try
            if k == schedule.incarnations:
                schedule.extend()
            up, end = schedule.ups[k][pos[:, 0], sample], schedule.downs[k][pos[:, 0], sample]
            u, k = np.maximum(up, at), k + 1
        else:
            u, end = schedule.joint_window(pos, sample, at)
        done, keep = _attempt(u, end, at, left, lat, b)
        out[idx] = np.where(keep, out[idx], done)
        idx, pos, sample, at, left, lat, b = (x[keep] for x in (idx, pos, sample, at, left, lat, b))
    return finish


def _attempt(u, end, now, remaining, latency, startup):
    """Run each TRAIN in its up period ``[u, end)``: it finishes there if its work fits, else it
    keeps the iterations completed before ``end`` and loses the one in progress (``remaining``
    and ``now`` updated in place). Returns the finish times (``inf`` where not finished) and
    which go on — not those that finished, nor those with nothing after (never reclaimed)."""
    work = startup + remaining * latency
    live = u < end
    fits = live & (u + work <= end)
    finish = np.where(fits, u + work, np.inf)
    cut = live & ~fits
    done = np.floor(np.maximum(end - u - startup, 0.0) / np.where(latency > 0, latency, np.inf))
    remaining -= np.where(cut, np.minimum(done, remaining), 0.0)
    np.copyto(now, end, where=cut)
    return finish, ~fits & np.isfinite(end)


@dataclass
class SpotBill:
    """What a stage's spot positions cost within the stage window."""

    instance_seconds: np.ndarray     # alive time inside [t0, t_end), per sample
    rounding_s: np.ndarray           # billed minus alive time of incarnations reclaimed in the window
    launches: np.ndarray             # incarnations launched within the window (data cost)
    reclaims: np.ndarray             # incarnations reclaimed within the window


def bill_window(schedule: PositionSchedule, rows: np.ndarray, t0: np.ndarray, t_end: np.ndarray, billing,
                carried: np.ndarray) -> SpotBill:
    """Bill the incarnations of positions ``rows`` within ``[t0, t_end)``.

    Alive time inside the window; for incarnations reclaimed inside it, the rounding up of
    their whole life (granularity, minimum); and the launches whose SCALE ended inside it —
    replacements, and a carried position's pending replacement (``carried``: positions held
    from an earlier stage; a position launched at this stage's start is counted by the caller).
    A replacement exists only if the one before it is reclaimed within the window: a position
    released (or carried on) before its reclaim asks for none here. The first incarnation was
    billed up to ``t0`` by the stages before; a replacement whose notice reached back before
    ``t0`` is billed here from its SCALE end.
    """
    samples = t0.shape[0]
    alive, rounding = np.zeros(samples), np.zeros(samples)
    launches, reclaims = np.zeros(samples), np.zeros(samples)
    exists = np.ones((len(rows), samples), dtype=bool)
    lo = t0
    for k in range(schedule.incarnations):
        start, down = schedule.starts[k][rows], schedule.downs[k][rows]
        alive += np.where(exists, np.clip(np.minimum(down, t_end) - np.maximum(start, lo), 0.0, None), 0.0).sum(axis=0)
        gone = exists & (down < t_end)                 # reclaimed within the window
        reclaimed = gone & (start < down)              # ... after it had started (billed)
        if reclaimed.any():
            life = np.where(reclaimed, down - start, 0.0)
            rounding += np.where(reclaimed, billed_seconds(life, billing) - life, 0.0).sum(axis=0)
            reclaims += reclaimed.sum(axis=0)
        launched = exists & (start >= lo) & (start < t_end)
        if k == 0:
            launched &= np.asarray(carried, dtype=bool)[rows][:, None]
        launches += launched.sum(axis=0)
        exists = gone
        lo = np.full(samples, -np.inf)
        if not exists.any():
            break
    return SpotBill(alive, rounding, launches, reclaims)


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
              startup: np.ndarray, rounds: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Finish time of a stage's last TRAIN and the summed TRAIN time, per sample, on positions
    that may be reclaimed. Trials start at ``ready``; when trials queue (``a < n``) each GPU
    takes the next queued trial as soon as it frees up, as on on-demand instances.

    ``rounds=True`` (the planner's stage means) queues trials round-robin instead — trial ``j``
    on GPU ``j mod a``, one vectorised call per round — which is list scheduling exactly when
    the trials of a round take equally long, and a close, much faster surrogate otherwise."""
    samples = ready.shape[0]
    positions = trial_positions(shape, gpus_per_instance)
    if rounds and shape.running < shape.num_trials:
        a, free = shape.running, np.broadcast_to(ready, (shape.running, samples)).copy()
        busy = np.zeros(samples)
        pos = np.broadcast_to(positions[:, :, None], (*positions.shape, samples))
        for first in range(0, shape.num_trials, a):
            j = np.arange(first, min(first + a, shape.num_trials))
            g = j - first
            boot = startup if np.ndim(startup) == 0 else startup[j]
            finish = run_trials(schedule, pos[g], free[g], shape.iters, latency[j], boot)
            busy += (finish - free[g]).sum(axis=0)
            free[g] = finish
        return free.max(axis=0), busy
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
        boot = startup if np.ndim(startup) == 0 else startup[j][None, :]
        finish = run_trials(schedule, slot_position[gpu][None, None, :], start[None, :], shape.iters,
                            latency[j][None, :], boot)[0]
        free[rows, gpu] = finish
        busy += finish - start
    return free.max(axis=1), busy
