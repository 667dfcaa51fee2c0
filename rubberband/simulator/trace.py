"""One sampled run as a timeline of instances and trials, for Gantt charts and inspection.

``sample_timeline`` replays one Monte-Carlo sample of ``simulate`` event by event, with the
same random numbers, so its JCT and cost are that sample's. On spot instances (DESIGN §4.1)
the stage runs on the simulator's own kernel for that one sample — its instance positions'
incarnations are drawn by counter, the same numbers the whole run reads — and the timeline
adds what the kernel saw: each reclaim, the work it cost, and the replacement's SCALE, INIT
and resumed TRAIN.

Packed trials (``trials_per_gpu``) share a GPU: the ``k`` running slots of one GPU are
adjacent lanes of its instance's row. Each instance span names its ``instance_type``; a
change of type at a SYNC releases every instance there and launches the new type's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from rubberband.errors import SpecError
from rubberband.profiles.cloud import BillingModel, CloudCatalog, CloudProfile
from rubberband.profiles.model import ModelProfile
from rubberband.simulator.dag import ON_DEMAND, SPOT
from rubberband.simulator.engine import (
    check_eager_on_demand,
    layout,
    mixed_usd_per_s,
    spot_billable,
    spot_layout,
    stage_clouds,
    stage_models,
)
from rubberband.simulator.model import StageDraws, StageShape, billed_seconds
from rubberband.simulator.spot import (
    PositionSchedule,
    check_trace_cap,
    grant_times,
    run_stage,
    trace_offsets,
    trial_positions,
)
from rubberband.spec.experiment import ExperimentSpec


@dataclass(frozen=True)
class InstanceSpan:
    instance: int          # launch number in the job
    requested_s: float     # SCALE start (a replacement's request, at the notice)
    launched_s: float      # SCALE end: billing starts
    ready_s: float         # INIT_INSTANCE end
    released_s: float      # released after a SYNC, or reclaimed
    market: str = ON_DEMAND
    reclaimed_s: float | None = None    # when the cloud took it back (then ``released_s``)
    replaces: int | None = None         # the reclaimed instance this one replaces
    instance_type: str = ""

    @property
    def cancelled(self) -> bool:
        """A replacement released while still provisioning: never launched, never billed."""
        return self.reclaimed_s is None and self.released_s <= self.launched_s


@dataclass(frozen=True)
class TrialSpan:
    stage: int
    trial: int
    instances: tuple[int, ...]   # every instance the trial's GPUs are on (launch numbers)
    lane: int              # which of the instance's trial slots it takes (0 when it spans instances)
    gpus: int              # GPUs per trial (1 when packed)
    start_s: float
    end_s: float
    lost_from_s: float | None = None    # interrupted by a reclaim at ``end_s``: work after this checkpoint is lost
    trials_per_gpu: int = 1      # k trials share its GPU (lanes ``k * g .. k * g + k - 1`` are GPU ``g``)
    fused: int = 1               # members of the fused group this TRAIN trains (``trial`` is then the group)

    @property
    def gpu(self) -> int:
        """Which GPU of its instance the trial is on (its first, when it has several)."""
        return self.lane // self.trials_per_gpu * self.gpus


@dataclass(frozen=True)
class Timeline:
    instances: tuple[InstanceSpan, ...]
    trials: tuple[TrialSpan, ...]        # one per TRAIN, or per attempt when reclaims interrupt it
    stages: tuple[tuple[float, float, float], ...]   # (start, trials start, SYNC end) per stage
    jct_s: float
    sample: int = 0        # which of ``samples`` Monte-Carlo samples this is
    samples: int = 1
    cost_usd: float = math.nan

    @property
    def reclaims(self) -> int:
        """Instances reclaimed after they launched (as ``SimResult`` counts them; one taken back
        during its SCALE never ran)."""
        return sum(s.reclaimed_s is not None and s.reclaimed_s > s.launched_s for s in self.instances)


def median_sample(jct_s: npt.ArrayLike) -> int:
    """Index of the median sample by JCT (the lower middle one for an even count): a typical
    run to draw, where sample 0 may sit anywhere in the distribution."""
    order = np.argsort(np.asarray(jct_s), kind="stable")
    return int(order[(len(order) - 1) // 2])


class _Held:
    """An instance while the replay holds it (mutable until it becomes an ``InstanceSpan``)."""

    def __init__(self, iid: int, market: str, requested: float, launched: float, ready: float,
                 replaces: int | None = None, instance_type: str = ""):
        self.iid, self.market, self.replaces, self.instance_type = iid, market, replaces, instance_type
        self.requested, self.launched, self.ready = requested, launched, ready
        self.released: float | None = None
        self.reclaimed: float | None = None

    def span(self) -> InstanceSpan:
        released, reclaimed = self.released, self.reclaimed
        if released is None:
            raise RuntimeError(f"instance {self.iid} is still held: release it before taking its span")
        if reclaimed is not None:
            # Taken back by the time its SCALE ended (a trace zone gone during the SCALE): it never ran.
            released = reclaimed = max(reclaimed, self.launched)
        # Released or reclaimed while still initialising: it never became ready.
        ready = min(max(self.ready, self.launched), released) if released >= self.launched else self.ready
        return InstanceSpan(self.iid, self.requested, self.launched, ready, released, self.market, reclaimed,
                            self.replaces, self.instance_type)


def sample_timeline(spec: ExperimentSpec, allocation: Sequence[int], model: ModelProfile | Mapping[str, ModelProfile],
                    cloud: CloudProfile | CloudCatalog | Mapping[str, CloudProfile],
                    seed: int = 0, instances: Sequence[int] | None = None, samples: int = 1,
                    sample: int = 0, spot_instances: Sequence[int] | None = None,
                    trials_per_gpu: Sequence[int] | None = None, instance_types: Sequence[str] | None = None,
                    fused_per_gpu: Sequence[int] | None = None,
                    target_model: ModelProfile | Mapping[str, ModelProfile] | None = None) -> Timeline:
    """Replay one sample of the simulator event by event.

    Its JCT equals ``simulate(..., samples=samples, seed=seed).jct_s[sample]`` and its cost
    that sample's cost (to rounding in the last bits: sums run in another order); trials are
    laid on instances as the placement policy packs them (each trial's GPUs on one instance,
    or on whole instances when it needs more than one; packed trials ``k`` to a GPU),
    on-demand instances before spot ones. ``spot_instances``, ``trials_per_gpu``,
    ``fused_per_gpu``, ``instance_types`` and ``target_model`` are ``simulate``'s; a fused group is
    one trial span (``TrialSpan.fused`` members, ``trial`` the group's number). An eager target
    stage (DESIGN §4.6) is laid out as ``engine.eager_target`` runs it: its ``stages`` entry starts
    at the hand-over (``simulate`` counts its duration from the tuning's end), its first TRAIN is
    trial 0 (lost from its start when a restart cuts it) and a restarted one trial 1.

    Raises:
        SpecError: for an invalid allocation, spot, packing or type vector, or ``sample``
            outside ``0..samples-1``.
    """
    if isinstance(sample, bool) or not isinstance(sample, (int, np.integer)) or not 0 <= sample < samples:
        raise SpecError(f"sample: expected a sample number in 0..{samples - 1}, got {sample!r}")
    clouds = stage_clouds(cloud, instance_types, spec.validate().num_stages())
    models = stage_models(model, clouds, instance_types is not None, spec, target_model)
    shapes, held = layout(spec, allocation, models, clouds, instances, trials_per_gpu, fused_per_gpu)
    spot = spot_layout(held, clouds, spot_instances)
    check_eager_on_demand(spec, spot)
    for i, (c, n_spot) in enumerate(zip(clouds, spot)):
        check_trace_cap(c.spot, [n_spot], stages=[i])
        if n_spot and not spot_billable(c):
            raise SpecError("billing: per-function billing has no spot market to reclaim from; "
                            "use per_instance billing or spot_instances=0")
    k = int(sample)
    by_type = {c.instance_type: c for c in clouds}
    now, function_usd = 0.0, 0.0
    pools: dict[str, list[_Held]] = {ON_DEMAND: [], SPOT: []}     # oldest first, as the simulator's pools
    every: list[_Held] = []
    trials: list[TrialSpan] = []
    stages: list[tuple[float, float, float]] = []
    prev: CloudProfile | None = None
    eager, hand_over = spec.eager, 0.0

    for shape, count, s, c, model in zip(shapes, held, spot, clouds, models):
        if eager is not None and shape.index == spec.target_stage:
            for market in (ON_DEMAND, SPOT):          # the tuning's instances go at its last SYNC
                for h in pools[market]:
                    h.released = now
                pools[market] = []
            now, busy = _eager_target(StageDraws(seed, shape.index, samples), model, c, shape, count, hand_over, now,
                                      k, eager.restart_probability, every, trials, stages)
            if c.billing.model is BillingModel.PER_FUNCTION:
                function_usd += busy * shape.gpu_share * _usd_per_s(c, ON_DEMAND) / c.gpus_per_instance
            break

        def launch(market: str, requested: float, launched: float, ready: float, replaces: int | None = None,
                   c: CloudProfile = c) -> _Held:
            h = _Held(len(every), market, requested, launched, ready, replaces, c.instance_type)
            every.append(h)
            return h

        if prev is None or c.instance_type != prev.instance_type:
            # A change of type releases every instance of the old one at this SYNC.
            for market in (ON_DEMAND, SPOT):
                for h in pools[market]:
                    h.released = now
                pools[market] = []
            offsets = trace_offsets(c.spot, seed, samples)
        prev = c
        d = StageDraws(seed, shape.index, samples)
        start = now
        o = count - s
        for market, keep in ((ON_DEMAND, o), (SPOT, s)):     # release newest first at the previous SYNC
            while len(pools[market]) > keep:
                pools[market].pop().released = now
        new_o, new_s = o - len(pools[ON_DEMAND]), s - len(pools[SPOT])
        new = new_o + new_s
        if s and c.spot.at_risk:
            now, busy, ready = _spot_stage(d, model, c, shape, now, k, pools, new_o, new_s, offsets, seed, launch,
                                           trials)
        else:
            if new:
                scale_end = now + float(d.scale(c)[k])
                ready = scale_end + float(d.init_max(c, new)[k])
                for market, fresh in ((ON_DEMAND, new_o), (SPOT, new_s)):
                    pools[market] += [launch(market, now, scale_end, ready) for _ in range(fresh)]
                now = ready
            ready = now
            busy = _plain_trials(d, model, c, shape, now, k, pools[ON_DEMAND] + pools[SPOT], trials)
            now = max(t.end_s for t in trials if t.stage == shape.index) + float(d.sync(model)[k])
        if c.billing.model is BillingModel.PER_FUNCTION:
            usd = mixed_usd_per_s(o, s, _usd_per_s(c, ON_DEMAND), _usd_per_s(c, SPOT))
            function_usd += busy * shape.gpu_share * usd / c.gpus_per_instance
        stages.append((start, ready, now))
        if eager is not None and shape.index == eager.after_stage:
            hand_over = now
    for market in (ON_DEMAND, SPOT):
        for h in pools[market]:
            h.released = now
    spans = tuple(h.span() for h in every)
    cost = function_usd + sum(_instance_usd(span, by_type[span.instance_type]) for span in spans)
    return Timeline(spans, tuple(trials), tuple(stages), now, k, samples, cost)


def _eager_target(d: StageDraws, model: ModelProfile, cloud: CloudProfile, shape: StageShape, count: int,
                  hand_over: float, tuning_end: float, k: int, restart_probability: float, every: list[_Held],
                  trials: list[TrialSpan], stages: list[tuple[float, float, float]]) -> tuple[float, float]:
    """An eager target stage (``engine.eager_target``) for sample ``k``: its instances from the
    hand-over to its end, its first TRAIN (trial 0; lost from its start when cut by a restart)
    and the restarted one (trial 1). Returns its end and its summed TRAIN time."""
    scale_end = hand_over + float(d.scale(cloud)[k])
    ready = scale_end + float(d.init_max(cloud, count)[k])
    runs = d.train_durations(model, replace(shape, num_trials=2, running=2))[:, k]
    first, again = float(runs[0]), float(runs[1])
    restart = bool(d.restarts(restart_probability)[k])
    hosts = []
    for _ in range(count):
        hosts.append(_Held(len(every), ON_DEMAND, hand_over, scale_end, ready, None, cloud.instance_type))
        every.append(hosts[-1])
    on = tuple(h.iid for h in hosts)
    if restart:
        begin = max(tuning_end, ready)
        cut = min(ready + first, begin)
        if cut > ready:
            trials.append(TrialSpan(shape.index, 0, on, 0, shape.gpus_per_trial, ready, cut,
                                    ready if ready + first > begin else None))
        trials.append(TrialSpan(shape.index, 1, on, 0, shape.gpus_per_trial, begin, begin + again))
        train_end, busy = begin + again, cut - ready + again
    else:
        trials.append(TrialSpan(shape.index, 0, on, 0, shape.gpus_per_trial, ready, ready + first))
        train_end, busy = max(tuning_end, ready + first), first
    end = train_end + float(d.sync(model)[k])
    for h in hosts:
        h.released = end
    stages.append((hand_over, ready, end))
    return end, busy


def _usd_per_s(cloud: CloudProfile, market: str) -> float:
    return (cloud.price_usd_per_hour if market == ON_DEMAND else cloud.spot_price_usd_per_hour or 0.0) / 3600.0


def _instance_usd(span: InstanceSpan, cloud: CloudProfile) -> float:
    """What one instance costs: its launch's data, and under per-instance billing its billed
    life (rounded, at least the minimum)."""
    if span.cancelled:
        return 0.0
    if cloud.billing.model is BillingModel.PER_FUNCTION:
        return cloud.data.usd_per_launch
    life = span.released_s - span.launched_s
    billed = float(billed_seconds(life, cloud.billing)) if life > 0 else 0.0
    return cloud.data.usd_per_launch + billed * _usd_per_s(cloud, span.market)


def _plain_trials(d: StageDraws, model: ModelProfile, cloud: CloudProfile, shape: StageShape, begin: float, k: int,
                  hosts: list[_Held], trials: list[TrialSpan]) -> float:
    """A stage no reclaim can touch: list scheduling of its TRAINs on ``hosts`` (positions in
    order); returns their summed time."""
    durations = d.train_durations(model, shape)[:, k]
    positions = trial_positions(shape, cloud.gpus_per_instance)
    per_instance = cloud.gpus_per_instance // shape.gpus_per_trial * shape.trials_per_gpu
    free = [begin] * shape.running
    for t in range(shape.nodes):
        slot = t if t < shape.running else min(range(shape.running), key=lambda g: free[g])
        started = free[slot]
        free[slot] = started + float(durations[t])
        trials.append(TrialSpan(shape.index, t, tuple(hosts[p].iid for p in positions[slot]),
                                slot % per_instance if per_instance else 0, shape.gpus_per_trial, started, free[slot],
                                trials_per_gpu=shape.trials_per_gpu, fused=_members(shape, t)))
    return float(durations.sum())


def _spot_stage(d: StageDraws, model: ModelProfile, cloud: CloudProfile, shape: StageShape, now: float, k: int,
                pools: dict[str, list[_Held]], new_o: int, new_s: int, offsets: np.ndarray, seed: int,
                launch: Callable[..., _Held],
                trials: list[TrialSpan]) -> tuple[float, float, float]:
    """A stage with spot instances at risk, as ``engine._spot_stage`` runs it, for sample ``k``:
    the kernel's schedule and TRAIN attempts, turned into instances and trial spans.
    Returns the stage's end, its summed TRAIN time and when its new instances were all ready."""
    new = new_o + new_s
    ready = now
    od_ready: list[float] = []
    fresh: list[_Held] = []
    if new:
        scale = float(d.scale(cloud)[k])
        inits = d.init_each(cloud, new)[:, k]
        od_ready = [now + scale + float(inits[j]) for j in range(new_o)]
        pools[ON_DEMAND] += [launch(ON_DEMAND, now, now + scale, r) for r in od_ready]
        if new_s:
            # A first spot request waits for capacity like a replacement does (trace markets).
            old_s = len(pools[SPOT])
            granted = grant_times(cloud.spot, np.array([now]), offsets[k:k + 1], np.arange(old_s, old_s + new_s))[:, 0]
            fresh = [launch(SPOT, now, float(granted[j] + scale), float(granted[j] + scale + inits[new_o + j]))
                     for j in range(new_s)]
        ready = max(od_ready + [h.ready for h in fresh])
    old = list(pools[SPOT])
    n_od = len(pools[ON_DEMAND])
    spot_hosts = old + fresh
    start = np.array([[-np.inf]] * n_od + [[h.launched] for h in spot_hosts])
    up = np.array([[-np.inf]] * (n_od - new_o) + [[r] for r in od_ready] + [[h.ready] for h in spot_hosts])
    is_spot = np.arange(len(start)) >= n_od
    schedule = PositionSchedule(cloud, cloud.spot, seed, shape.index, np.array([now]), start, up, is_spot,
                                offsets[k:k + 1], sample_ids=np.array([k]), sample_count=len(offsets),
                                held=np.arange(len(start)) < n_od + len(old))
    latency, startup = d.train_parts(model, shape)
    boot = startup[:, k:k + 1] if isinstance(startup, np.ndarray) else startup
    log: list[tuple[Any, ...]] = []
    trained, busy = run_stage(schedule, shape, cloud.gpus_per_instance, np.array([ready]), latency[:, k:k + 1], boot,
                              log=log)
    end = float(trained[0]) + float(d.sync(model)[k])
    # Each spot position's incarnations up to the one alive (or provisioning), and not noticed, at the SYNC.
    lives: list[list[tuple[_Held, float, float]]] = [[(h, -np.inf, np.inf)] for h in pools[ON_DEMAND]]
    carried = []
    notice = schedule.notice_s
    for position, host in zip(range(n_od, len(start)), spot_hosts):
        chain = schedule.chain(position, 0, end)
        h = host
        life = [(h, chain[0][1], chain[0][2])]
        for (prev_start, _, prev_down, _), (s_i, up_i, down_i, ready_i) in zip(chain, chain[1:]):
            # The replacement is asked for at the notice (rate) or when the zone is gone (trace).
            asked = max(prev_down - notice, prev_start)
            if prev_down < end:
                h.released = h.reclaimed = prev_down
            else:                              # noticed before the SYNC, reclaimed after: released at it
                h.released = end
            h = launch(SPOT, asked, s_i, ready_i, replaces=h.iid)
            life.append((h, up_i, down_i))
        lives.append(life)
        carried.append(h)
    pools[SPOT] = carried
    positions = trial_positions(shape, cloud.gpus_per_instance)
    per_instance = cloud.gpus_per_instance // shape.gpus_per_trial * shape.trials_per_gpu
    for trial, slot, _, begin, stop, checkpoint, finished in log:
        for j, g, b, e, c, f in zip(trial, slot, begin, stop, checkpoint, finished):
            on = tuple(next(h.iid for h, u, dn in lives[p] if u <= b < dn) for p in positions[g])
            trials.append(TrialSpan(shape.index, int(j), on, int(g) % per_instance if per_instance else 0,
                                    shape.gpus_per_trial, float(b), float(e), None if f else float(c),
                                    shape.trials_per_gpu, _members(shape, int(j))))
    return end, float(busy[0]), ready


def _members(shape: StageShape, node: int) -> int:
    """Trials TRAIN node ``node`` trains: 1, or its fused group's (``F``, the last group the rest)."""
    return min(shape.fused_per_gpu, shape.num_trials - node * shape.fused_per_gpu)
