"""Rehearsals: the executor's cluster and trial-runner ports in virtual time (the ``sim`` backend).

A rehearsal runs the real ``rubberband.executor.driver.Driver`` — the one module that
applies the scheduler's decisions, in local and aws runs too — on ``SimClusterPort`` and
``SimRunnerPort``, which play the cloud and the trainers on a ``VirtualClock``. Every latency
is drawn from a *truth* model exactly as DESIGN §4 and §4.1 define it (by default the
planning profiles; rehearse a wrong profile by passing another):

* a scale-up (the instances one request to the cluster launches) draws one SCALE from
  ``provision_latency_s``; each new instance is billed from the SCALE's end and ready after
  its own ``init_latency_s`` draw (plus ``init_contention_s`` per other instance of the
  scale-up); a replacement draws its own SCALE;
* a TRAIN node lasts ``trial_startup_s + k * L``, with ``L`` and the start-up drawn once per
  trial and stage from the truth's ``iter_latency_s(m)`` (a slow trial stays slow, also
  after a reclaim); the runner trains it as one chunk (``chunk_iters``: all that is left), so
  a virtual TRAIN is one timed event, not ``k`` checkpoints;
* a SYNC lasts one ``sync_s`` draw (``SimRunnerPort.sync_s``: the driver lets that time pass);
* a plan with an instance type per stage: each launch draws from its type's profile (SCALE,
  INIT, spot market, GPUs per instance) and is billed at its type's prices; a packed stage
  (``StartTrial.trials_per_gpu`` k > 1) draws ``L`` from ``packed_latency(k)`` and bills a
  TRAIN per function for ``1/k`` GPU (``docs/model.md``);
* a spot instance lives an exponential lifetime with the market's ``rate_per_hour`` from its
  SCALE's end, the notice ``notice_s`` before (not before its launch; the scheduler places
  nothing new on a noticed instance and releases it at a SYNC); with a ``trace`` the
  zone's availability is replayed from a random offset: a request waits for capacity, and
  every spot instance goes when the zone does (no notice helps). A trial interrupted at ``r``
  keeps its completed iterations and loses the one in progress (its chunk ends at ``r`` with
  ``ChunkInterrupted``). Multi-node trace counts (how many may be held at once) are not
  modelled: a trace is all-or-none here.

Where the driver's way on a real cluster and the model part, the model is kept: a trial on a
noticed instance trains on until the reclaim (one chunk; the driver's move at a checkpoint
needs per-iteration chunks), and a notice of an instance still initialising reaches the
driver at once (``Notice.node_type``), so its replacement is asked at the notice.

Metrics come from a seeded synthetic learning curve per trial, so promotion is exercised:
a trial draws a quality ``q ~ Beta(2, 2)``, an asymptote ``A = 0.55 + 0.4 q`` and a time
constant ``tau = 2 + 40 (1 - q) u`` iterations (``u ~ U(0, 1)``: good trials mostly learn
fast, but some good ones start slowly, so curves cross); at step ``s`` it reports
``A (1 - exp(-s / tau)) + N(0, 0.01)`` (an accuracy), or one minus that when the job
minimises.

The virtual-time mechanics are ``VirtualCluster`` (instances requested, launched, ready,
noticed, reclaimed and released at their times on the clock; launches of what a request
misses; a lowered request cancelling the newest launches) and ``VirtualRunner`` (a chunk ends
at ``startup + k * L`` after its submission, or at its instance's end): ``SimClusterPort`` and
``SimRunnerPort`` configure them with the truth's draws, and the unit tests' fakes
(``rubberband.testing.fakes``) with constants, a call log and failure injection.

``--provider sim`` (``rubberband.providers.sim``, registered beside ``local`` and ``aws``)
starts no Ray cluster: ``rubberband run EXP --provider sim`` rehearses through
``rubberband.executor.rehearse``, which runs this module's ``rehearse_once``.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rubberband.errors import ProviderError, SpecError
from rubberband.executor.driver import Driver
from rubberband.executor.ports import ChunkInterrupted, Node, Notice, TrainResult, VirtualClock
from rubberband.nodes import counts, describe, within
from rubberband.plan.plan import Plan
from rubberband.profiles.by_gpu import model_of
from rubberband.profiles.cloud import CloudProfile, Market
from rubberband.profiles.model import ModelProfile
from rubberband.scheduler import SchedulerReport
from rubberband.simulator.model import redone_iters

# Stream ids of the rehearsal's random components (one generator each, from the seed).
_SCALE, _INIT, _LIFE, _TRAIN, _STARTUP, _SYNC, _OFFSET, _CURVE = range(8)


class LearningCurves:
    """The seeded synthetic learning curves of the module docstring, one per trial id."""

    def __init__(self, seed: int, mode: str = "max"):
        self.seed, self.mode = int(seed), mode
        self._params: dict[str, tuple[float, float, np.random.Generator]] = {}

    def _trial(self, trial: str) -> tuple[float, float, np.random.Generator]:
        if trial not in self._params:
            rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(_CURVE, zlib.crc32(trial.encode()))))
            q, u = rng.beta(2.0, 2.0), rng.uniform()
            self._params[trial] = (0.55 + 0.4 * q, 2.0 + 40.0 * (1.0 - q) * u, rng)
        return self._params[trial]

    def metric(self, trial: str, step: int) -> float:
        asymptote, tau, rng = self._trial(trial)
        acc = asymptote * (1.0 - math.exp(-step / tau)) + rng.normal(0.0, 0.01)
        return acc if self.mode == "max" else 1.0 - acc


@dataclass
class SimInstance:
    """One instance of the rehearsal, times in virtual seconds (``None`` until they happen)."""

    name: str
    market: Market
    instance_type: str
    stage_requested: int
    requested_s: float
    launched_s: float             # end of SCALE: billed from here
    ready_s: float
    down_s: float                 # reclaimed at (inf: never)
    released_s: float | None = None
    release_reason: str | None = None
    price_usd_per_hour: float = 0.0

    @property
    def billed(self) -> bool:
        """Whether it was ever launched (a request cancelled while provisioning never is, nor one
        whose trace zone was gone by the end of its SCALE)."""
        return self.release_reason != "cancelled"


@dataclass
class SimRun:
    """What one rehearsal did: the raw records a ``RunResult`` is built from."""

    jct_s: float
    instances: list[SimInstance]
    train_runs: list[dict[str, Any]]
    stage_windows: list[tuple[float, float]]
    report: SchedulerReport          # the scheduler's, at the end
    seed: int
    reclaims: int = 0
    stopped: str | None = None       # the one-line reason the job stopped early (the budget)
    timeline: list[dict[str, Any]] = field(default_factory=list)    # the driver's events, as a run's
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)  # trial -> its config (from the search space)


# --- the same truth, as the executor's ports: the rehearsal the real ``Driver`` runs ---------------

class SimWorld:
    """What the virtual cluster and runner share: the clock, the truth profiles, the seeded draws
    (one generator per component, as the sim backend always drew them), the learning curves and the records a
    ``SimRun`` is built from."""

    def __init__(self, plan: Plan, model: ModelProfile | Mapping[str, ModelProfile],
                 cloud: CloudProfile | Mapping[str, CloudProfile] | None = None, seed: int = 0, mode: str = "min",
                 metric: str = "metric", target_model: ModelProfile | Mapping[str, ModelProfile] | None = None):
        self.plan, self.model, self.seed, self.metric = plan, model, int(seed), metric
        if (plan.spec.target_stage is None) != (target_model is None):
            raise SpecError("target_model: the truth of a surrogate job's target stage (the full-width model's "
                            "profile) goes with a plan that ends in one, and only with it (DESIGN §4.6)")
        self.target_model = target_model
        self.clock = VirtualClock(0.0)
        self.priced = {c.instance_type: c for c in (plan.cloud, *plan.type_clouds.values(), *plan.stage_clouds)}
        truth = dict(cloud) if isinstance(cloud, Mapping) else {(cloud or plan.cloud).instance_type: cloud or plan.cloud}
        self.truth = {**self.priced, **truth}
        self.curves = LearningCurves(seed, mode)
        self.rng = {c: np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(c,)))
                    for c in (_SCALE, _INIT, _LIFE, _TRAIN, _STARTUP, _SYNC, _OFFSET)}
        self.offset_u = float(self.rng[_OFFSET].random())
        self.train_runs: list[dict[str, Any]] = []

    def cloud(self, itype: str) -> CloudProfile:
        if itype not in self.truth:
            raise SpecError(f"sim: no profile of instance type {itype!r} to rehearse it; "
                            "pass its truth profile in `cloud` (a mapping of instance type to profile)")
        return self.truth[itype]

    def zone_next(self, t: float, up: bool, itype: str) -> float:
        """When the zone's trace next turns up (or down) after ``t``, on the job's clock."""
        trace = self.cloud(itype).spot.trace
        if trace is None:
            raise SpecError(f"sim: instance type {itype!r} has no spot trace to replay")
        offset = self.offset_u * trace.duration_s
        return float(trace.next_change(t + offset, up=up)) - offset

    def draw(self, stream: int, dist: Any) -> float:
        return float(dist.sample(self.rng[stream], 1)[0])


class VirtualCluster:
    """The lifecycle of instances in virtual time, the one both the rehearsal's cluster
    (``SimClusterPort``) and the unit tests' (``rubberband.testing.fakes.FakeCluster``) keep:
    an instance is requested, launched (billed from then), ready and, when its end is known,
    noticed and reclaimed, each at its time on the clock (``VirtualClock.call_at``); a
    lowered request cancels the newest launches not up yet; a wait for instances returns at each
    piece of news (``wait_nodes``), and ``replace`` launches one more of a noticed instance's type
    at once. When launches happen and how long they take are the subclass's."""

    def __init__(self, clock: VirtualClock):
        self.clock = clock
        self.instances: dict[str, SimInstance] = {}
        self.live: dict[str, None] = {}        # instances not released or reclaimed, oldest first
        self._nodes: list[Any] | None = None   # ``nodes()`` until something changes
        self.node_type: dict[str, Any] = {}
        self.request: dict[Any, int] = {}
        self.noticed: set[str] = set()         # replaced (under a notice, or retired): not usable
        self._notices: list[Any] = []
        self._news = False                     # a notice or an instance up since ``wait_nodes`` last returned
        self._events: list[dict[str, Any]] = []
        self._launched = 0
        self.stage = 0
        self.reclaims = 0

    def usable(self) -> list[str]:
        """Instances launched and not released, reclaimed or noticed, oldest first."""
        return [n for n in self.live if n not in self.noticed]

    def _name(self, n: int) -> str:
        return f"sim-{n}"

    def _gpus(self, name: str) -> int:
        raise NotImplementedError(f"{type(self).__name__}: how many GPUs an instance has is the subclass's")

    def _add(self, node_type: Any, requested: float, launched: float, ready: float, down: float, notice: float,
             gpus: int, price: float = 0.0) -> str:
        """A new instance of ``node_type`` with its times; it comes up at ``ready`` (unless gone
        by then), and, when ``down`` is finite, is noticed at ``notice`` and reclaimed at
        ``down``."""
        self._launched += 1
        name = self._name(self._launched)
        self.instances[name] = SimInstance(name, Market(node_type.market), node_type.instance_type, self.stage,
                                           requested, launched, ready, down, price_usd_per_hour=price)
        self.node_type[name] = node_type
        self.live[name] = None
        self._nodes = None
        self._launched_at(name)
        if ready < down:                 # the driver wakes when it is up
            self.clock.call_at(ready, functools.partial(self._up, name, ready, gpus))
        if math.isfinite(down):
            self.clock.call_at(notice, functools.partial(self._noticed, name))
            self.clock.call_at(down, functools.partial(self._reclaimed, name))
        return name

    def _launched_at(self, name: str) -> None:
        """The events of a launch (``_add``)."""
        inst = self.instances[name]
        if inst.down_s > inst.launched_s:    # one whose zone is gone by then never runs (_reclaimed)
            self._events.append({"event": "running", "instance": name, "t": inst.launched_s})

    def _up(self, name: str, at: float, gpus: int) -> None:
        self._nodes = None
        self._events.append({"event": "ready", "instance": name, "t": at, "gpus": gpus})
        self._news = True

    def _noticed(self, name: str) -> None:
        inst = self.instances[name]
        if inst.released_s is not None or name in self.noticed:
            return
        self._notices.append(Notice(name, inst.down_s, self.node_type[name]))
        self._news = True

    def _end(self, name: str, reason: str, at: float | None = None) -> None:
        """``name`` is gone (released, cancelled, reclaimed) at ``at`` (default now)."""
        inst = self.instances[name]
        inst.released_s, inst.release_reason = self.clock.now() if at is None else at, reason
        self.live.pop(name, None)
        self._nodes = None
        self.noticed.discard(name)

    def _reclaimed(self, name: str) -> None:
        inst = self.instances[name]
        if inst.released_s is not None:
            return
        # DESIGN §4.1: a zone gone by the end of the SCALE takes the instance back the moment it
        # would start: it never ran, so it is neither billed (not even the minimum) nor a reclaim.
        never_ran = inst.down_s <= inst.launched_s
        self._end(name, "cancelled" if never_ran else "interrupted")
        self.reclaims += 0 if never_ran else 1
        if inst.ready_s >= inst.down_s:  # never up, so the driver never heard of it: the standing request relaunches
            self._reconcile()

    def _launch(self, node_types: list[Any]) -> None:
        """Launch one instance of each of ``node_types`` (``_add`` each)."""
        raise NotImplementedError(f"{type(self).__name__}: how instances launch is the subclass's")

    def _reconcile(self) -> None:
        """Launch what the standing request misses."""
        have = counts(self.node_type[n] for n in self.usable())
        self._launch([t for t, n in self.request.items() for _ in range(n - have.get(t, 0))])

    def _release(self, name: str) -> None:
        inst = self.instances[name]
        if inst.released_s is not None:
            return
        self._end(name, "cancelled" if inst.launched_s > self.clock.now() else "released")

    def _cancel_surplus(self, request: Mapping[Any, int]) -> None:
        """Cancel, per type, the newest launches not up yet beyond ``request``."""
        now = self.clock.now()
        have = counts(self.node_type[n] for n in self.usable())
        for t, n in have.items():
            flying = [x for x in self.usable() if self.node_type[x] == t and self.instances[x].ready_s > now]
            for name in flying[len(flying) - min(n - request.get(t, 0), len(flying)):]:
                self._release(name)

    # --- the port (the parts both clusters share) --------------------------------------------
    def scale_to(self, request: Mapping[Any, int], stage: int) -> None:
        """Ask for ``request``: launch what is missing; a lowered one cancels the newest launches
        not up yet."""
        self.stage, self.request = stage, {t: n for t, n in request.items() if n}
        self._cancel_surplus(self.request)
        self._reconcile()

    def release_to(self, keep: Sequence[str], stage: int) -> None:
        """Release the instances up (ready) not in ``keep``; launches on their way stay."""
        now, kept = self.clock.now(), set(keep)
        for name in [n for n in self.live if self.instances[n].ready_s <= now and n not in kept]:
            self._release(name)
        self.request = dict(counts(self.node_type[n] for n in self.usable()))

    def release(self, instances: Sequence[str], stage: int) -> None:
        for name in instances:
            self._release(name)

    def shutdown(self) -> None:
        """The run is over: everything still held is let go (launches on their way cancelled)."""
        self.request = {}
        for name in list(self.instances):
            self._release(name)

    def nodes(self) -> list[Any]:
        if self._nodes is None:
            now = self.clock.now()
            self._nodes = [Node(n, self._gpus(n), self.node_type[n])
                           for n in self.usable() if self.instances[n].ready_s <= now]
        return list(self._nodes)

    def notices(self) -> list[Any]:
        out, self._notices = self._notices, []
        return out

    def doomed(self) -> list[str]:
        return [n for n in self.noticed if self.instances[n].released_s is None]

    def wait_nodes(self, request: Mapping[Any, int], timeout_s: float, until: float | None = None,
                   extra: Mapping[Any, int] | None = None):
        """Ask for ``request`` (launching what it misses) and move the clock on until exactly it
        is up and nothing else is usable (the nodes returned), or until news the driver must
        hear first — an instance up, a notice — or ``until`` (``None`` returned). ``extra``:
        asked for too but not waited for (an eager target's, DESIGN §4.6): up to that many more
        of each type may be usable, up or not.

        Raises:
            ProviderError: the request is not met within ``timeout_s`` (a market with no
                capacity; a surplus never released).
            SpecError: nothing is left to happen on the clock and the request is not met.
        """
        extra = {t: n for t, n in (extra or {}).items() if n}
        waited = {t: n for t, n in request.items() if n}
        self.request = {t: waited.get(t, 0) + extra.get(t, 0) for t in {*waited, *extra}}
        self._reconcile()
        self._news = False
        end = self.clock.now() + timeout_s
        while True:
            now = self.clock.now()
            up = counts(self.node_type[n] for n in self.usable() if self.instances[n].ready_s <= now)
            usable = counts(self.node_type[n] for n in self.usable())
            if within(up, usable, waited, extra):
                return self.nodes()
            if self._news:             # news for the driver (a notice, an instance up): it looks, then waits on
                self._news = False
                return None
            nxt = min(self.clock.next_at(), end)
            if until is not None and until <= nxt:
                self.clock.advance_to(until)
                return None
            if not math.isfinite(nxt):
                raise SpecError("sim: the rehearsal stalled: the scheduler waits for instances that never come "
                                "(spot capacity never returns?)")
            if nxt >= end:
                raise ProviderError(f"sim: waited {timeout_s:.0f}s for {describe(self.request)}")
            self.clock.advance_to(nxt)

    def replace(self, instance: str) -> None:
        """Stop counting ``instance`` as usable and launch what the request then misses (a
        noticed one: its replacement; one retired after the request dropped: nothing)."""
        if instance in self.noticed:
            return
        self.noticed.add(instance)
        self._nodes = None
        self._reconcile()

    def events(self) -> list[dict[str, Any]]:
        return self._events


class SimClusterPort(VirtualCluster):
    """``ClusterPort`` in virtual time, by the truth of the module docstring.

    Launches happen when a request rises above the usable instances (``scale_to``,
    ``wait_nodes``; ``replace`` one more of a noticed instance's type), as an autoscaler does:
    the instances one call launches share one SCALE draw (a scale-up), each its own INIT. A
    spot instance's lifetime, notice and reclaim are drawn at its launch; a reclaimed one is
    gone from ``nodes`` at its reclaim (its gangs' chunks end there: ``SimRunnerPort``). A model
    decision: a notice reaches the driver at its time, also during INIT (``Notice.node_type``
    lets the driver name the instance then), and ``wait_nodes`` returns ``None`` early when
    one arrives, or an instance comes up, so the driver hears it at its time (the scheduler
    may start a stage before a replacement is up).
    """

    def __init__(self, world: SimWorld):
        super().__init__(world.clock)
        self.world = world

    def _gpus(self, name: str) -> int:
        return self.world.cloud(self.instances[name].instance_type).gpus_per_instance

    # --- the truth -------------------------------------------------------------------------
    def _launch(self, node_types: list[Any]) -> None:
        """Launch one instance of each of ``node_types``: one SCALE for them all."""
        if not node_types:
            return
        w, now = self.world, self.clock.now()
        scale = w.draw(_SCALE, w.cloud(node_types[0].instance_type).provision_latency_s)
        for t in node_types:
            itype, spot = t.instance_type, t.market == Market.SPOT.value
            cloud = w.cloud(itype)
            market, priced = cloud.spot, w.priced.get(itype, cloud)
            granted = w.zone_next(now, True, itype) if spot and market.trace else now
            launched = granted + scale
            # Instances launched together on one machine's CPUs (init_contention_s, DESIGN §4):
            # each INIT of this scale-up grows by c per other instance in it.
            ready = launched + w.draw(_INIT, cloud.init_latency_s) + cloud.init_contention_s * (len(node_types) - 1)
            down = math.inf
            if spot and market.trace is not None:
                down = w.zone_next(launched, False, itype)
            elif spot and market.rate_per_hour > 0:
                down = launched + float(w.rng[_LIFE].standard_exponential()) * 3600.0 / market.rate_per_hour
            notice = down if market.trace is not None else max(down - market.notice_s, launched)
            self._add(t, now, launched, ready, down, notice, cloud.gpus_per_instance,
                      float(priced.price(Market(t.market))))



@dataclass(eq=False)
class SimGang:
    trial: str
    instances: tuple[str, ...]
    share: int
    gpus: tuple[int, ...] | None = None     # each rank's GPU on its instance, as placed
    stage: int = -1
    latency: float = 0.0
    startup: float = 0.0       # owed by its next chunk (a TRAIN's start)
    config: dict[str, Any] = field(default_factory=dict)
    step: int = 0              # where its trial stands (a runner that keeps it: the fakes)
    alive: bool = True
    fused: bool = False        # a member of a fused group of ``share`` on its GPU (DESIGN §4.5)
    resumed: bool = True       # (re)started from its trial's checkpoint since its last TRAIN began
    owed: int = 0              # redone iterations its next chunk trains first (DESIGN §4)


@dataclass(eq=False)
class SimChunk:
    gang: SimGang
    trial: str
    stage: int
    start_s: float
    iters: int
    done: int                  # iterations it completes
    finish_s: float
    cut: bool                  # ended by a reclaim
    seq: int
    iter_s: float = 0.0        # seconds per iteration it trains at
    redone: int = 0            # iterations it trained again first (beyond ``done``)


class VirtualRunner:
    """A ``TrialRunnerPort`` in virtual time, the one both the rehearsal's runner
    (``SimRunnerPort``) and the unit tests' (``rubberband.testing.fakes.FakeRunner``) are: a
    chunk of ``iters`` iterations submitted at ``now`` ends at ``now + startup + iters * L``
    (``L``: ``_iter_s``), or at its gang's first instance's end (``_down_s``) with the
    iterations completed by then; ``wait`` moves the clock to the earliest end (ties: the first
    submitted) unless the clock has something due before, or the timeout comes first. How a
    chunk's result reads (``result``) and where ``L`` comes from are the subclass's.

    Redone iterations (DESIGN §4) as a function trainable's runner has them: a gang started or
    handed a trial (``start``, ``reassign``: its function restarted from the trial's latest
    checkpoint) owes, at the first ``begin_train`` of the trial's TRAIN of a stage, ``_redo``
    iterations (the subclass's; none by default), which its chunks train first, at ``L`` each,
    before the TRAIN's own; a gang kept across the SYNC without a ``reassign`` owes none. A
    chunk cut short by a reclaim keeps what it trained, redone ones first; the rest stays owed
    to the TRAIN's next gang."""

    restarts_each_stage = False

    def __init__(self, clock: VirtualClock):
        self.clock = clock
        self._seq = itertools.count()
        self._owed: dict[tuple[str, int], int] = {}     # (trial, stage) -> redone iterations still owed

    def _redo(self, gang: SimGang, stage: int) -> int:
        """Iterations ``gang``'s trial trains again on resuming for its TRAIN of ``stage``."""
        return 0

    def _iter_s(self, gang: SimGang) -> float:
        """Seconds per iteration of ``gang``'s next chunk."""
        return gang.latency

    def _down_s(self, gang: SimGang) -> float:
        """When the first of ``gang``'s instances goes (``inf``: none is known to)."""
        return math.inf

    def start(self, trial: str, config: dict[str, Any], instances: Sequence[str], checkpoint: bytes | None,
              trials_per_gpu: int = 1, gpus: Sequence[int] | None = None, fused: bool = False) -> SimGang:
        return SimGang(trial, tuple(instances), trials_per_gpu, None if gpus is None else tuple(gpus), fused=fused)

    def reassign(self, gang: SimGang, trial: str, config: dict[str, Any], checkpoint: bytes | None) -> SimGang:
        gang.trial, gang.resumed = trial, True
        return gang

    def begin_train(self, gang: SimGang, stage: int) -> None:
        """The gang trains (or resumes) its trial's TRAIN of ``stage``: what it owes first."""
        key = (gang.trial, stage)
        if key not in self._owed:
            self._owed[key] = self._redo(gang, stage) if gang.resumed else 0
        gang.stage, gang.resumed, gang.owed = stage, False, self._owed[key]

    def chunk_iters(self, left: int) -> int:
        return left

    def sync_s(self, stage: int) -> float:
        return 0.0

    def train(self, gang: SimGang, iters: int) -> SimChunk:
        now, L = self.clock.now(), self._iter_s(gang)
        startup, gang.startup = gang.startup, 0.0
        owed, total = gang.owed, gang.owed + iters
        natural = now + startup + total * L
        down = self._down_s(gang)
        cut = down < natural
        trained = (min(math.floor(max(down - now - startup, 0.0) / L), total) if L > 0 else total) if cut else total
        redone = min(trained, owed)
        gang.owed -= redone
        key = (gang.trial, gang.stage)
        if key in self._owed:
            self._owed[key] -= redone
        return SimChunk(gang, gang.trial, gang.stage, now, iters, trained - redone, down if cut else natural, cut,
                        next(self._seq), L, redone)

    def wait(self, pending: Sequence[SimChunk], timeout_s: float) -> tuple[list[SimChunk], list[SimChunk]]:
        """The earliest chunk to end, when it ends before anything else happens on the cluster
        and within ``timeout_s``; else nothing, time moved to that happening (or the timeout)."""
        first = min(pending, key=lambda c: (c.finish_s, c.seq)) if pending else None
        until = min(self.clock.now() + timeout_s, self.clock.next_at())
        if first is not None and first.finish_s <= until:
            self.clock.advance_to(first.finish_s)
            return [first], [c for c in pending if c is not first]
        if math.isfinite(until):
            self.clock.advance_to(until)
        return [], list(pending)

    def result(self, chunk: SimChunk) -> Any:
        raise NotImplementedError(f"{type(self).__name__}: how a chunk's result reads is the subclass's")

    def stop(self, gang: SimGang) -> None:
        return None

    def warm(self, nodes: Sequence[Any], trials_per_gpu: int = 1) -> float:
        return 0.0

    def release_instance(self, instance: str) -> None:
        return None

    def forget_dead(self, alive: Sequence[str]) -> None:
        return None

    def shutdown(self) -> None:
        return None


class SimRunnerPort(VirtualRunner):
    """``TrialRunnerPort`` in virtual time: a TRAIN draws ``L`` and its start-up once per trial and
    stage (a slow trial stays slow, also after a reclaim), and trains its iterations as one
    chunk of ``startup + k * L`` that ends early, keeping its completed iterations, where one of
    its instances is reclaimed (the truth knows when). A fused group's members (DESIGN §4.5)
    share one draw of ``L_F`` and start-up: those that begin a stage's TRAIN on one GPU at one
    time. A SYNC takes one ``sync_s`` draw. A TRAIN that resumes its trial trains the model's
    redone iterations first (``simulator.model.redone_iters``: ``D_i mod c`` with the truth's
    ``checkpoint_every``), once per TRAIN: the driver restarts the function at every stage, kept
    gang or not (``restarts_each_stage``), as it does a real function trainable's."""

    restarts_each_stage = True

    def __init__(self, world: SimWorld, cluster: SimClusterPort):
        super().__init__(world.clock)
        self.world, self.cluster = world, cluster
        self._draws: dict[tuple[str, int], tuple[float, float]] = {}
        self._groups: dict[tuple[Any, ...], tuple[float, float]] = {}     # a fused group's draw
        self._steps: dict[str, int] = {}
        self._types: dict[int, str] = {}

    def _model(self, itype: str, stage: int) -> ModelProfile:
        # A target stage's TRAINs and SYNC are the full-width model's (DESIGN §4.6).
        truth = self.world.target_model if stage == self.world.plan.spec.target_stage else self.world.model
        assert truth is not None      # SimWorld checks a target stage has its model
        return model_of(truth, self.world.cloud(itype), f"instance_types[{stage}]")

    def _down_s(self, gang: SimGang) -> float:
        return min(self.cluster.instances[n].down_s for n in gang.instances)

    def begin_train(self, gang: SimGang, stage: int) -> None:
        itype = self.cluster.instances[gang.instances[0]].instance_type
        self._types[stage] = itype
        key = (gang.trial, stage)
        if key not in self._draws and gang.fused:       # once per fused group: its GPU, stage and start
            model, group = self._model(itype, stage), (gang.instances[0], gang.gpus, stage, self.clock.now())
            if group not in self._groups:
                self._groups[group] = (self.world.draw(_TRAIN, model.fused_latency(gang.share)),
                                       self.world.draw(_STARTUP, model.trial_startup_s))
            self._draws[key] = self._groups[group]
        if key not in self._draws:        # once per trial and stage
            model, k = self._model(itype, stage), gang.share
            dist = model.packed_latency(k) if k > 1 else model.latency(len(gang.instances))
            self._draws[key] = (self.world.draw(_TRAIN, dist), self.world.draw(_STARTUP, model.trial_startup_s))
        gang.latency, gang.startup = self._draws[key]
        super().begin_train(gang, stage)

    def _redo(self, gang: SimGang, stage: int) -> int:
        itype = self.cluster.instances[gang.instances[0]].instance_type
        return redone_iters(self.world.plan.spec, self._model(itype, stage))[stage]

    def sync_s(self, stage: int) -> float:
        """A SYNC's drawn time."""
        return self.world.draw(_SYNC, self._model(self._types.get(stage, self.world.plan.instance_type), stage).sync_s)

    def result(self, chunk: SimChunk) -> Any:
        w, L = self.world, chunk.iter_s
        w.train_runs.append({"trial": chunk.trial, "stage": chunk.stage, "gpus": len(chunk.gang.instances) / chunk.gang.share,
                             "start_s": chunk.start_s, "end_s": chunk.finish_s, "iters": chunk.done,
                             "iter_s": [L] * chunk.done, "instances": list(chunk.gang.instances),
                             "gpu_ids": None if chunk.gang.gpus is None else [[str(g)] for g in chunk.gang.gpus],
                             **({"redone": chunk.redone} if chunk.redone else {})})
        step = self._steps[chunk.trial] = self._steps.get(chunk.trial, 0) + chunk.done
        if chunk.cut:
            done = TrainResult(step, [L] * chunk.done, {}, redone=chunk.redone) if chunk.done or chunk.redone else None
            raise ChunkInterrupted(f"sim: an instance of trial {chunk.trial} was reclaimed", done)
        return TrainResult(step, [L] * chunk.done, {w.metric: w.curves.metric(chunk.trial, step)}, redone=chunk.redone)


def rehearse_once(plan: Plan, model: ModelProfile, cloud: CloudProfile | Mapping[str, CloudProfile] | None = None,
                    seed: int = 0, mode: str = "min", replan_with: ModelProfile | None = None,
                    safety_net: ModelProfile | None = None, budget_usd: float | None = None,
                    search_space: Any = None, metric: str = "metric",
                    target_model: ModelProfile | Mapping[str, ModelProfile] | None = None,
                    replan_target: ModelProfile | None = None) -> SimRun:
    """One rehearsal of ``plan`` against the truth ``model`` and ``cloud`` (default the plan's):
    the executor's ``Driver`` applies the scheduler's decisions through the virtual ports
    (``SimClusterPort``, ``SimRunnerPort``) as a real run applies them, re-planning on
    ``replan_with`` (the planning profile) when given, with the spot safety net estimating on
    ``safety_net`` (the planning profile) and a hard budget when asked. Trials draw their configs
    from ``search_space`` (a mapping or a ``Search``) as in a run; the metrics (named ``metric``)
    stay the synthetic curves', whatever the config. A surrogate job (DESIGN §4.6) draws its target
    stage from ``target_model`` (the truth) and re-plans with ``replan_target`` (planning's)."""
    world = SimWorld(plan, model, cloud, seed, mode, metric, target_model=target_model)
    cluster = SimClusterPort(world)
    runner = SimRunnerPort(world, cluster)
    driver = Driver(plan, cluster, runner, search_space or {}, world.metric, mode=mode, seed=seed, clock=world.clock,
                    node_timeout_s=math.inf, wait_timeout_s=math.inf, poll_s=math.inf, replan_with=replan_with,
                    safety_net=safety_net, budget_usd=budget_usd, wait_for_resumes=False,
                    max_instances=plan.info.get("max_instances"),      # re-plans keep the plan's limit
                    target_model=replan_target if replan_target is not None else
                    (model_of(target_model, plan.cloud, "target_model") if target_model is not None else None))
    quiet = logging.getLogger("rubberband.executor")
    level = quiet.level
    quiet.setLevel(logging.ERROR)        # a rehearsal's reclaims are its report, not log lines
    try:
        out = driver.run()
    finally:
        quiet.setLevel(level)
    cluster.shutdown()
    windows = [(s.start_s, s.end_s) for s in out.stages]
    if out.report is None:
        raise SpecError("sim: the driver returned no scheduler report")
    return SimRun(out.ended_at - out.started_at, list(cluster.instances.values()), world.train_runs, windows,
                  out.report, world.seed, cluster.reclaims, out.stopped, out.timeline,
                  {t.id: t.config for t in out.trials.values()})
