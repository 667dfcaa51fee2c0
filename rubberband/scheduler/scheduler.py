"""The scheduler: every decision of a SHA or HyperBand job, as a pure function of the events seen.

It follows one ``Plan`` stage by stage (DESIGN §4, §4.1, §6):

* **Instances.** A stage holds ``plan.instances[i]`` instances, ``plan.spot_counts[i]`` of
  them spot. The scheduler thinks in *positions* (as the simulator does): a position is one
  instance the plan holds, filled by successive instances when spot ones are reclaimed. A
  stage that needs more positions requests them all at once (one SCALE) and starts its
  trials once every new one is ready. On a ``ReclaimNotice`` it requests a replacement for
  the position at once (provisioning overlaps the notice); trials keep training on the
  doomed instance until it is lost, then resume from their checkpoints on the replacement
  (or on any free GPUs first). Nothing new is placed on a doomed instance.
* **What runs next.** Trials run in rank order (the previous SYNC's); a stage runs
  ``min(a_i, n_i)`` of them at a time with ``gpus_per_trial[i]`` GPUs each, placed by
  ``rubberband.placement.place`` (unchanged trials stay where they are). When trials queue,
  a finished trial hands its GPUs to the next queued one; a trial whose instance was lost
  goes to the front of the queue.
* **Instance types and packing** (``docs/model.md``). Stage ``i`` holds instances of its own
  type (``plan.instance_types``; node type = type x market); at a SYNC before a change of
  type every instance of the old type is released, its survivors paused (checkpointed) first,
  and the new stage requests all its instances of the new type. A packed stage
  (``plan.trials_per_gpu`` k > 1, 1-GPU trials) runs ``min(n, a * k)`` trials at once, placed
  ``k`` to a GPU on its ``a`` GPUs by ``rubberband.placement.place_packed`` (``StartTrial``
  says ``trials_per_gpu``); a freed share takes the next queued trial. Survivors stay where
  they are across a SYNC only between unpacked stages of one type; the others are paused
  and placed anew (resized from their checkpoints).
* **Promotion.** At each SYNC the stage's trials are ranked by metric (``mode`` min or max;
  a stable sort, so ties keep the order they ran in; a missing or NaN metric ranks last)
  and the best ``n_{i+1}`` go on, unless the next stage starts a new HyperBand bracket —
  then all stop and the bracket's trials are created (``b{k}-t{j:03d}``; ``t{j:03d}`` for
  a single bracket).
* **Release at a SYNC.** When the next stage holds fewer positions of a market, the newest
  go: survivors that run next at the same size stay, those on released instances are packed
  onto the kept ones first (``scale_down_plan``: ``ResizeTrial``), the others are paused.
* **Re-planning** (with a ``Replanner``): at each SYNC, before anything is released, the
  stages still to come may switch to a new plan from the normal planner, made on the
  profile corrected by what the TRAINs so far took (``replan.py``: the estimator and the
  anti-flapping rule); the ``Replan`` decision reports it. The first spot reclaim of a stage
  re-plans the stages after it too, as if the stage's SYNC came when the safety net's
  estimate of its remaining work says (several instances lost at once are one reclaim).
* **Spot safety net** (with a ``SafetyNet``, ``safety.py``: the rule and its estimate of the
  on-demand finish time): reclaimed spot is replaced with spot until the slack left no
  longer covers finishing on on-demand plus two replacement delays (a rule armed only for
  spot that can be reclaimed, from the first reclaim or a spot request waiting for
  capacity: ``safety.py``); then, once, every
  stage from the current one runs on on-demand (``SafetySwitch``): spot requests not yet
  granted are cancelled, each spot position gets an on-demand instance (one scale-up), and
  a spot instance still up is *retired* — nothing new is placed on it, the trial on it
  finishes its TRAIN (a checkpoint) and the instance is released. The scheduler asks for a
  ``Tick`` (``Wake``) when the slack would run out if nothing progressed.
* **Budget** (``budget_usd``): no instance is requested whose minimum charge (with what is
  already committed, ``safety.Budget``) would break the budget, and a run whose spend would
  reach it within one more billing granule stops (woken by a ``Tick`` if need be): every
  trial stopped, every instance released, ``JobDone`` with the best trial so far and a
  one-line reason in ``stopped``. ``budget_left`` is what remains, for the status line.

How the driver uses it (``executor/driver.py``; the ``sim`` backend likewise): it calls
``start(now)`` and applies each returned decision through its ports — ``StageStarted`` /
``StageEnded`` open and close the stage's record, ``RetireInstances`` stops asking for spot the
safety net left, ``RequestInstances``
→ ``ClusterPort.scale_to`` (mapping the nodes that come up to the requested names, in
order), ``StartTrial`` → ``TrialRunnerPort.start``/``reassign`` + ``train`` (kept when the
gang already runs on those slots), ``ResizeTrial`` → stop and start from the checkpoint,
``StopTrial`` → ``stop``, ``ReleaseInstances`` → ``release_instance`` + ``release_to``,
``RunSync`` → the evaluation barrier, ``Replan`` and ``SafetySwitch`` → log them, ``Wake`` →
call ``on(Tick(), t)`` at that time (the latest ``Wake`` replaces earlier ones), ``JobDone`` →
report (with ``stopped``: the budget's reason; exit code 3). What its ports observe it turns
into events for ``on(event, now)``: a ready node (``InstanceReady``), a spot notice or a
vanished node (``ReclaimNotice``, ``InstanceLost`` with each interrupted trial's
checkpointed step), a dead gang (``TrialFailed``; more than ``MAX_TRIAL_RESTARTS`` of one
trial raise ``ProviderError``, as the driver does), a finished chunk of iterations
(``TrainFinished``) and the end of the barrier (``SyncDone``). Rehearsals (``--provider sim``)
drive it through the same driver, over the virtual-clock ports of ``rubberband.executor.sim``. Every decision
follows an event, so no clock tick is needed: ``now`` is passed with each event. At the end
``report()`` gives the frozen ``SchedulerReport``; the scheduler's state is private.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from rubberband.errors import ProviderError, SpecError
from rubberband.placement import (
    InfeasiblePlacementError,
    PackedDemand,
    PackedPlacement,
    Placement,
    Slot,
    place,
    place_packed,
    scale_down_plan,
)
from rubberband.plan.plan import Plan
from rubberband.profiles.cloud import Market
from rubberband.scheduler.events import (
    ComputeReplan,
    Decision,
    Event,
    InstanceLost,
    InstanceReady,
    JobDone,
    ReclaimNotice,
    ReleaseInstances,
    Replanned,
    ReplanReady,
    RequestInstances,
    ResizeTrial,
    RetireInstances,
    RunSync,
    SafetySwitch,
    SchedulerReport,
    StageEnded,
    StageFollowed,
    StageStarted,
    StartTrial,
    StopTrial,
    SyncDone,
    Tick,
    TrainFinished,
    TrialCheckpoint,
    TrialFailed,
    TrialRecord,
    Wake,
)
from rubberband.scheduler.replan import Replan, Replanner
from rubberband.scheduler.safety import WAKE_RESOLUTION_S, Budget, SafetyNet
from rubberband.simulator.model import redone_iters
from rubberband.units import format_usd


@dataclass
class TrialInfo:
    """One trial as the scheduler tracks it."""

    id: str
    bracket: int
    step: int = 0
    metric: float | None = None
    target: int = 0                  # the step this stage's TRAIN ends at
    running: bool = False
    eliminated_after: int | None = None
    restarts: int = 0                # gang failures (not reclaims) it resumed from
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Instance:
    name: str
    market: Market
    position: int
    itype: str
    gpus: int = 0
    requested_s: float = 0.0
    ready: bool = False
    doomed: bool = False             # reclaim notice received, or retired
    retired: bool = False            # spot the safety net moved off: released once its trial stops
    launched_s: float = math.inf


@dataclass
class _Position:
    seq: int
    market: Market
    itype: str                       # its instance type: every instance filling it is of it
    current: str                     # the instance filling it (ready or still provisioning)
    old: list[str] = field(default_factory=list)   # noticed instances still alive
    ahead: bool = False              # an eager target's (DESIGN §4.6), held apart until its stage


# A trial whose gang fails more often than this (its instances living on) fails the job.
MAX_TRIAL_RESTARTS = 3

TARGET_PREFIX = "target-"     # a target trial's name: this, then the surrogate winner's (DESIGN §4.6)


def target_trial(winner: str) -> str:
    """The name of the target trial that trains surrogate ``winner``'s config at full width."""
    return TARGET_PREFIX + winner


def is_target_trial(trial: str) -> bool:
    return trial.startswith(TARGET_PREFIX)


def is_superseded(trial: str, eliminated_after: int | None, target_stage: int) -> bool:
    """Whether target trial ``trial`` is an eager one restarted with another config (DESIGN §4.6):
    eliminated before the target stage (the one that stands ends with it, or is not eliminated)."""
    return is_target_trial(trial) and eliminated_after is not None and eliminated_after < target_stage


def surrogate_winner(trial: str) -> str:
    """The surrogate trial whose config target trial ``trial`` trains.

    Raises:
        SpecError: ``trial`` is not a target trial's name.
    """
    if not is_target_trial(trial):
        raise SpecError(f"trial {trial!r} is not a target trial (named {TARGET_PREFIX}<winner>)")
    return trial[len(TARGET_PREFIX):]


# ``rubberband.placement`` takes trials and nodes by any hashable id; this scheduler's are the
# names it gives them (strings), so what placement hands back is named by those strings.
def _name(placed: Hashable) -> str:
    """A trial or instance name from a placement (the scheduler placed it by that name)."""
    return cast(str, placed)


def _placement(assignments: Mapping[str, tuple[Slot, ...]]) -> Placement:
    """The scheduler's trials' slots as a ``Placement`` (keys typed as placement takes them)."""
    return Placement({t: s for t, s in assignments.items()})


class Scheduler:
    """Decisions for one plan (see the module docstring).

    Args:
        plan: the plan to follow.
        mode: ``min`` or ``max``: how trials rank by metric.
        replanner: re-plan the stages still to come at each SYNC (``None``: never).
        keep_warm: release nothing after the last SYNC (back-to-back runs reuse the instances).
        safety_net: move the rest of the job to on-demand when spot would make it late (``None``: never).
        budget_usd: a hard budget in dollars (``None``: none).
    """

    def __init__(self, plan: Plan, mode: str = "min", replanner: Replanner | None = None, keep_warm: bool = False,
                 safety_net: SafetyNet | None = None, budget_usd: float | None = None):
        if mode not in ("min", "max"):
            raise SpecError(f"mode: expected min or max, got {mode!r}")
        if plan.spec.eager is not None and any(plan.spot_counts):
            raise SpecError("surrogate.eager_transfer: a job whose target starts early runs on on-demand instances; "
                            "plan it with --market on-demand")
        self._plan, self._spec, self._mode, self._replanner = plan, plan.spec, mode, replanner
        self._keep_warm, self._net = keep_warm, safety_net
        # Each stage's instance type (node type = type x market), trials per GPU (packing) and
        # trials fused per GPU (DESIGN §4.5). A fused stage is placed as a packed one, ``F`` to a
        # GPU; its trials on one GPU are one program (``_share``, ``_fused``).
        self._types, self._packing = [c.instance_type for c in plan.stage_clouds], list(plan.packing)
        self._fusion = list(plan.fusion)
        self._clouds = {c.instance_type: c for c in (plan.cloud, *plan.stage_clouds)}
        self._budget = Budget(plan.cloud, budget_usd, self._clouds) if budget_usd is not None else None
        # How long the current stage has left, for a re-plan at a reclaim: the net's estimate.
        self._estimate = safety_net or (SafetyNet(replanner.model, plan.cloud, plan.deadline_s,
                                                  target_model=replanner.target_model)
                                        if replanner is not None and math.isfinite(plan.deadline_s) else None)
        self._switches: list[SafetySwitch] = []
        self._spot_cost = False          # a spot instance was reclaimed (safety.py: arms the net)
        self._stopped: str | None = None
        self._wake_at: float | None = None
        self._scale_began = 0.0
        self._reclaim_replanned: set[int] = set()
        # The plan being followed, stage by stage (a re-plan rewrites the stages still to come).
        self._allocation, self._held = list(plan.allocation), list(plan.instances)
        self._gpus_per_trial, self._spot = list(plan.gpus_per_trial), list(plan.spot_counts)
        self._replans: list[Replan] = []
        # trial -> (start, iters, GPUs, redone) of its TRAIN now; ``redone``: the iterations it
        # trains again first (``_owed``), ``None`` where the scheduler cannot tell how many.
        self._began: dict[str, tuple[float, int, int, int | None]] = {}
        self._started: set[str] = set()     # trials whose TRAIN of the current stage has begun (once or more)
        # r_i per stage (DESIGN §4): what a TRAIN of stage i trains again on resuming its trial.
        model = replanner.model if replanner is not None else safety_net.model if safety_net is not None else None
        self._redone = redone_iters(plan.spec, model) if model is not None else (0,) * plan.spec.num_stages()
        self._trials: dict[str, TrialInfo] = {}
        self._instances: dict[str, _Instance] = {}
        self._positions: dict[int, _Position] = {}
        self._placement: dict[str, tuple[Slot, ...]] = {}
        self._stage = -1
        self._phase = "idle"          # scaling -> training -> sync -> (next stage) ... -> done
        self._active: list[str] = []
        self._queue: list[str] = []
        self._trained: set[str] = set()
        self._waiting: set[str] = set()       # new instances the stage waits for
        self._replacements = 0
        self._seq = itertools.count()
        self._now = 0.0
        self._announced = self._ended = -1       # the last stage StageStarted and StageEnded reported
        self._tokens = itertools.count(1)
        self._asked: tuple[int, int, bool] | None = None    # the re-plan in flight: (token, stage, at a reclaim)
        self._unseen: list[tuple[int, int, float, int, bool, int | None]] = []    # TRAIN paces seen while a re-plan is in flight
        self._sync_state: tuple[int, list[str], float] | None = None    # a SYNC waiting for its re-plan: (stage, survivors, at)
        self._stage_trials: list[str] = []       # the trials of the stage running (or last run)
        # Eager transfer (DESIGN §4.6): the target trial started at the hand-over on instances of its
        # own (positions marked ``ahead``) while the tuning goes on, until the target stage begins.
        self._eager = plan.spec.eager
        self._ahead: str | None = None           # that trial, from the hand-over to the target stage
        self._leader: str | None = None          # the surrogate trial whose config it trains

    # --- entry points ------------------------------------------------------------------------
    def start(self, now: float = 0.0) -> list[Decision]:
        """The job's first decisions: stage 0's instances (and trials, if none are needed)."""
        if self._phase != "idle":
            raise SpecError("scheduler: start() was already called")
        self._now = now
        return self._guard(self._begin_stage(0))

    def on(self, event: Event, now: float) -> list[Decision]:
        """The decisions ``event`` (happening at ``now``) calls for, in the order to apply them."""
        self._now = now
        # Each handler takes the event of its own type (the key).
        handlers: dict[type, Callable[[Any], list[Decision]]] = {
            InstanceReady: self._ready, ReclaimNotice: self._notice, InstanceLost: self._lost,
            TrialFailed: self._failed, TrainFinished: self._finished, SyncDone: self._sync,
            TrialCheckpoint: self._checkpoint, ReplanReady: self._replan_ready, Tick: lambda ev: []}
        handler = handlers.get(type(event))
        if handler is None:
            raise SpecError(f"scheduler: unknown event {event!r}")
        if self._phase == "done":
            return []
        if isinstance(event, (ReclaimNotice, InstanceLost)) and event.name in self._instances \
                and self._instances[event.name].market is Market.SPOT:
            self._spot_cost = True          # arms the safety net's slack rule (safety.py)
        return self._guard(handler(event))

    def report(self) -> SchedulerReport:
        """What was decided so far, frozen (``events.SchedulerReport``): call it after ``JobDone``."""
        stages = tuple(StageFollowed(self._allocation[i], self._held[i], self._spot[i], self._gpus_per_trial[i],
                                     self._packing[i], self._types[i], self._fusion[i])
                       for i in range(self._spec.num_stages()))
        trials = {t.id: TrialRecord(t.id, t.bracket, t.step, t.metric, t.eliminated_after,
                                    tuple(dict(h) for h in t.history)) for t in self._trials.values()}
        return SchedulerReport(self._best(), self._stopped, trials, stages, dict(self._clouds), tuple(self._replans),
                               tuple(self._switches), self._budget.usd if self._budget is not None else None,
                               self._budget_left(), self._phase == "done")

    def _best(self) -> str | None:
        """The trial with the best final metric among those that trained longest; in a surrogate
        job, its target trial once it has a metric (the full-width training is the job's answer;
        the surrogates' metrics are of another model), else the best surrogate."""
        last = self._spec.num_stages() - 1
        targets = [t for t in self._trials.values()
                   if is_target_trial(t.id) and not is_superseded(t.id, t.eliminated_after, last)]
        if any(t.metric is not None and math.isfinite(t.metric) for t in targets):
            return targets[0].id
        finished = [(t, m) for t in self._trials.values()
                    if (m := t.metric) is not None and math.isfinite(m) and not is_target_trial(t.id)]
        if not finished:
            return None
        most = max(t.step for t, _ in finished)
        top = [(t, m) for t, m in finished if t.step == most]
        return min(top, key=lambda tm: tm[1] if self._mode == "min" else -tm[1])[0].id

    def _budget_left(self) -> float | None:
        """Dollars left of the budget at the last event (``None``: no budget), for the status line."""
        return None if self._budget is None else self._left_usd(self._budget)

    def _left_usd(self, budget: Budget) -> float:
        spent = budget.closed_usd + sum(self._open_usd(budget, x) for x in self._instances.values())
        return budget.usd - spent

    def _open_usd(self, budget: Budget, x: _Instance) -> float:
        return budget.instance_usd(x.market, x.launched_s if x.ready else x.requested_s, self._now, x.itype)

    # --- the guards ------------------------------------------------------------------------------
    def _guard(self, out: list[Decision]) -> list[Decision]:
        """After every event: the budget's and the safety net's checks (``safety.py``), the
        retired spot instances that can go, and when to be woken next."""
        if self._phase in ("done", "idle"):
            return out
        wakes: list[float] = []
        budget, net = self._budget, self._net
        if budget is not None:
            left = self._left_usd(budget)
            held: list[tuple[Market, str | None]] = [(x.market, x.itype) for x in self._instances.values()]
            granule = budget.granularity_usd(held)
            if left < 2 * granule:
                return out + self._stop(f"budget: {format_usd(budget.usd - left)} of {format_usd(budget.usd)} "
                                        "spent; one more billing second would break it")
            if held:
                rate = budget.usd_per_s(held)
                wakes.append(self._now + max((left - 2 * granule) / rate, WAKE_RESOLUTION_S))
        if net is not None and not self._switches and self._on_spot():
            slack = net.deadline_s - self._now - self._finish_on_demand_s(net)
            overdue = self._spot_overdue_at(net)
            if slack < net.needed_s + WAKE_RESOLUTION_S and (self._spot_cost or overdue <= self._now):
                out += self._switch(net, slack)
                if self._phase == "done":
                    return out
            elif slack >= net.needed_s + WAKE_RESOLUTION_S:
                wakes.append(self._now + slack - net.needed_s)
            elif math.isfinite(overdue):       # short of slack, but spot has cost nothing yet
                wakes.append(overdue)
        out += self._release_retired()
        if wakes and min(wakes) != self._wake_at:
            self._wake_at = min(wakes)
            out.append(Wake(self._wake_at))
        return out

    def _at_risk(self, itype: str) -> bool:
        return self._clouds[itype].spot.at_risk

    def _on_spot(self) -> bool:
        """Whether the job holds, or will hold, spot that can be reclaimed: by its profile, or
        any spot once one was (a reclaim the profile did not model); or waits for a spot
        instance, which may never come whatever the profile models; else the net stays off."""
        risky = (lambda t: True) if self._spot_cost else self._at_risk
        return (any(p.market is Market.SPOT and risky(p.itype) for p in self._positions.values())
                or any(s > 0 and risky(t) for s, t in zip(self._spot[self._stage:], self._types[self._stage:]))
                or bool(self._spot_waiting()))

    def _spot_waiting(self) -> list[_Instance]:
        """Spot instances requested and not yet ready (any spot: capacity may never come)."""
        return [x for x in self._instances.values() if x.market is Market.SPOT and not x.ready]

    def _spot_overdue_at(self, net: SafetyNet) -> float:
        """When the oldest spot request still not granted counts as waiting for capacity: two
        replacement delays (the net's margin) after it was made (``inf``: none waits). Any spot
        request counts, reclaimable or not: capacity that never comes costs time all the same."""
        return min((x.requested_s + net.needed_s for x in self._spot_waiting()), default=math.inf)

    def _factor(self) -> float:
        return self._replanner.factor if self._replanner is not None else 1.0

    def _stage_left(self, net: SafetyNet) -> tuple[float, float]:
        """The current stage's expected remaining time on the instances it has, and its variance
        (``safety.py``)."""
        tgt = self._spec.stages[self._stage].target
        if self._phase in ("sync", "replanning"):
            return net.stage_sync_s(tgt), 0.0
        f, m, n = self._factor(), self._gpus_per_trial[self._stage], self._spec.stages[self._stage].num_trials
        packed, fused = self._share(self._stage), self._fused(self._stage)
        r = self._redone[self._stage]
        busy, most = [], 0.0
        for tid, (start, todo, gpus, owed) in self._began.items():
            if self._trials[tid].running:
                # All it trains: its iterations and the redone ones it owes (all of ``r`` when
                # unknown: the estimate leans late).
                iters = todo + (r if owed is None else owed)
                busy.append(max(start + net.train_s(gpus, iters, n, f, packed, fused, tgt) - self._now, 0.0))
                if net.by_target(tgt):     # the target's own profile, uncorrected
                    pace, g = net.latency(gpus, packed, fused, tgt).mean, 1.0
                else:
                    model = self._replanner.model if self._replanner else net.model
                    pace = (model.fused_latency(packed) if fused else
                            model.packed_latency(packed) if packed > 1 else model.latency(gpus)).mean
                    g = f
                most = max(most, iters - max(self._now - start, 0.0) / (pace * g))
        queued = [self._trials[t].target - self._trials[t].step + (o if (o := self._owed(t)) is not None else r)
                  for t in self._queue]
        left = net.stage_s(busy, [net.train_s(m, k, n, f, packed, fused, tgt) for k in queued], self._concurrency(),
                           tgt)
        if self._phase == "scaling":        # what is left of the scale-up, on on-demand
            left += max(self._scale_s(self._types[self._stage]) - (self._now - self._scale_began), 0.0)
        waves = math.ceil(len(queued) / max(self._concurrency(), 1))
        var = (net.train_var(m, max(most, 0.0), f, packed, fused, tgt)
               + waves * net.train_var(m, max(queued, default=0), f, packed, fused, tgt))
        return left, var

    def _stage_left_s(self, net: SafetyNet) -> float:
        """The current stage's remaining time, estimated late (a re-plan at a reclaim)."""
        return net.late(*self._stage_left(net))

    def _finish_on_demand_s(self, net: SafetyNet) -> float:
        """``T_od`` of ``safety.py``: the remaining work's time on on-demand instances."""
        spec, f = self._spec, self._factor()
        total, var = self._stage_left(net)
        for j in range(self._stage + 1, spec.num_stages()):
            n, m, packed = spec.stages[j].num_trials, self._gpus_per_trial[j], self._share(j)
            k = spec.stages[j].iters + self._redone[j]       # every TRAIN of a stage to come trains its r_j too
            slots, tgt = min(self._allocation[j] * packed, n), spec.stages[j].target
            total += net.stage_s([], [net.train_s(m, k, n, f, packed, self._fused(j), tgt)] * n, slots, tgt)
            var += math.ceil(n / slots) * net.train_var(m, k, f, packed, self._fused(j), tgt)
            if self._held[j] > self._held[j - 1] or self._types[j] != self._types[j - 1]:
                total += self._scale_s(self._types[j])
        return net.late(total, var)

    def _scale_s(self, itype: str) -> float:
        """A scale-up's expected SCALE + INIT on instance type ``itype``."""
        cloud = self._clouds[itype]
        return cloud.provision_latency_s.mean + cloud.init_latency_s.mean

    def _switch(self, net: SafetyNet, slack: float) -> list[Decision]:
        """The safety net's switch: the rest of the job on on-demand (module docstring)."""
        i, last = self._stage, self._spec.num_stages() - 1
        spot = sorted((p for p in self._positions.values() if p.market is Market.SPOT), key=lambda p: p.seq)
        refused = self._afford({Market.ON_DEMAND: len(spot)}, self._types[i])
        if refused:
            return self._stop(refused)
        record = SafetySwitch(self._now, i, last, slack, net.needed_s)
        self._switches.append(record)
        self._spot[i:] = [0] * (last + 1 - i)
        out: list[Decision] = [record]
        cancel, fresh, retired = [], [], []
        for pos in spot:
            pos.market = Market.ON_DEMAND
            cur = self._instances[pos.current]
            if cur.ready:
                cur.doomed = cur.retired = True
                pos.old.append(cur.name)
                retired.append(cur.name)
            else:
                cancel.append(cur.name)
            name = self._replacement(pos)
            if cur.name in self._waiting:
                self._waiting.add(name)
            fresh.append(name)
        # Spot launches still on their way are cancelled before the ones up are retired, so that
        # the request the retirement lowers counts none of them (a virtual cluster would launch a
        # spot instance for the difference, only to cancel it the next moment).
        if cancel:
            out.append(self._release(cancel))
        if retired:
            out.append(RetireInstances(tuple(retired)))
        if fresh:
            out.append(RequestInstances(tuple(fresh), self._types[i], Market.ON_DEMAND, i))
        return out

    def _replacement(self, pos: _Position) -> str:
        """A new instance for ``pos`` on its market, now its current one."""
        self._replacements += 1
        name = f"i{pos.seq:03d}.{self._replacements}"
        self._instances[name] = _Instance(name, pos.market, pos.seq, pos.itype, requested_s=self._now)
        pos.current = name
        return name

    def _release_retired(self) -> list[Decision]:
        """Release retired spot instances no trial runs on any more."""
        out: list[Decision] = []
        gone = []
        for x in [x for x in self._instances.values() if x.retired]:
            on = [t for t, s in self._placement.items() if any(n == x.name for n, _ in s)]
            if any(self._trials[t].running for t in on):
                continue
            for tid in on:
                del self._placement[tid]
                out.append(StopTrial(tid, eliminated=False))
            self._positions[x.position].old.remove(x.name)
            gone.append(x.name)
        if gone:
            out.append(self._release(gone))
        return out

    def _release(self, names: list[str]) -> ReleaseInstances:
        """Release (or cancel) these instances, closing what each cost."""
        for name in names:
            x = self._instances.pop(name, None)
            if x is not None and self._budget is not None:
                self._budget.closed_usd += self._open_usd(self._budget, x)
            self._waiting.discard(name)
        return ReleaseInstances(tuple(names), self._stage)

    def _afford(self, want: Mapping[Market, int], itype: str) -> str | None:
        """Why ``want`` (more ``itype`` instances by market) would break the budget (``None``: it
        would not). Checked once for all markets: each alone may fit what is left while all do not."""
        want = {m: c for m, c in want.items() if c > 0}
        if self._budget is None or not want:
            return None
        need = sum(c * self._budget.minimum_usd(m, itype) for m, c in want.items())
        left = self._left_usd(self._budget)
        held: list[tuple[Market, str | None]] = [(x.market, x.itype) for x in self._instances.values()]
        # The instances held keep billing while the new ones come up: keep a granule for them.
        if need <= left - self._budget.granularity_usd(held):
            return None
        more = " and ".join(f"{c} more {itype} ({m.value})" for m, c in want.items())
        return (f"budget: {format_usd(left)} left of {format_usd(self._budget.usd)} cannot pay the minimum charge of "
                f"{more}: {format_usd(need)}")

    def _stop(self, reason: str) -> list[Decision]:
        """Stop the job now: every trial stopped, every instance released, the best so far reported."""
        out: list[Decision] = []
        for tid in [*self._placement, *(t for t, x in self._trials.items() if x.running and t not in self._placement)]:
            self._trials[tid].running = False
            out.append(StopTrial(tid, eliminated=False))
        self._placement.clear()
        self._queue.clear()
        self._began.clear()
        names = [n for p in sorted(self._positions.values(), key=lambda p: -p.seq) for n in (p.current, *p.old)]
        if names:
            out.append(self._release(names))
        self._positions.clear()
        self._phase, self._stopped = "done", reason
        if self._announced > self._ended:          # the stage it stopped in
            out.append(self._stage_ended(self._announced, ()))
        return out + [JobDone(self._best(), reason)]

    def _stage_ended(self, i: int, promoted: tuple[str, ...], at: float | None = None) -> StageEnded:
        self._ended = i
        return StageEnded(i, tuple(self._stage_trials), promoted, self._held[i], self._spot[i], self._budget_left(),
                          self._now if at is None else at)

    # --- stages --------------------------------------------------------------------------------
    def _want(self, i: int) -> dict[Market, int]:
        return {Market.ON_DEMAND: self._held[i] - self._spot[i], Market.SPOT: self._spot[i]}

    def _begin_stage(self, i: int) -> list[Decision]:
        spec = self._spec
        self._stage, self._phase, self._scale_began = i, "scaling", self._now
        if i in spec.bracket_starts:
            bracket = spec.bracket_starts.index(i)
            multi = len(spec.bracket_starts) > 1
            self._active = [f"b{bracket}-t{j:03d}" if multi else f"t{j:03d}" for j in range(spec.stages[i].num_trials)]
            for tid in self._active:
                self._trials[tid] = TrialInfo(tid, bracket)
        elif spec.stages[i].target:
            # The target stage (DESIGN §4.6): the surrogate winner's config is a new trial at full
            # width, from scratch; the winner itself stays what it was (stopped, not eliminated).
            self._active = [target_trial(tid) for tid in self._active]
            for tid in self._active:
                self._trials[tid] = TrialInfo(tid, self._trials[surrogate_winner(tid)].bracket)
        for tid in self._active:
            trial = self._trials[tid]
            trial.target = trial.step + spec.stages[i].iters
        self._trained, self._queue, self._started = set(), list(self._active), set()
        itype = self._types[i]
        fresh = {market: count - sum(1 for p in self._positions.values()
                                     if p.market is market and p.itype == itype and not p.ahead)
                 for market, count in self._want(i).items()}
        refused = self._afford(fresh, itype)
        if refused:
            return self._stop(refused)
        self._announced, self._stage_trials = i, list(self._active)
        out: list[Decision] = [StageStarted(i, tuple(self._active), spec.stages[i].iters, self._gpus_per_trial[i],
                                            self._share(i), self._held[i], self._spot[i], itype, self._clouds[itype],
                                            self._budget_left(), self._fused(i))]
        for market, count in fresh.items():
            if count > 0:
                names = tuple(self._new_position(market) for _ in range(count))
                self._waiting.update(names)
                out.append(RequestInstances(names, itype, market, i))
        if not self._waiting:
            out += self._start_training()
        return out

    def _new_position(self, market: Market, itype: str | None = None, ahead: bool = False) -> str:
        seq, itype = next(self._seq), itype or self._types[self._stage]
        name = f"i{seq:03d}"
        self._positions[seq] = _Position(seq, market, itype, name, ahead=ahead)
        self._instances[name] = _Instance(name, market, seq, itype, requested_s=self._now)
        return name

    def _start_training(self) -> list[Decision]:
        i = self._stage
        self._phase = "training"
        m, first = self._gpus_per_trial[i], set(self._queue[: self._concurrency()])
        out: list[Decision] = []
        # Trials that do not run first, or run at another size, give their slots up.
        for tid in list(self._placement):
            if tid == self._ahead:        # an eager target on its own instances (DESIGN §4.6)
                continue
            if tid not in first or len(self._placement[tid]) != m:
                del self._placement[tid]
                if tid not in first:
                    out.append(StopTrial(tid, eliminated=False))
        return out + self._fill()

    def _concurrency(self) -> int:
        return self._concurrency_of(self._stage)

    def _concurrency_of(self, i: int) -> int:
        """How many of stage ``i``'s trials run at once: ``a_i`` (times ``k`` packed, or ``F``
        fused) at most."""
        return min(self._allocation[i] * self._share(i), self._spec.stages[i].num_trials)

    def _share(self, i: int) -> int:
        """Trials per GPU in stage ``i``: ``k`` packed, ``F`` fused (exclusive), else 1."""
        return max(self._packing[i], self._fusion[i])

    def _fused(self, i: int) -> bool:
        """Whether stage ``i``'s trials on one GPU train as one fused program (DESIGN §4.5)."""
        return self._fusion[i] > 1

    def _fill(self) -> list[Decision]:
        """Start queued trials while the stage has room for them."""
        room = self._concurrency() - sum(1 for t in self._active if self._trials[t].running)
        if room <= 0 or not self._queue:
            return []
        batch = self._queue[:room]
        assigned = self._place(batch)
        out: list[Decision] = []
        for tid in batch:
            if tid in assigned:
                self._queue.remove(tid)
                out.append(self._start(tid, assigned[tid]))
        return out

    def _good_nodes(self, ahead: bool = False) -> list[tuple[str, int]]:
        """Ready instances that are not about to be reclaimed, oldest first: the stage's, or
        (``ahead``) an eager target's before its stage (DESIGN §4.6)."""
        ready = [x for x in self._instances.values() if x.ready and not x.doomed
                 and self._positions[x.position].ahead == ahead]
        ready.sort(key=lambda x: (x.launched_s, x.position))
        return [(x.name, x.gpus) for x in ready]

    def _place(self, trials: list[str]) -> dict[str, tuple[Slot, ...]]:
        m = self._gpus_per_trial[self._stage]
        nodes = self._good_nodes()
        good = {n for n, _ in nodes}
        previous = {t: s for t, s in self._placement.items() if all(n in good for n, _ in s)}
        others = [t for t in previous if t not in trials]
        k = self._share(self._stage)
        if k > 1:     # 1-GPU trials, k to a GPU (place_packed's worst fit); the others keep their GPUs
            demand, left, paid = PackedDemand(k), self._allocation[self._stage], []
            if self._fused(self._stage):
                # Fused: ceil(n / F) groups, one GPU each (DESIGN §4.5): only as many GPUs as groups.
                left = min(left, -(-self._spec.stages[self._stage].num_trials // k))
            for name, gpus in nodes:       # only the stage's a GPUs, oldest instances first: k to each
                if left > 0:
                    paid.append((name, min(gpus, left)))
                    left -= min(gpus, left)
            packed = place_packed({t: demand for t in [*others, *trials]}, paid, previous=PackedPlacement(
                {t: previous[t][0] for t in others}, dict.fromkeys(others, demand)))
            return {t: (packed.assignments[t],) for t in trials if t in packed.assignments}
        placed = place({**{t: len(previous[t]) for t in others}, **{t: m for t in trials}}, nodes,
                       previous=_placement(previous), reserved=others)
        return {t: placed.assignments[t] for t in trials if t in placed.assignments}

    def _owed(self, tid: str) -> int | None:
        """The redone iterations (DESIGN §4) trial ``tid``'s TRAIN of the current stage trains
        first when it starts now: the stage's ``r_i`` at its first start; none when it resumes a
        TRAIN that had got past them (its step moved: the redone ones are trained first and kept,
        §4.1); ``None`` when it resumes one cut before its step moved (part of ``r_i`` may be
        owed still, the scheduler cannot tell how much)."""
        r = self._redone[self._stage]
        if tid not in self._started or r == 0:
            return r
        trial = self._trials[tid]
        return 0 if trial.step > trial.target - self._spec.stages[self._stage].iters else None

    def _start(self, tid: str, slots: tuple[Slot, ...]) -> StartTrial:
        trial = self._trials[tid]
        trial.running = True
        self._placement[tid] = slots
        self._began[tid] = (self._now, trial.target - trial.step, len(slots), self._owed(tid))
        self._started.add(tid)
        return StartTrial(tid, self._stage, slots, trial.target - trial.step, self._share(self._stage),
                          self._fused(self._stage))

    # --- events --------------------------------------------------------------------------------
    def _ready(self, ev: InstanceReady) -> list[Decision]:
        inst = self._instances.get(ev.name)
        if inst is None:          # released or cancelled meanwhile
            return []
        inst.ready, inst.gpus, inst.launched_s = True, ev.gpus, ev.launched_s
        if self._positions[inst.position].ahead:
            return self._start_ahead()
        self._waiting.discard(ev.name)
        if self._phase == "scaling" and not self._waiting:
            return self._start_training()
        return self._fill() if self._phase == "training" else []

    def _notice(self, ev: ReclaimNotice) -> list[Decision]:
        inst = self._instances.get(ev.name)
        if inst is None or inst.doomed:
            return []
        inst.doomed = True
        pos = self._positions[inst.position]
        if pos.current != ev.name:
            return []
        refused = self._afford({pos.market: 1}, pos.itype)
        if refused:
            return self._stop(refused)
        pos.old.append(ev.name)
        fresh = self._replacement(pos)
        # A scale-up noticed before it is ready still ends when it is ready (or lost): the
        # stage starts then, and its trials that find no room yet take the replacement when
        # it comes (DESIGN §4: the stage waits for the instances of its SCALE).
        # (an eager target's replacement is its stage's, not the tuning's: DESIGN §4.6)
        stage = self._spec.num_stages() - 1 if pos.ahead else self._stage
        return [RequestInstances((fresh,), pos.itype, pos.market, stage, replaces=ev.name)]

    def _lost(self, ev: InstanceLost) -> list[Decision]:
        inst = self._instances.get(ev.name)
        if inst is None:
            return []
        out = self._notice(ReclaimNotice(ev.name)) if not inst.doomed else []
        if self._phase == "done":           # the budget could not pay the replacement
            return out
        self._release([ev.name])           # gone (nothing to tell the backend): what it cost is closed
        if self._phase == "scaling" and not self._waiting:     # the last of a scale-up, lost before it was ready
            out += self._start_training()
        self._positions[inst.position].old.remove(ev.name)
        interrupted = [t for t, s in self._placement.items() if any(n == ev.name for n, _ in s)]
        resume = []
        for tid in interrupted:
            del self._placement[tid]
            trial = self._trials[tid]
            if trial.running:
                trial.running = False
                self._began.pop(tid, None)         # an interrupted TRAIN says nothing of the pace (``_owed``)
                trial.step = ev.progress.get(tid, trial.step)
                if tid != self._ahead:             # the early target resumes on its own replacement
                    resume.append(tid)
        self._queue[:0] = [t for t in resume if t not in self._queue]
        if inst.market is Market.SPOT and self._stage not in self._reclaim_replanned and self._phase == "training":
            self._reclaim_replanned.add(self._stage)
            out += self._replan(self._stage, reclaim=True)
        return out + (self._fill() if self._phase == "training" else [])

    def _checkpoint(self, ev: TrialCheckpoint) -> list[Decision]:
        """A trial on a noticed instance checkpointed: it moves to good GPUs if there is room
        now (else it trains on there until its next checkpoint or the reclaim), and a noticed
        instance that nothing runs on any more is released before the provider reclaims it."""
        trial, slots = self._trials.get(ev.trial), self._placement.get(ev.trial, ())
        if trial is None or not trial.running or not any(self._instances[_name(n)].doomed for n, _ in slots):
            return []
        assigned = self._place([ev.trial])
        if ev.trial not in assigned:
            return []
        trial.step = ev.step
        self._began.pop(ev.trial, None)          # a TRAIN split by a move: only its remainder is observed (``_owed``)
        out: list[Decision] = [self._start(ev.trial, assigned[ev.trial])]
        busy = {n for s in self._placement.values() for n, _ in s}
        vacated = [x for x in self._instances.values() if x.doomed and x.ready and not x.retired and x.name not in busy]
        for x in vacated:
            pos = self._positions.get(x.position)
            if pos is not None and x.name in pos.old:
                pos.old.remove(x.name)
        if vacated:
            out.append(self._release([x.name for x in vacated]))
        return out

    def _failed(self, ev: TrialFailed) -> list[Decision]:
        trial = self._trials[ev.trial]
        trial.restarts += 1
        if trial.restarts > MAX_TRIAL_RESTARTS:
            raise ProviderError(f"trial {ev.trial}: its gang failed {trial.restarts} times on live instances; "
                                "the trainer or the workers are broken, not the cluster")
        trial.running, trial.step = False, ev.step
        self._began.pop(ev.trial, None)
        self._placement.pop(ev.trial, None)
        if ev.trial == self._ahead:
            return self._start_ahead()
        if ev.trial not in self._queue:
            self._queue.insert(0, ev.trial)
        return self._fill() if self._phase == "training" else []

    def _finished(self, ev: TrainFinished) -> list[Decision]:
        trial = self._trials[ev.trial]
        trial.running, trial.step, trial.metric = False, ev.step, float(ev.metric)
        if ev.trial == self._ahead:
            # The early target trained before its stage (DESIGN §4.6): it waits on its instances
            # for the tuning's verdict; its stage's SYNC comes once the tuning is over.
            trial.history.append({"stage": self._spec.num_stages() - 1, "step": ev.step, "metric": float(ev.metric),
                                  "end_s": self._now})
            return []
        began = self._began.pop(ev.trial, None)
        # A target TRAIN runs another model (DESIGN §4.6): its pace says nothing of the surrogate's.
        # A TRAIN resumed after a cut (reclaim, move, retry) is observed for what it trained: its
        # iterations left and none redone when it had got past them; not at all when it may
        # still have owed part of them (``_owed``: ``None``).
        if (began is not None and began[3] is not None and self._replanner is not None
                and not self._spec.stages[self._stage].target):
            start, iters, gpus, owed = began
            pace = (gpus, iters, self._now - start, self._share(self._stage), self._fused(self._stage),
                    self._stage if owed else None)
            if self._asked is None:
                self._replanner.observe(*pace)
            else:                          # the replanner is busy off the loop: observed when it is done
                self._unseen.append(pace)
        trial.history.append({"stage": self._stage, "step": ev.step, "metric": float(ev.metric), "end_s": self._now})
        self._trained.add(ev.trial)
        out: list[Decision] = []
        if self._queue:
            slots = self._placement.pop(ev.trial, ())
            if slots and not any(self._instances[_name(n)].doomed for n, _ in slots):
                out.append(self._start(self._queue.pop(0), slots))     # this GPU takes the next queued trial
            else:
                out += self._fill()
        if len(self._trained) == self._spec.stages[self._stage].num_trials:
            self._phase = "sync"
            out.append(RunSync(self._stage))
        return out

    def _rank_key(self, tid: str) -> float:
        metric = self._trials[tid].metric
        if metric is None or math.isnan(metric):
            return math.inf
        return metric if self._mode == "min" else -metric

    def _sync(self, ev: SyncDone) -> list[Decision]:
        i, spec = ev.stage, self._spec
        if i != self._stage or self._phase != "sync":
            raise SpecError(f"scheduler: SyncDone for stage {i}, but stage {self._stage} is {self._phase}")
        last = i + 1 == spec.num_stages()
        next_same = not last and (i + 1) not in spec.bracket_starts
        ranked = sorted(self._active, key=self._rank_key)
        keep = ranked[: spec.stages[i + 1].num_trials] if next_same else []
        if next_same and spec.stages[i + 1].target and len(spec.bracket_starts) > 1:
            # HyperBand's target trains the job's best config (DESIGN §4.6), not its last bracket's.
            best = self._best()
            keep = [best] if best is not None else keep
        self._sync_state = (i, keep, self._now)
        asked = self._replan(i)
        if asked:                          # the SYNC goes on when the plan comes (``_replan_ready``)
            self._phase = "replanning"
            return asked
        return self._finish_sync()

    def _finish_sync(self) -> list[Decision]:
        """The rest of the SYNC ending stage ``i``, on the plan as it now is: stop the losers,
        release what the next stage does not hold, start the next stage."""
        state, self._sync_state = self._sync_state, None
        if state is None:
            raise SpecError("scheduler: no SYNC waits to be finished")     # _sync sets it first
        i, keep, at = state
        spec = self._spec
        last = i + 1 == spec.num_stages()
        out: list[Decision] = []
        for tid in self._active:
            if tid not in keep:
                self._trials[tid].eliminated_after = i
                self._placement.pop(tid, None)
                out.append(StopTrial(tid, eliminated=True))
        target = self._want(i + 1) if not last else self._want(i) if self._keep_warm else \
            {Market.ON_DEMAND: 0, Market.SPOT: 0}
        if not last and self._eager is not None and spec.stages[i + 1].target:
            target = {Market.ON_DEMAND: 0, Market.SPOT: 0}     # the target runs on its own instances (§4.6)
        self._stage_trials = list(self._active)
        out += self._shrink(keep, target, self._types[i] if last else self._types[i + 1])
        # Noticed instances kept: no trial runs on them now, and none will (DESIGN §4.1: their
        # replacements are requested already), so they go now rather than at their reclaim.
        noticed = [n for p in sorted(self._positions.values(), key=lambda p: -p.seq) for n in p.old]
        for p in self._positions.values():
            p.old.clear()
        if noticed:
            out.append(self._release(noticed))
        self._active = keep
        # The stage's record comes first; the budget left is after this SYNC's releases.
        ended = [self._stage_ended(i, tuple(keep), at)]
        if last:
            self._phase = "done"
            return ended + out + [JobDone(self._best())]
        if self._eager is not None and spec.stages[i + 1].target:
            return ended + out + self._verdict(keep[0] if keep else None)
        out = ended + out
        if self._eager is not None and i == self._eager.after_stage and keep:
            # The target's own scale-up first: it is launched apart from the next stage's (§4.6).
            out += self._hand_over(keep[0])
            if self._phase == "done":
                return out
        return out + self._begin_stage(i + 1)

    def _replan(self, i: int, reclaim: bool = False) -> list[Decision]:
        """At the SYNC ending stage ``i`` (or at a reclaim during it: its SYNC is then when the
        estimate of its remaining work says): ask for the re-plan of the stages still to come
        (``replan.py``), run off the backend's loop (``ComputeReplan``); ``_replan_ready``
        switches to it when it comes, if the replanner says so, and reports it. A re-plan
        still in flight when another is asked for is dropped."""
        if self._replanner is None or (reclaim and self._estimate is None) or self._eager is not None:
            return []
        at = self._now + (self._stage_left_s(self._estimate) if reclaim and self._estimate is not None else 0.0)
        replanner, allocation, held, spot = self._replanner, list(self._allocation), list(self._held), list(self._spot)
        market = Market.ON_DEMAND if self._switches else None
        trigger = "reclaim in stage" if reclaim else "sync"
        types, packing, fusion = list(self._types), list(self._packing), list(self._fusion)
        self._observe_unseen()
        token = next(self._tokens)
        self._asked = (token, i, reclaim)
        return [ComputeReplan(token, i, lambda: replanner.replan(i, at, allocation, held, spot, market=market,
                                                                 trigger=trigger, types=types, packing=packing,
                                                                 fusion=fusion))]

    def _observe_unseen(self) -> None:
        if self._replanner is not None:        # paces are kept only for a replanner
            for pace in self._unseen:
                self._replanner.observe(*pace)
        self._unseen.clear()

    def _replan_ready(self, ev: ReplanReady) -> list[Decision]:
        """The re-plan asked for came back: follow it (if it is the one awaited and still about
        the stages to come), then go on with the SYNC that waited for it."""
        if self._asked is None or ev.token != self._asked[0]:
            return []
        _, i, reclaim = self._asked
        self._asked = None
        self._observe_unseen()
        out = self._follow(i, ev.result) if i == self._stage else []
        if self._phase == "replanning":
            self._phase = "sync"
            out += self._finish_sync()
        return out

    def _follow(self, i: int, found: Replanned) -> list[Decision]:
        """Switch stages ``i+1..`` to the new plan of ``found`` (``None``: keep the plan)."""
        if found is None:
            return []
        new, record = found
        first = i + 1
        self._allocation[first:], self._held[first:] = list(new.allocation), list(new.instances)
        self._gpus_per_trial[first:], self._spot[first:] = list(new.gpus_per_trial), list(new.spot_counts)
        self._types[first:], self._packing[first:] = [c.instance_type for c in new.stage_clouds], list(new.packing)
        self._fusion[first:] = list(new.fusion)
        self._clouds.update({c.instance_type: c for c in new.stage_clouds})
        if self._budget is not None:
            self._budget.types.update(self._clouds)
        self._replans.append(record)
        return [record]

    # --- eager transfer (DESIGN §4.6) -------------------------------------------------------------
    def _hand_over(self, leader: str) -> list[Decision]:
        """At the SYNC ending ``after_stage``: the leader's config as the target trial, on
        instances of its own (the target stage's count, type, on-demand), trained as soon as
        they are up while the tuning goes on."""
        t = self._spec.num_stages() - 1
        itype = self._types[t]
        refused = self._afford({Market.ON_DEMAND: self._held[t]}, itype)
        if refused:
            return self._stop(refused)
        self._leader, self._ahead = leader, target_trial(leader)
        self._trials[self._ahead] = TrialInfo(self._ahead, self._trials[leader].bracket)
        self._trials[self._ahead].target = self._spec.stages[t].iters
        names = tuple(self._new_position(Market.ON_DEMAND, itype, ahead=True) for _ in range(self._held[t]))
        return [RequestInstances(names, itype, Market.ON_DEMAND, t)]

    def _start_ahead(self) -> list[Decision]:
        """The early target starts once all its instances are up (before its stage; after, its
        stage's own scale-up starts it)."""
        tid = self._ahead
        if tid is None or self._trials[tid].running or tid in self._placement:
            return []
        ahead = [x for x in self._instances.values() if self._positions[x.position].ahead]
        if not all(x.ready for x in ahead):
            return []
        t = self._spec.num_stages() - 1
        placed = place({tid: self._gpus_per_trial[t]}, self._good_nodes(ahead=True))
        if tid not in placed.assignments:
            raise SpecError(f"scheduler: the early target {tid} does not fit its {len(ahead)} instance(s)")
        trial = self._trials[tid]
        self._placement[tid] = placed.assignments[tid]
        trial.running = True
        return [StartTrial(tid, t, placed.assignments[tid], trial.target - trial.step, 1, False)]

    def _verdict(self, winner: str | None) -> list[Decision]:
        """The target stage of an eager job, at the tuning's last SYNC: the early target goes on if
        the winner is its leader; else it stops (superseded) and the winner's config starts over
        on the same instances. Every tuning instance went at this SYNC (``_finish_sync``)."""
        i = self._spec.num_stages() - 1
        self._stage, self._scale_began = i, self._now
        old = self._ahead
        for p in self._positions.values():
            p.ahead = False                     # the target stage's own now
        self._ahead = None
        out: list[Decision] = []
        if old is None:           # no hand-over happened (it stopped): the target as in a sequential job
            return self._begin_stage(i)
        if winner is None or winner == self._leader:
            tid = old
        else:
            tid = target_trial(winner)
            superseded = self._trials[old]
            superseded.eliminated_after = i - 1
            if superseded.running or old in self._placement:
                superseded.running = False
                self._placement.pop(old, None)
                out.append(StopTrial(old, eliminated=True))
            self._trials[tid] = TrialInfo(tid, self._trials[winner].bracket)
        trial = self._trials[tid]
        self._active, self._stage_trials = [tid], [tid]
        self._announced = i
        itype = self._types[i]
        out.append(StageStarted(i, (tid,), self._spec.stages[i].iters, self._gpus_per_trial[i], 1, self._held[i],
                                self._spot[i], itype, self._clouds[itype], self._budget_left(), False))
        self._waiting = {x.name for x in self._instances.values() if not x.ready}
        self._started = {tid} if trial.running else set()
        if trial.running:                          # kept, still training
            self._trained, self._queue, self._phase = set(), [], "training"
            self._began[tid] = (self._now, trial.target - trial.step, self._gpus_per_trial[i], 0)
            return out
        if tid == old and trial.metric is not None:     # kept, trained already: its SYNC now
            self._trained, self._queue, self._phase = {tid}, [], "sync"
            return out + [RunSync(i)]
        if tid != old:            # the winner's config from scratch; a kept one resumes where it was cut
            trial.target = trial.step + self._spec.stages[i].iters
        self._trained, self._queue = set(), [tid]
        self._phase = "scaling"
        if not self._waiting:
            out += self._start_training()
        return out

    def _shrink(self, survivors: list[str], target: dict[Market, int], itype: str) -> list[Decision]:
        """Release the newest positions beyond ``target`` of type ``itype`` and every position
        of another type, packing the survivors first. Survivors stay where they are only when
        the next stage runs them at the same size, unpacked, on the same type; the others
        are paused (checkpointed) and placed anew by the next stage."""
        out: list[Decision] = []
        carried: set[str] = set()
        i = self._stage
        if survivors and self._types[i + 1] == self._types[i] and self._share(i) == self._share(i + 1) == 1 \
                and not (self._eager is not None and self._spec.stages[i + 1].target):
            m, slots = self._gpus_per_trial[i + 1], self._concurrency_of(i + 1)
            carried = {t for t in survivors[:slots] if len(self._placement.get(t, ())) == m}
        for tid in list(self._placement):
            if tid == self._ahead:
                continue
            on_doomed = any(n not in self._instances or self._instances[n].doomed for n, _ in self._placement[tid])
            if tid not in carried or on_doomed:
                del self._placement[tid]
                out.append(StopTrial(tid, eliminated=False))
        gone = [p for p in self._positions.values() if p.itype != itype and not p.ahead]
        for market, count in target.items():
            mine = sorted((p for p in self._positions.values() if p.market is market and p.itype == itype
                           and not p.ahead), key=lambda p: p.seq)
            gone += mine[count:]
        if not gone:
            return out
        gone_seqs = {p.seq for p in gone}
        nodes = self._good_nodes()
        kept = [nd for nd in nodes if self._instances[nd[0]].position not in gone_seqs]
        leaving = [nd for nd in nodes if self._instances[nd[0]].position in gone_seqs]
        # (an eager target's placement is on instances of its own, which nothing here touches)
        apart = {t: s for t, s in self._placement.items() if t == self._ahead}
        staged = {t: s for t, s in self._placement.items() if t != self._ahead}
        if any(staged.values()):
            try:
                packed = scale_down_plan(_placement(staged), kept + leaving, len(kept))
                self._placement = {**{_name(t): s for t, s in packed.placement.assignments.items()}, **apart}
                out += [ResizeTrial(_name(t), self._placement[_name(t)], self._share(i), self._fused(i))
                        for t in packed.moved]
            except InfeasiblePlacementError:     # the kept instances are not all up: pause who cannot stay
                leaving_names = {n for n, _ in leaving}
                for tid in [t for t, s in self._placement.items() if any(n in leaving_names for n, _ in s)]:
                    del self._placement[tid]
                    out.append(StopTrial(tid, eliminated=False))
        names: list[str] = []
        for pos in sorted(gone, key=lambda p: -p.seq):       # newest first
            names += [pos.current, *pos.old]
            del self._positions[pos.seq]
        out.append(self._release(names))
        return out
