"""Spot reclaims in the simulator (DESIGN §4.1), vectorised over Monte-Carlo samples.

A stage's instances are *positions*: on-demand positions first, then spot ones, each oldest
first. A spot position lives through successive *incarnations*: incarnation ``k`` is billed
from ``start[k]`` (the end of its SCALE) until it is reclaimed at ``down[k]``; work can run on
it from ``up[k] = max(start[k] + INIT, down[k-1])`` until ``down[k]``. After a reclaim the
position is refilled at once:

* ``rate_per_hour`` λ: ``down[k] = start[k] + Exp(λ)``; the replacement is requested at
  ``max(down[k] - notice_s, start[k])`` — with a notice, provisioning overlaps the notice —
  and its SCALE and INIT are drawn like any launch. Nothing new starts on a noticed
  instance: one noticed before it was ready is never used, and its replacement is used as
  soon as it is ready (else from the reclaim on: the trial there trains until then). An
  instance held from an earlier stage was not noticed by the stage's start (else its
  replacement is what is held), so, lifetimes being memoryless, its remaining life is
  ``notice_s + Exp(λ)`` from the stage's start, which keeps stages independent. A notice
  that comes before a SYNC for a reclaim after it: the replacement is requested all the
  same (billed from its SCALE end), the noticed instance is released at the SYNC (nothing
  runs on it any more) and the replacement is what the position holds from then on.
* ``trace``: the zone's availability is replayed from a random offset per sample. Every spot
  instance of the zone is reclaimed when it turns unavailable; a replacement (like a first
  request) waits until capacity returns, then provisions. A notice does not help here: the
  zone as a whole is gone. On a gang trace of ``n`` instances the count is a cap: the j-th
  spot position is up only while at least ``j + 1`` are available (``trace_need``).

A TRAIN on positions ``P`` (several when a trial spans instances) runs while all of them are
up. Interrupted at ``r`` it keeps its completed iterations, loses the one in progress, and
resumes on the replacements once they are up, paying ``trial_startup_s`` again. On-demand
positions are never interrupted (``down = inf``).

Random numbers. The first lifetime of the ``j``-th spot position in a stage is row ``j`` of a
numpy stream of the stage. A replacement, incarnation ``k >= 1`` of that position in
Monte-Carlo sample ``s``, draws its lifetime, SCALE and INIT from a counter-based generator:
a SplitMix64 hash of ``(seed, stage, component, k)`` and ``(j, s)``, turned into the
distribution by its inverse CDF. Each number depends only on those indices, so incarnations are drawn lazily and only
for the (position, sample) pairs that reach them — a replacement exists in a few per cent of
pairs — and plans that hold more instances, or a replay of one sample, read the very same
numbers for the positions they have in common.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy.special import ndtri

from rubberband.errors import SpecError
from rubberband.profiles.cloud import Billing, CloudProfile
from rubberband.profiles.distributions import Size
from rubberband.profiles.spot import SpotMarket
from rubberband.simulator.model import StageShape, billed_seconds

# Stream ids of the spot components, apart from the per-stage ones in ``model.py`` (0..4).
_LIFE, _RESCALE, _REINIT, _OFFSET = 10, 11, 12, 13
# Incarnations of one position in one stage past which no trial is making progress: the
# instances are reclaimed faster than they can be replaced and do any work.
MAX_INCARNATIONS = 2000
# SplitMix64's increment and output multipliers.
_GOLDEN, _MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _rng(seed: int, stage: int, component: int) -> np.random.Generator:
    """The numpy stream of one component of one stage's spot draws (trace offsets, first lives)."""
    # The trailing 0 keeps the streams these numbers were drawn from before replacements were
    # counter-based: a seed's samples without a replacement in a stage read what they read then.
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(stage, component, 0))))


@lru_cache(maxsize=4096)
def _key(seed: int, stage: int, component: int, k: int) -> np.uint64:
    """The hash key of one component of incarnation ``k`` in one stage (cached: a SeedSequence
    costs more than drawing the few replacements most keys are used for)."""
    key: np.uint64 = np.random.SeedSequence(seed, spawn_key=(stage, component, k)).generate_state(1, np.uint64)[0]
    return key


def counter(rows: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """The SplitMix64 counter of each ``(row, sample)`` pair, before its key is added."""
    z: np.ndarray = np.left_shift(np.asarray(rows).astype(np.uint64), np.uint64(32))
    z |= np.asarray(samples).astype(np.uint64)
    z *= _GOLDEN
    return z


def counter_uniform(keys: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Uniforms in (0, 1), one per key and pair, ``keys.shape + count.shape``: SplitMix64 of
    each pair's ``counter`` under each key (several components in one pass)."""
    # In place: these arrays can be as large as a stage's positions times samples.
    z = np.add.outer(np.asarray(keys, dtype=np.uint64), count)
    for shift, mix in ((30, _MIX1), (27, _MIX2)):
        z ^= z >> np.uint64(shift)
        z *= mix
    z ^= z >> np.uint64(31)
    z >>= np.uint64(11)
    u: np.ndarray = z.astype(float)
    u += 0.5
    u *= 2.0 ** -53
    return u


class _Counter:
    """The few ``numpy.random.Generator`` methods the latency distributions call, answered by
    inverse CDF from one given uniform per element: ``Distribution.sample`` reads counter-based
    numbers without knowing it (and a family it does not cover fails loudly)."""

    def __init__(self, uniforms: np.ndarray):
        self.u = uniforms

    def _fit(self, size: Size) -> np.ndarray:
        if (size if isinstance(size, int) else math.prod(size)) != self.u.size:
            raise ValueError(f"counter-based draw of {size} values from {self.u.size} uniforms")
        return self.u.reshape(size)

    def standard_exponential(self, size: Size) -> np.ndarray:
        return np.asarray(-np.log(self._fit(size)))

    def normal(self, loc: float, scale: float, size: Size) -> np.ndarray:
        return np.asarray(loc + scale * ndtri(self._fit(size)))

    def lognormal(self, mean: float, sigma: float, size: Size) -> np.ndarray:
        return np.asarray(np.exp(mean + sigma * ndtri(self._fit(size))))

    def choice(self, a: np.ndarray, size: Size, replace: bool = True) -> np.ndarray:
        a = np.asarray(a)
        return a[np.minimum((self._fit(size) * len(a)).astype(np.intp), len(a) - 1)]


def check_trace_cap(market: SpotMarket, spot: list[int] | np.ndarray, stages: list[int] | None = None) -> None:
    """A gang trace of ``n`` instances caps how many spot instances can be held: refuse a plan
    that holds more in some stage (its extra ones would never be granted). ``spot`` holds the
    spot instances of stages ``stages`` (default: every stage, from 0)."""
    trace = market.trace
    if trace is None or trace.nodes == 1:
        return
    for i, s in zip(range(len(spot)) if stages is None else stages, spot):
        if s > trace.nodes:
            raise SpecError(f"spot.preemption.trace.nodes: zone {trace.zone}'s {trace.nodes}-instance trace caps spot "
                            f"instances at {trace.nodes}, and stage {i} holds {s}; hold at most {trace.nodes} "
                            "spot instances a stage (spot_instances), or use a single-instance trace")


def trace_need(market: SpotMarket, ranks: np.ndarray) -> np.ndarray:
    """Instances a zone must have available for the spot instances of ``ranks`` (0 = the oldest)
    to be held: 1 on a single-instance trace (the zone is up or it is not), ``rank + 1`` on a
    gang trace, whose count caps how many are held (the newest ranks go first)."""
    ranks = np.asarray(ranks)
    return ranks + 1 if market.trace is not None and market.trace.nodes > 1 else np.ones_like(ranks)


def zone_next(market: SpotMarket, t: np.ndarray, offset: np.ndarray, up: bool, need: np.ndarray | int) -> np.ndarray:
    """The first time ``>= t`` (in a job's clock, the trace read from ``offset``) at which at least
    ``need`` instances are available (``up``) or fewer are (not ``up``); ``inf`` stays ``inf``.
    ``offset`` and ``need`` broadcast to ``t``'s shape."""
    trace = market.trace
    if trace is None:
        raise ValueError("zone_next: a market without a trace has no zone to wait for")
    t = np.asarray(t, dtype=float)
    out = np.full(t.shape, np.inf)
    finite = np.isfinite(t)
    shift = np.broadcast_to(offset, t.shape)[finite]
    at = t[finite] + shift
    if trace.nodes == 1:
        found = trace.next_change(at, up=up)
    else:                                  # one pass per rank's need on a gang trace
        wanted = np.broadcast_to(need, t.shape)[finite]
        found = np.empty(at.shape)
        for n in np.unique(wanted):
            mask = wanted == n
            found[mask] = trace.next_change(at[mask], up=up, at_least=int(n))
    # Already so at ``t``: ``t`` itself, not ``t + offset - offset`` rounded a hair off it (an
    # instance launched into a zone already gone must live 0 s, not 1e-14 s billed a minimum).
    out[finite] = np.where(found == at, t[finite], found - shift)
    return out


def grant_times(market: SpotMarket, t: np.ndarray, offsets: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """When a first request made at ``t`` for spot instances of ``ranks`` is granted, per
    rank and sample ``(len(ranks), samples)``: at once on a rate market; on a trace market once
    the zone has capacity for the rank (then the SCALE begins)."""
    shape = (len(ranks), np.shape(t)[0])
    if market.trace is None:
        return np.broadcast_to(t, shape)
    if market.trace.nodes == 1:            # one zone: the same moment for every rank
        return np.broadcast_to(zone_next(market, t, offsets, up=True, need=1), shape)
    return zone_next(market, np.broadcast_to(t, shape), offsets, up=True, need=trace_need(market, ranks)[:, None])


def trace_offsets(market: SpotMarket, seed: int, samples: int) -> np.ndarray:
    """Where in the zone's trace each Monte-Carlo sample's job starts (uniform over the trace)."""
    if market.trace is None:
        return np.zeros(samples)
    return _rng(seed, 0, _OFFSET).uniform(0.0, market.trace.duration_s, samples)


class PositionSchedule:
    """The incarnations of a stage's instance positions, per sample, drawn on demand.

    Incarnation 0 of every position is held as dense ``(positions, samples)`` arrays
    (``start0``, ``up0``, ``down0``). Later ones are drawn only for the (position, sample)
    pairs asked for, by ``incarnation(k, flat)`` with flat indices ``position * samples +
    sample``; callers walk ``k`` upwards from 0, so the one before is always there.
    On-demand positions have a single incarnation that is never reclaimed.
    """

    def __init__(self, cloud: CloudProfile, market: SpotMarket, seed: int, stage: int, t0: np.ndarray,
                 start: np.ndarray, up: np.ndarray, spot: np.ndarray, offset: np.ndarray,
                 sample_ids: np.ndarray | None = None, sample_count: int | None = None,
                 held: np.ndarray | None = None):
        """
        Args:
            t0: the stage's start per sample, ``(samples,)``.
            start, up: per position, the current incarnation's SCALE end and ready time
                ``(positions, samples)`` (``-inf`` start for instances from long ago is fine).
            spot: per position, whether it is a spot instance ``(positions,)``.
            offset: each sample's offset into the zone's trace (trace market only).
            sample_ids: which Monte-Carlo samples the columns are (default ``0..samples-1``):
                a replay of one sample passes its number and reads that sample's draws.
            sample_count: how many samples the run they are from has (default: the columns).
            held: per position, whether it was held into the stage from before (not launched
                by it; default: those whose SCALE ended by the stage's start).
        """
        self.cloud, self.market, self.seed, self.stage = cloud, market, int(seed), int(stage)
        self.spot = np.asarray(spot, dtype=bool)
        self.offset = np.asarray(offset, dtype=float)
        self.t0 = t0
        positions, self.samples = np.shape(start)
        self.ids = np.arange(self.samples) if sample_ids is None else np.asarray(sample_ids)
        # The j-th spot position, oldest first, reads the numbers of row j: plans that hold more
        # instances share the draws of the ones they have in common.
        self._rows = np.flatnonzero(self.spot)
        self._row = np.zeros(positions, dtype=np.int64)
        self._row[self._rows] = np.arange(len(self._rows))
        self._mean_life = 3600.0 / market.rate_per_hour if market.rate_per_hour > 0 else np.inf
        # How long before its reclaim an instance is noticed: a trace's zone goes all at once, unnoticed.
        self.notice_s = float(market.notice_s) if market.trace is None else 0.0
        check_trace_cap(market, [len(self._rows)], stages=[self.stage])
        self._need = trace_need(market, self._row)          # per position (trace markets)
        first_down = np.full((positions, self.samples), np.inf)
        rows = self._rows
        if market.trace is not None and len(rows):
            since = np.maximum(start[rows], t0)
            if market.trace.nodes == 1:
                # One zone: every instance alive at the stage's start (or launched before the zone
                # next goes down) is reclaimed then; only the others need a search of their own.
                down = np.broadcast_to(zone_next(market, t0, self.offset, up=False, need=1), since.shape).copy()
                late = since >= down
                down[late] = zone_next(market, since[late], np.broadcast_to(self.offset, since.shape)[late], up=False,
                                       need=1)
                first_down[rows] = down
            else:
                first_down[rows] = zone_next(market, since, self.offset, up=False, need=self._need[rows][:, None])
        elif market.rate_per_hour > 0 and len(rows):
            # Every position's first life is needed: one numpy stream, row j for the j-th spot position.
            total = self.samples if sample_count is None else int(sample_count)
            life = _rng(seed, stage, _LIFE).standard_exponential((len(rows), total))
            if sample_ids is not None:
                life = life[:, self.ids]
            # Held from before the stage (not noticed by its start): notice_s + Exp from then.
            before = (start <= t0) if held is None else np.asarray(held, dtype=bool)[:, None]
            first_down[rows] = np.where(before[rows], t0 + self.notice_s, start[rows]) + life * self._mean_life
        self.start0 = np.asarray(start, dtype=float)
        self.ready0 = np.broadcast_to(np.asarray(up, dtype=float), first_down.shape)
        self.up0 = self._usable(self.ready0, first_down)
        self.down0 = first_down
        # Per k >= 1, flat: (drawn, start, up, down, ready): ``up`` when work may run on it, ``ready`` its INIT's end.
        self._later: list[tuple[np.ndarray, ...]] = []

    def noticed(self, start: np.ndarray, down: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Whether an incarnation launched at ``start`` and reclaimed at ``down`` was noticed (or,
        with no notice, reclaimed) before ``t``: its replacement was requested by then."""
        return np.asarray(np.maximum(down - self.notice_s, start) < t)

    def _usable(self, up: np.ndarray, down: np.ndarray) -> np.ndarray:
        """When work may start on an incarnation ready at ``up`` and reclaimed at ``down``:
        ``down`` (never) if it was reclaimed, or noticed, before it was ready."""
        return np.where(down - self.notice_s <= up, down, np.minimum(up, down))

    def _draw(self, components: tuple[int, ...], k: int, count: np.ndarray) -> list[_Counter]:
        """Incarnation ``k``'s numbers of each of ``components`` for pairs of ``counter``s."""
        keys = [_key(self.seed, self.stage, c, k) for c in components]
        return [_Counter(u) for u in counter_uniform(np.array(keys, dtype=np.uint64), count)]

    def _counter(self, positions: np.ndarray, columns: np.ndarray) -> np.ndarray:
        return counter(self._row[positions], self.ids[columns])

    def incarnation(self, k: int, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """SCALE end, ready time and reclaim of incarnation ``k`` of the (position, sample) pairs
        ``flat`` (``position * samples + sample``); ``inf`` for one that never comes."""
        if k == 0:
            return self.start0.ravel()[flat], self.up0.ravel()[flat], self.down0.ravel()[flat]
        while len(self._later) < k:
            if len(self._later) >= MAX_INCARNATIONS:
                m = self.market
                cause = f"rate_per_hour {m.rate_per_hour:g}" if m.trace is None else f"zone {m.trace.zone}'s available stretches"
                raise SpecError(f"spot.preemption: spot instances are reclaimed faster than they can start and train "
                                f"({cause}; over {MAX_INCARNATIONS} replacements of one instance in stage {self.stage}); "
                                "lower the rate, choose another zone, or plan on-demand")
            # Only the pairs drawn are ever written or read: untouched pages cost nothing.
            size = self.start0.size
            self._later.append((np.zeros(size, dtype=bool), np.empty(size), np.empty(size), np.empty(size),
                                np.empty(size)))
        drawn, starts, ups, downs, _ = self._later[k - 1]
        missing = flat[~drawn[flat]]
        if missing.size > 4096:
            # Trials packed on one instance ask for its pairs several times over: draw each once.
            seen = np.zeros(drawn.size, dtype=bool)
            seen[missing] = True
            missing = np.flatnonzero(seen)
        if missing.size:
            self._fill(k, missing, *self.incarnation(k - 1, missing))
        return starts[flat], ups[flat], downs[flat]

    def ready(self, k: int, flat: np.ndarray) -> np.ndarray:
        """When incarnation ``k`` of the pairs ``flat`` (drawn already) is ready: its INIT's end."""
        return np.asarray(self.ready0.ravel()[flat] if k == 0 else self._later[k - 1][4][flat])

    def _fill(self, k: int, flat: np.ndarray, prev_start: np.ndarray, prev_up: np.ndarray, prev_down: np.ndarray) -> None:
        """Draw incarnation ``k`` of pairs ``flat``, which replaces the one reclaimed at ``prev_down``."""
        position, column = np.divmod(flat, self.samples)
        size = flat.size
        rate = self.market.trace is None
        draws = self._draw((_RESCALE, _REINIT, _LIFE) if rate else (_RESCALE, _REINIT), k,
                           self._counter(position, column))
        scale = self.cloud.provision_latency_s.sample(draws[0], size)
        init = self.cloud.init_latency_s.sample(draws[1], size)
        if rate:                           # requested at the notice, not before the instance started
            start = np.maximum(prev_down - self.notice_s, prev_start) + scale
            down = start + draws[2].standard_exponential(size) * self._mean_life
        else:                              # the zone is gone: wait for capacity, then provision
            offset, need = self.offset[column], self._need[position]
            start = zone_next(self.market, prev_down, offset, up=True, need=need) + scale
            down = zone_next(self.market, start, offset, up=False, need=need)
        drawn, starts, ups, downs, readies = self._later[k - 1]
        drawn[flat], starts[flat], downs[flat], readies[flat] = True, start, down, start + init
        # A trial on the one before trains there until its reclaim; one never used leaves nothing to wait for.
        used = prev_up < prev_down
        ups[flat] = self._usable(np.where(used, np.maximum(start + init, prev_down), start + init), down)

    def chain(self, position: int, sample: int, until: float) -> list[tuple[float, float, float, float]]:
        """``(start, up, down, ready)`` of a position's incarnations in one sample, up to the one
        alive (or provisioning) and not noticed at ``until``: what a timeline draws."""
        flat, out = np.array([position * self.samples + sample]), []
        for k in range(MAX_INCARNATIONS + 1):
            start, up, down = (float(x[0]) for x in self.incarnation(k, flat))
            out.append((start, up, down, float(self.ready(k, flat)[0])))
            if not self.noticed(np.array(start), np.array(down), np.array(until)):
                return out
        return out

    def current(self, rows: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per position of ``rows``: SCALE end and ready time of the incarnation alive (or still
        provisioning) at ``t`` — the first one not reclaimed, nor noticed, by then (a noticed
        one is released at the SYNC ``t``: its replacement goes on). ``(len(rows), samples)``."""
        start, up = self.start0[rows].copy(), self.ready0[rows].copy()
        out = np.flatnonzero(self.noticed(start, self.down0[rows], t) & np.isfinite(t))    # into the (rows, samples) output
        flat = rows[out // self.samples] * self.samples + out % self.samples
        k = 1
        while out.size:
            s, _, d = self.incarnation(k, flat)
            start.ravel()[out], up.ravel()[out] = s, self.ready(k, flat)
            later = self.noticed(s, d, t[out % self.samples])
            out, flat, k = out[later], flat[later], k + 1
        return start, up

    def window(self, pos: np.ndarray, sample: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For position ``pos`` in Monte-Carlo sample ``sample`` at time ``t`` (arrays of one
        shape): the earliest time ``>= t`` it is up, and when that up period ends."""
        shape = np.shape(t)
        flat, tt = (np.asarray(pos) * self.samples + np.asarray(sample)).ravel(), np.asarray(t, dtype=float).ravel()
        start, end = np.full(tt.size, np.inf), np.full(tt.size, np.inf)
        todo, k = np.arange(tt.size), 0
        while todo.size:
            _, u, d = self.incarnation(k, flat[todo])
            at = tt[todo]
            # The first up period not over by ``t`` (one reclaimed before it was ready has none).
            settled = (d > at) & ((u < d) | np.isinf(d))
            start[todo[settled]], end[todo[settled]] = np.maximum(u, at)[settled], d[settled]
            todo, k = todo[~settled], k + 1
        return start.reshape(shape), end.reshape(shape)

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
               latency: np.ndarray, startup: np.ndarray | float, log: list[tuple[Any, ...]] | None = None) -> np.ndarray:
    """Finish times of TRAIN nodes that checkpoint every iteration and resume after reclaims.

    Args:
        positions: ``(n, c, samples)`` — the ``c`` positions each of ``n`` trials runs on.
        t: ``(n, samples)`` — when each trial could start.
        iters: iterations each trial trains.
        latency, startup: ``(n, samples)`` — seconds per iteration and start-up of each TRAIN
            (a constant start-up may be one number).
        log: if given, each attempt is appended as arrays ``(trial, sample, start, stop,
            checkpoint, finished)``: it ran from ``start`` to ``stop``, and unless it finished,
            the work after its last checkpoint was lost at ``stop`` (a reclaim).

    Each (trial, sample) runs through its up periods in order: it finishes in one if its work
    fits, else it keeps the iterations completed before the period ends and loses the one in
    progress. Only the interrupted ones go round again. One that can never finish (its zone
    never has capacity again) finishes at ``inf``.
    """
    n, c, S = positions.shape
    per_iter = np.broadcast_to(latency, (n, S))
    boot = np.broadcast_to(startup, (n, S))
    now = np.broadcast_to(t, (n, S))
    if c == 1 and (positions.strides[2] == 0 or (positions[:, 0, :] == positions[:, 0, :1]).all()):
        # The usual first look, whole rows at a time: most TRAINs fit in their position's
        # current up period; only the others go on below. In place: these are large arrays.
        rows = positions[:, 0, 0]
        begin = np.maximum(schedule.up0[rows], now)
        finish: np.ndarray = np.multiply(per_iter, float(iters))
        finish += boot
        finish += begin
        reclaim = schedule.down0[rows]
        active = finish > reclaim
        if log is not None:
            trial, sample = np.nonzero(~active)
            log.append((trial, sample, begin[trial, sample], finish[trial, sample], finish[trial, sample],
                        np.ones(trial.size, dtype=bool)))
        finish[active] = np.inf
    else:
        finish = np.full((n, S), np.inf)
        active = np.ones((n, S), dtype=bool)
        begin = None
    # Then element by element, only the (trial, sample) pairs a reclaim interrupted.
    idx = np.flatnonzero(active)
    # Their first up period is the one the first look just tried.
    first = None if begin is None else (begin.ravel()[idx], reclaim.ravel()[idx])
    trial, sample = np.divmod(idx, S)
    pos = positions[trial, :, sample]                                  # (E, c)
    at, lat, b = now[trial, sample], per_iter[trial, sample], boot[trial, sample]
    left = np.full(idx.size, float(iters))
    out = finish.reshape(-1)
    k = 0
    while idx.size:
        if c == 1:          # one position: its k-th incarnation is the next up period to try
            if k == 0 and first is not None:
                u, end = first
            else:
                _, up, end = schedule.incarnation(k, pos[:, 0] * S + sample)
                u = np.maximum(up, at)
            k += 1
        else:
            u, end = schedule.joint_window(pos, sample, at)
        before = left.copy() if log is not None else None
        done, keep = _attempt(u, end, at, left, lat, b)
        if log is not None:
            ran = u < end
            finished = np.isfinite(done)
            kept = before - left          # iterations checkpointed; none: the start-up was lost too
            checkpoint = np.where(finished, done, np.where(kept > 0, u + b + kept * lat, u))
            log.append((idx[ran] // S, sample[ran], u[ran], np.where(finished, done, end)[ran], checkpoint[ran],
                        finished[ran]))
        out[idx] = np.where(keep, out[idx], done)
        idx, pos, sample, at, left, lat, b = (x[keep] for x in (idx, pos, sample, at, left, lat, b))
    return finish


def _attempt(u: np.ndarray, end: np.ndarray, now: np.ndarray, remaining: np.ndarray, latency: np.ndarray,
             startup: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def bill_window(schedule: PositionSchedule, rows: np.ndarray, t0: np.ndarray, t_end: np.ndarray, billing: Billing,
                carried: np.ndarray) -> SpotBill:
    """Bill the incarnations of positions ``rows`` within ``[t0, t_end)``.

    Alive time inside the window; for incarnations reclaimed inside it, the rounding up of
    their whole life (granularity, minimum); and the launches whose SCALE ended inside it —
    replacements, and a carried position's pending replacement (``carried``: positions held
    from an earlier stage; a position launched at this stage's start is counted by the caller).
    A replacement exists only if the one before it is noticed (or reclaimed) within the
    window: a position released (or carried on) before its notice asks for none here. One
    noticed before ``t_end`` and reclaimed after it is released at the SYNC (its replacement
    is requested already: the position goes on with it). The first incarnation was billed
    up to ``t0`` by the stages before.
    """
    S = schedule.samples
    start, down = schedule.start0[rows], schedule.down0[rows]
    alive = np.clip(np.minimum(down, t_end) - np.maximum(start, t0), 0.0, None).sum(axis=0)
    gone = schedule.noticed(start, down, t_end)        # noticed (or reclaimed) within the window
    off = np.minimum(down, t_end)                      # reclaimed, or released at the SYNC
    ended = gone & (start < off)                       # ... after it had started (billed)
    _, column = np.nonzero(ended)                      # a few of every position and sample
    life = off[ended] - start[ended]
    rounding = np.bincount(column, billed_seconds(life, billing) - life, minlength=S)
    reclaims = np.bincount(column, (down < t_end)[ended], minlength=S).astype(float)
    first = (start >= t0) & (start < t_end) & np.asarray(carried, dtype=bool)[rows][:, None]
    launches = first.sum(axis=0).astype(float)
    # Replacements exist only behind a notice inside the window: a few pairs, walked sparsely.
    pair = np.flatnonzero(gone)
    flat, column = rows[pair // S] * S + pair % S, pair % S
    k = 1
    while flat.size:
        start, _, down = schedule.incarnation(k, flat)
        end = t_end[column]
        off = np.minimum(down, end)
        alive += np.bincount(column, np.clip(off - start, 0.0, None), minlength=S)
        gone = schedule.noticed(start, down, end)
        ended = gone & (start < off)
        life = off[ended] - start[ended]
        rounding += np.bincount(column[ended], billed_seconds(life, billing) - life, minlength=S)
        reclaims += np.bincount(column[ended], (down < end)[ended], minlength=S)
        launches += np.bincount(column[start < end], minlength=S)
        flat, column, k = flat[gone], column[gone], k + 1
    return SpotBill(alive, rounding, launches, reclaims)


def trial_positions(shape: StageShape, gpus_per_instance: int) -> np.ndarray:
    """``(n, c)``: the instance positions of each of a stage's running trials (DESIGN §4's
    packing: ``floor(G / m)`` trials to an instance, ``k * G`` when ``k`` share a GPU, or
    ``ceil(m / G)`` whole instances each). A reclaim interrupts every trial on the instance."""
    m, G = shape.gpus_per_trial, gpus_per_instance
    n = shape.running
    if m <= G:
        return (np.arange(n) // (G // m * shape.trials_per_gpu))[:, None]
    c = -(-m // G)
    return np.arange(n * c).reshape(n, c)


def run_stage(schedule: PositionSchedule, shape: StageShape, gpus_per_instance: int, ready: np.ndarray,
              latency: np.ndarray, startup: np.ndarray | float, rounds: bool = False,
              log: list[tuple[Any, ...]] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Finish time of a stage's last TRAIN and the summed TRAIN time, per sample, on positions
    that may be reclaimed. Trials start at ``ready``; when trials queue (``a < n``) each GPU
    takes the next queued trial as soon as it frees up, as on on-demand instances. A fused
    stage runs its groups as trials (``StageShape.nodes``; a reclaim interrupts the whole group,
    and every member resumes from its checkpoint with the group).

    ``rounds=True`` (the planner's stage means) queues trials round-robin instead — trial ``j``
    on GPU ``j mod a``, one vectorised call per round — which is list scheduling exactly when
    the trials of a round take equally long, and a close, much faster surrogate otherwise.

    ``log`` (not with ``rounds``): if given, every attempt of every TRAIN is appended as arrays
    ``(trial, slot, sample, start, stop, checkpoint, finished)`` (``run_trials``), ``slot``
    being the running-trial slot (GPU slot when trials queue) whose positions it ran on.
    """
    samples = ready.shape[0]
    positions = trial_positions(shape, gpus_per_instance)
    if rounds and shape.running < shape.nodes:
        a, free = shape.running, np.broadcast_to(ready, (shape.running, samples)).copy()
        busy = np.zeros(samples)
        pos = np.broadcast_to(positions[:, :, None], (*positions.shape, samples))
        for first in range(0, shape.nodes, a):
            batch = np.arange(first, min(first + a, shape.nodes))
            g = batch - first
            boot = startup if np.ndim(startup) == 0 else np.asarray(startup)[batch]
            finish = run_trials(schedule, pos[g], free[g], shape.iters, latency[batch], boot)
            busy += (finish - free[g]).sum(axis=0)
            free[g] = finish
        return free.max(axis=0), busy
    attempts: list[tuple[Any, ...]] = []
    if shape.running >= shape.nodes:
        pos = np.broadcast_to(positions[:, :, None], (*positions.shape, samples))
        t = np.broadcast_to(ready, (shape.nodes, samples))
        finish = run_trials(schedule, pos, t, shape.iters, latency, startup, attempts if log is not None else None)
        if log is not None:
            log.extend((trial, trial, *rest) for trial, *rest in attempts)
        return finish.max(axis=0), (finish - t).sum(axis=0)
    free = np.broadcast_to(ready[:, None], (samples, shape.running)).copy()
    slot_position = positions[:, 0]
    rows = np.arange(samples)
    busy = np.zeros(samples)
    for j in range(shape.nodes):
        gpu = free.argmin(axis=1)
        start = free[rows, gpu]
        boot = startup if np.ndim(startup) == 0 else np.asarray(startup)[j][None, :]
        finish = run_trials(schedule, slot_position[gpu][None, None, :], start[None, :], shape.iters,
                            latency[j][None, :], boot, attempts if log is not None else None)[0]
        if log is not None:
            log.extend((np.full(s.size, j), gpu[s], s, *rest) for _, s, *rest in attempts)
            attempts.clear()
        free[rows, gpu] = finish
        busy += finish - start
    return free.max(axis=1), busy
