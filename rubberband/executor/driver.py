"""The driver: applies the scheduler's decisions to a real cluster through its ports.

Every decision — which trials run where, SHA/HyperBand promotion, the queue, release at a
SYNC, spot replacement, moving off a noticed instance, re-planning, the safety net and the
budget — is the pure ``rubberband.scheduler.Scheduler``'s. The driver turns what happens on
the cluster into the scheduler's events and applies the decisions it answers:

* ``RequestInstances`` → ``ClusterPort.scale_to`` (a replacement for a noticed instance:
  ``replace``); the driver blocks in ``wait_nodes`` when the scheduler cannot go on without the
  new instances (a stage's scale-up, or a trial waiting for room) — up to the scheduler's next
  ``Wake``, when it feeds the ``Tick`` and waits on for what is wanted then (the safety net
  may have moved it to on-demand) — else it notices them between results. Nodes that come up are mapped to the requested names, oldest first, and
  reported as ``InstanceReady``.
* ``StartTrial`` → the trial's gang (kept when it already runs on those instances; handed over
  from the trial that just freed them, as ``reassign``; else started from its checkpoint),
  then ``train`` one iteration at a time: each iteration ends in a checkpoint, which is what a
  trial resumes from when its instance is lost. A packed ``StartTrial`` (``trials_per_gpu`` k >
  1) gives its trial a worker of ``1/k`` GPU on the GPU serving its slot, beside the other
  trials placed there; a trial that moves to another share or slot restarts from its
  checkpoint, and each stage warms workers of its own share. ``ResizeTrial`` → stop and start from the
  checkpoint; ``StopTrial`` → ``stop``; ``ReleaseInstances`` → ``release_instance`` then
  ``release_to`` (at a SYNC: keep the rest) or ``release`` (noticed or retired instances).
* ``RunSync`` is the barrier: the trials already reported their metrics, so ``SyncDone`` follows
  at once. ``Wake`` asks for a ``Tick`` at a time; ``Replan``, ``SafetySwitch`` are reported.
* ``StageStarted`` / ``StageEnded`` open and close a stage's record (its shape as followed, the
  trials it ran and promoted); ``RetireInstances`` stops asking for spot the safety net left.
* ``ComputeReplan``: the re-plan runs off the loop (``Clock.submit``: a worker thread on the
  wall clock, at once on a virtual one); the loop keeps watching instances and trials and
  reports ``ReplanReady`` when it is done.

The scheduler's decisions and its final ``report()`` are all the driver knows of it; the
driver keeps only runtime handles (gangs, futures, node names, checkpoints). Time is the
injected ``Clock``'s (``ports.WallClock`` by default): this module reads no wall clock.

Events in: a finished chunk of iterations (``TrainFinished`` after the TRAIN's last one; a
``TrialCheckpoint`` after any other when the trial is on a noticed instance), a failed chunk
(``InstanceLost`` with each interrupted trial's checkpointed iterations when one of its
instances is gone, else ``TrialFailed``), spot notices from the port (``ReclaimNotice``), and
instances that vanished. Times are seconds since the run started.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rubberband.errors import ProviderError, SpecError
from rubberband.executor.ports import (
    ChunkInterrupted,
    Clock,
    ClusterPort,
    Node,
    Notice,
    TrialRunnerPort,
    WallClock,
)
from rubberband.executor.search_space import Observation, Search
from rubberband.function_api import TrialFunctionError
from rubberband.nodes import NodeType
from rubberband.plan.plan import Plan
from rubberband.profiles.cloud import Market
from rubberband.scheduler import (
    MAX_TRIAL_RESTARTS,  # noqa: F401 - re-exported for callers
    ComputeReplan,
    Event,
    InstanceLost,
    InstanceReady,
    JobDone,
    ReclaimNotice,
    ReleaseInstances,
    Replan,
    Replanner,
    ReplanReady,
    RequestInstances,
    ResizeTrial,
    RetireInstances,
    RunSync,
    SafetyNet,
    SafetySwitch,
    Scheduler,
    SchedulerReport,
    StageEnded,
    StageStarted,
    StartTrial,
    StopTrial,
    SyncDone,
    Tick,
    TrainFinished,
    TrialCheckpoint,
    TrialFailed,
    Wake,
    is_target_trial,
    surrogate_winner,
)

log = logging.getLogger("rubberband.executor")

# The key a target trial's config carries to its workers only (never in its recorded config): the
# trainer of a surrogate job (``rubberband.surrogate.SurrogateJob``) builds it at full width.
TARGET_KEY = "__rubberband_target__"   # = rubberband.surrogate.TARGET_KEY (its SurrogateJob reads it)


@dataclass
class TrialState:
    """One trial as the driver tracks it."""

    id: str
    config: dict[str, Any]
    bracket: int
    checkpoint: bytes | None = None
    step: int = 0                  # the trainer's step at its last checkpoint
    metric: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    gang: Any = None
    instances: tuple[str, ...] = ()
    slots: tuple = ()              # the scheduler's slots of its gang: (name, GPU index) each
    share: int = 1                 # trials per GPU its gang was started for (packed or fused: > 1)
    fused: bool = False            # its gang is a member of a fused group (DESIGN §4.5)
    history: list[dict[str, Any]] = field(default_factory=list)
    eliminated_after: int | None = None
    restarts: int = 0              # times its gang was lost (a dead gang or a lost instance)
    ranks_in_sync: bool = True     # every multi-worker gang's ranks held identical parameters
    iters_done: int = 0            # iterations checkpointed (the scheduler's step)
    redone: int = 0                # iterations trained again on resuming (a function's older checkpoint)
    failures: int = 0              # times its own code failed (raised, or reported a NaN metric)
    failed: str | None = None      # why it was given up on (after max_failures retries), else None
    target: bool = False           # a surrogate job's full-width trial of the winner's config (DESIGN §4.6)


@dataclass
class StageRecord:
    """What a stage really did."""

    index: int
    start_s: float
    end_s: float
    instances: int
    trials: list[str]
    promoted: list[str]
    spot_instances: int = 0


@dataclass
class DriverOutcome:
    trials: dict[str, TrialState]
    stages: list[StageRecord]
    train_runs: list[dict[str, Any]]
    started_at: float
    ended_at: float
    best: str | None = None                     # the winning trial (the scheduler's pick)
    stopped: str | None = None                  # why the job stopped early (the budget), else None
    replans: list[Replan] = field(default_factory=list)
    switches: list[SafetySwitch] = field(default_factory=list)
    budget_usd: float | None = None
    budget_left_usd: float | None = None
    report: SchedulerReport | None = None       # the scheduler's own, at the end
    timeline: list[dict[str, Any]] = field(default_factory=list)   # the driver's events: {t, event, ...}


class Driver:
    """Runs one plan on a cluster through its ports (see the module docstring).

    ``replan_with``: the profile the plan was made from — re-plan at every SYNC on it,
    corrected by the TRAINs seen (``None``: follow the plan). ``safety_net``: the same profile
    for the spot safety net's estimate (``None``: none). ``budget_usd``: a hard budget.
    ``settle_s``: how long a failed gang whose instances look alive waits before it is taken
    for a gang failure rather than a lost instance. ``wait_for_resumes``: see ``_must_wait``.
    """

    def __init__(self, plan: Plan, cluster: ClusterPort, runner: TrialRunnerPort, search_space: dict[str, Any] | Search,
                 metric: str, mode: str = "min", seed: int = 0, clock: Clock | None = None,
                 checkpoint_dir: str | Path | None = None, node_timeout_s: float = 300.0,
                 wait_timeout_s: float = 600.0, on_event: Callable[[str, dict[str, Any]], None] | None = None,
                 keep_warm: bool = False, poll_s: float = 1.0, replan_with: Any = None, safety_net: Any = None,
                 budget_usd: float | None = None, settle_s: float = 0.0, max_instances: Any = None,
                 wait_for_resumes: bool = True, max_failures: int = 0, target_model: Any = None):
        if plan.spec.target_stage is not None and replan_with is not None and target_model is None:
            raise SpecError("target_model: the plan ends in a target stage; re-planning it needs the target's profile "
                            "beside replan_with (the surrogate's)")
        replanner = Replanner(plan, replan_with, seed=plan.seed, max_instances=max_instances,
                              target_model=target_model) if replan_with is not None else None
        net = SafetyNet(safety_net, plan.cloud, plan.deadline_s, target_model=target_model) \
            if safety_net is not None and math.isfinite(plan.deadline_s) else None
        self.sched = Scheduler(plan, mode, replanner, keep_warm=keep_warm, safety_net=net, budget_usd=budget_usd)
        self.plan, self.cluster, self.runner = plan, cluster, runner
        # A plain space is searched at random; a Search names its algorithm (model-based ones
        # are fed the results so far when a bracket samples its trials).
        self.search = Search.of(search_space)
        self.metric, self.mode, self.seed = metric, mode, seed
        self.clock = clock or WallClock()
        self.max_instances = max_instances
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.node_timeout_s, self.wait_timeout_s = node_timeout_s, wait_timeout_s
        self.on_event = on_event or (lambda kind, data: None)
        self.keep_warm = keep_warm      # leave the runner's warm workers up (back-to-back runs)
        self.poll_s = poll_s            # how often a waiting driver looks for notices and lost instances
        # How long a gang failure on instances that still look alive waits for the cluster to
        # notice they died (Ray marks a node dead only after missed heartbeats).
        self.settle_s = settle_s
        # A trial resuming on an instance not up yet: block until it is (a real cluster: its
        # workers warm first), or wait among the other trials' chunks (a virtual clock, where
        # blocking in ``wait_nodes`` would stop everyone's time until the instance is up).
        self.wait_for_resumes = wait_for_resumes
        self.trials: dict[str, TrialState] = {}
        self.order: dict[str, int] = {}                  # trial -> when the driver first saw it
        self.stages: list[StageRecord] = []
        self.train_runs: list[dict[str, Any]] = []
        self.real: dict[str, str] = {}                   # scheduler name -> instance
        self.name: dict[str, str] = {}                   # instance -> scheduler name
        self.types: dict[str, NodeType] = {}             # instance -> node type
        self.unready: list[tuple[str, NodeType]] = []    # requested names not up yet, in order
        self.doomed: set[str] = set()                    # instances under a notice
        self.gone: set[str] = set()                      # instances released or lost
        self.retired: set[str] = set()                   # spot the safety net moved off
        self.pending: dict[Any, str] = {}                # future -> trial
        self.left: dict[str, int] = {}                   # trial -> iterations left of its TRAIN
        self.began: dict[str, tuple[int, float]] = {}    # trial -> (stage, start) of its TRAIN
        self.iter_s: dict[str, list[float]] = {}
        self.redone: dict[str, int] = {}                 # trial -> iterations redone in its current TRAIN
        self._warned_redo = False
        self.max_failures = max_failures                 # retries of a trial whose own code fails
        self.gpu_ids: dict[str, list] = {}               # trial -> the GPU ids its gang's ranks last reported
        self.running: set[str] = set()
        self.resuming: dict[str, tuple[str, ...]] = {}   # trials moving mid-TRAIN -> the instances they left
        self.stage = -1
        self.stage_start = 0.0
        self.stage_trials: list[str] = []
        self.share = 1                                   # trials per GPU of the stage running (packed: > 1)
        self.fused = False                               # whether they train as fused groups
        self.scaling = False                             # the stage waits for its scale-up (no trial started yet)
        self.claims: dict[str, tuple] = {}               # trial -> the slots the scheduler last gave it
        self.holder: dict[Any, str] = {}                 # slot -> the trial that claims it
        self.ganged: set[str] = set()                    # trials that hold a gang
        self.budget_left: float | None = None            # the scheduler's, at the last stage boundary
        self._sync_stage = -1
        self.chunk: dict[Any, int] = {}                  # pending future -> its iterations
        self.replanning: dict[Any, int] = {}             # re-plan future -> its token (off the loop)
        self.wake_at: float | None = None
        self.done: JobDone | None = None
        self.unheard: list[Notice] = []                  # notices of instances not named yet
        self.early: set[str] = set()                     # instances named at a notice, not up yet
        self.started = 0.0
        self.timeline: list[dict[str, Any]] = []         # every event the driver emitted, seconds since the start
        self._configs: dict[int, list[dict[str, Any]]] = {}
        self._wait_stage = False
        # Instances requested for a later stage (an eager target's, DESIGN §4.6): the stage running
        # does not wait for them (``_ahead``), and the ledger bills them to that stage ("owned" events).
        self.owners: dict[str, int] = {}                 # scheduler name -> the stage it was requested for

    # --- small helpers -------------------------------------------------------------------------
    def _emit(self, kind: str, **data: Any) -> None:
        self.timeline.append({"t": round(self._now(), 4), "event": kind, **data})
        self.on_event(kind, data)

    def _now(self) -> float:
        return self.clock.now() - self.started

    def _node_type(self, market: Market, instance_type: str) -> NodeType:
        return NodeType(instance_type, market.value)

    def _want(self, waited: bool = False) -> dict[NodeType, int]:
        """The request: every instance held and usable, and those not up yet, by node type
        (``waited``: those the stage running waits for, without a later stage's)."""
        want: dict[NodeType, int] = {}
        for inst in self.name:
            if inst not in self.gone and inst not in self.doomed and inst not in self.retired:
                want[self.types[inst]] = want.get(self.types[inst], 0) + 1
        for name, t in self.unready:
            if not (waited and self._ahead(name)):
                want[t] = want.get(t, 0) + 1
        return want

    def _ahead(self, name: str) -> bool:
        """Whether requested instance ``name`` is a later stage's (an eager target's, DESIGN §4.6)."""
        return self.owners.get(name, -1) > self.stage

    def _unready_now(self) -> bool:
        """Whether instances the stage running waits for are not up yet."""
        return any(not self._ahead(name) for name, _ in self.unready)

    def _retire(self, names: Sequence[str]) -> None:
        """Spot the safety net retired is no longer asked for, nor waited for: its trial finishes
        its TRAIN there, but if it is reclaimed first no spot instance replaces it (the port
        keeps it in the request only while it is up, as a noticed one)."""
        retired = [self.real[n] for n in names if n in self.real]
        retired = [inst for inst in retired if inst not in self.gone | self.doomed | self.retired]
        self.retired.update(retired)
        if retired:
            self.cluster.scale_to(self._want(), stage=self.stage)
        for inst in retired:
            self.cluster.replace(inst)

    def _trial(self, tid: str) -> TrialState:
        """The driver's record of a trial; its bracket and index are in its name (the scheduler
        names them ``b{k}-t{j:03d}``, or ``t{j:03d}`` for a single bracket)."""
        if tid not in self.trials and is_target_trial(tid):
            # The surrogate winner's config at full width, from scratch: no checkpoint (DESIGN §4.6).
            winner = self.trials[surrogate_winner(tid)]
            self.order[tid] = len(self.order)
            self.trials[tid] = TrialState(tid, dict(winner.config), winner.bracket, target=True)
        if tid not in self.trials:
            bracket = int(tid[1:tid.index("-")]) if tid.startswith("b") else 0
            if bracket not in self._configs:
                n = self.plan.spec.stages[self.plan.spec.bracket_starts[bracket]].num_trials
                self._configs[bracket] = self.search.configs(n, seed=self.seed + 1000 * bracket,
                                                             observations=self._observations(), mode=self.mode)
            self.order[tid] = len(self.order)
            self.trials[tid] = TrialState(tid, self._configs[bracket][int(tid.rsplit("t", 1)[1])], bracket)
        return self.trials[tid]

    def _observations(self) -> list[Observation]:
        """Every rung each trial finished so far: its config, the iterations it had trained, its metric."""
        out = []
        for trial in self.trials.values():
            iters = 0
            for h in trial.history:
                iters += h["iters"]
                if "failed" not in h and self.metric in h:
                    out.append(Observation(trial.config, iters, float(h[self.metric])))
        return out

    def _save_checkpoint(self, trial: TrialState, blob: bytes | None) -> None:
        if blob is None:
            return
        trial.checkpoint = blob
        if self.checkpoint_dir is not None:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.checkpoint_dir / f"{trial.id}.pt.tmp"
            tmp.write_bytes(blob)
            tmp.replace(self.checkpoint_dir / f"{trial.id}.pt")

    def _stop_gang(self, trial: TrialState) -> None:
        self.running.discard(trial.id)
        for future in [f for f, t in self.pending.items() if t == trial.id]:
            del self.pending[future]
            self.chunk.pop(future, None)
        if trial.gang is not None:
            try:
                self.runner.stop(trial.gang)
            finally:
                trial.gang, trial.instances, trial.slots = None, (), ()
                self.ganged.discard(trial.id)

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> DriverOutcome:
        self.started = self.clock.now()
        self._apply(self.sched.start(0.0))
        last_report = self.clock.now()
        while self.done is None:
            if self._replans_done():
                continue
            if self._must_wait():
                self._wait_for_nodes()
                continue
            if not self.pending and self.replanning:     # a SYNC waits for its re-plan: keep watching
                wait_futures(list(self.replanning), timeout=self.poll_s, return_when=FIRST_COMPLETED)
                self._watch()
                continue
            if not self.pending and self.early:        # the scheduler waits for a noticed instance to come up
                waiting = len(self.early)
                self._watch()
                if len(self.early) == waiting and not self.pending:
                    self.runner.wait([], self.poll_s)
                continue
            if not self.pending:
                raise ProviderError(f"stage {self.stage}: the scheduler waits for an event that never comes")
            timeout = min(self.poll_s, self.wait_timeout_s)
            if self.wake_at is not None:
                timeout = max(min(timeout, self.wake_at - self._now()), 0.0)
            done, _ = self.runner.wait(list(self.pending), timeout)
            self._watch()
            if self.wake_at is not None and self._now() >= self.wake_at - 1e-6 and self.done is None:
                self.wake_at = None
                self._feed(Tick())
            if not done:
                if self.clock.now() - last_report > self.wait_timeout_s:
                    raise ProviderError(f"stage {self.stage}: no trial reported for {self.wait_timeout_s:.0f}s")
                continue
            last_report = self.clock.now()
            for future in done:
                if future in self.pending and self.done is None:
                    self._result(future)
        for trial in self.trials.values():
            self._stop_gang(trial)
        if not self.keep_warm:
            self.runner.shutdown()
        report = self.sched.report()
        return DriverOutcome(self.trials, self.stages, self.train_runs, self.started, self.clock.now(),
                             best=self.done.best, stopped=self.done.stopped, replans=list(report.replans),
                             switches=list(report.switches), budget_usd=report.budget_usd,
                             budget_left_usd=report.budget_left_usd, report=report, timeline=list(self.timeline))

    def _feed(self, event: Event) -> None:
        self._apply(self.sched.on(event, self._now()))

    def _replans_done(self) -> bool:
        """Report each re-plan done off the loop (``ReplanReady``); whether there was one."""
        done = [f for f in self.replanning if f.done()]
        for future in done:
            token = self.replanning.pop(future)
            if self.done is None:
                self._feed(ReplanReady(token, future.result()))
        return bool(done)

    def _must_wait(self) -> bool:
        """Whether nothing can go on until the instances requested are up."""
        return self._unready_now() and (not self.pending or self.scaling or
                                        (self.wait_for_resumes and bool(self.resuming)))

    def _result(self, future: Any) -> None:
        tid = self.pending.pop(future)
        n = self.chunk.pop(future, 1)
        trial = self.trials[tid]
        try:
            res = self.runner.result(future)
        except Exception as exc:  # the gang died: its instance went away, or the gang itself
            cause = getattr(exc, "cause", exc)             # Ray wraps the worker's exception
            if isinstance(cause, TrialFunctionError):      # the user's function raised
                self._user_failed(trial, " ".join(str(cause).split())[:300], cause.traceback_text or str(exc))
                return
            self._interrupted(trial, exc)
            self._lost_gang(trial, exc)
            return
        self._done(trial, res, n)
        value = res.metrics.get(self.metric)
        if isinstance(value, float) and math.isnan(value):
            self._user_failed(trial, f"trial {tid} reported {self.metric} = NaN", f"{self.metric} = NaN in {res.metrics}")
            return
        if res.gpu_ids:
            self.gpu_ids[tid] = res.gpu_ids
        if res.digests and len(res.digests) > 1:
            first = res.digests[0]
            trial.ranks_in_sync = trial.ranks_in_sync and all(
                d is not None and all(abs(a - b) <= 1e-9 * max(1.0, abs(a)) for a, b in zip(d, first))
                for d in res.digests)
        if self.left[tid] > 0:
            if self.doomed.intersection(trial.instances):
                if self.unready:      # the replacement it may move to: wait for it
                    self._wait_for_nodes()
                gang = trial.gang
                self.resuming[tid] = trial.instances
                self._feed(TrialCheckpoint(tid, trial.iters_done))
                if trial.gang is not gang or tid not in self.running:
                    return            # it moved (a new TRAIN started) or the job stopped
                del self.resuming[tid]
            self._train(trial)
            return
        if self.metric not in res.metrics:
            raise SpecError(f"metric: the trainer reports {sorted(res.metrics)}, not {self.metric!r}; set `metric:` to one of them")
        trial.metrics = dict(res.metrics)
        trial.metric = float(res.metrics[self.metric])
        self.running.discard(tid)
        stage, start = self.began.pop(tid)
        end = self._now()
        gpus = len(trial.instances)
        where = {"instances": list(trial.instances), "trials_per_gpu": trial.share, **({"fused": True} if trial.fused else {}),
                 **({"gpu_ids": self.gpu_ids.pop(tid)} if tid in self.gpu_ids else {})}
        redone = self.redone.pop(tid, 0)
        trial.history.append({"stage": stage, "iters": self.plan.spec.stages[stage].iters, "gpus": gpus,
                              "step": trial.step, **where, "restarts": trial.restarts,
                              **({"redone": redone} if redone else {}),
                              "start_s": start, "end_s": end, **trial.metrics})
        self.train_runs.append({"trial": tid, "stage": stage, "gpus": gpus, "start_s": start, "end_s": end,
                                "iters": self.plan.spec.stages[stage].iters, "iter_s": self.iter_s.pop(tid, []),
                                **where, **({"redone": redone} if redone else {})})
        self._emit("trial", trial=tid, stage=stage, metric=trial.metric, step=trial.step)
        self._feed(TrainFinished(tid, trial.iters_done, trial.metric))

    def _done(self, trial: TrialState, res: Any, n: int) -> None:
        """``n`` more iterations of ``trial`` trained and checkpointed (``res``)."""
        self._save_checkpoint(trial, res.checkpoint)
        trial.step = res.step
        trial.iters_done += n
        self.left[trial.id] -= n
        self.iter_s.setdefault(trial.id, []).extend(res.iter_times)
        redone = getattr(res, "redone", 0)
        if redone:
            trial.redone += redone
            self.redone[trial.id] = self.redone.get(trial.id, 0) + redone
            if not self._warned_redo:     # once per run
                self._warned_redo = True
                log.warning("trial %s trained %d iteration(s) again on resuming: its latest checkpoint was older "
                            "than its last report (a function that never passes `checkpoint=` to report() "
                            "restarts from scratch at every stage)", trial.id, redone)

    def _user_failed(self, trial: TrialState, why: str, detail: str) -> None:
        """The trial's own code failed (Ray Tune's trial error): its traceback goes to the run's
        ``failures/<trial>.txt``; it is retried from its last checkpoint up to ``max_failures``
        times (the scheduler restarts it, as a failed gang), then given up on: its TRAIN ends
        with a NaN metric, which the scheduler ranks last, and the job goes on."""
        trial.failures += 1
        if self.checkpoint_dir is not None:
            out = self.checkpoint_dir.parent / "failures"
            out.mkdir(parents=True, exist_ok=True)
            with open(out / f"{trial.id}.txt", "a") as fh:
                fh.write(f"--- failure {trial.failures} at stage {self.stage}, step {trial.step}\n{detail}\n")
        instances = trial.instances
        self._unclaim(trial.id)
        self._stop_gang(trial)
        if trial.failures <= self.max_failures:
            log.warning("%s; retrying it from its checkpoint at step %s (%d of %d)", why, trial.step, trial.failures,
                        self.max_failures)
            self._emit("recover", trial=trial.id, error=why, step=trial.step)
            self.resuming[trial.id] = instances
            trial.restarts += 1
            self._feed(TrialFailed(trial.id, trial.iters_done))
            return
        trial.failed = why
        log.warning("%s; marked failed (ranked last), the job goes on", why)
        stage, start = self.began.pop(trial.id, (self.stage, self._now()))
        trial.metric, self.left[trial.id] = math.nan, 0
        trial.history.append({"stage": stage, "iters": self.plan.spec.stages[stage].iters, "step": trial.step,
                              "failed": why, "start_s": start, "end_s": self._now()})
        self.iter_s.pop(trial.id, None)
        self.redone.pop(trial.id, None)
        self._emit("failed", trial=trial.id, stage=stage, reason=why)
        self._feed(TrainFinished(trial.id, trial.iters_done, math.nan))

    def _interrupted(self, trial: TrialState, exc: Exception) -> None:
        """Keep what a chunk cut short by a lost instance completed (``ChunkInterrupted.done``)."""
        if isinstance(exc, ChunkInterrupted) and exc.done is not None:
            self._done(trial, exc.done, len(exc.done.iter_times))

    def _absorb(self, trial: TrialState) -> None:
        """A trial that shares a lost instance: the iterations its chunk cut short completed
        (a runner that trains several per chunk says so as it fails), before its gang stops."""
        for future in [f for f, t in self.pending.items() if t == trial.id]:
            done, _ = self.runner.wait([future], 0.0)
            if not done:
                continue
            try:
                self.runner.result(future)
            except ChunkInterrupted as exc:
                self._interrupted(trial, exc)
            except Exception:          # failed with nothing kept: its checkpoint is its last chunk's
                pass

    def _lost_gang(self, trial: TrialState, exc: Exception) -> None:
        """A gang failed: the instances it lost go to the scheduler (``InstanceLost``), or, when
        they all live, the failure itself (``TrialFailed``)."""
        reason = " ".join(str(exc).split())      # Ray's errors span lines; a log line does not
        if self.gone.intersection(trial.instances):      # its instance's loss was handled already
            self._stop_gang(trial)
            return
        instances = trial.instances
        # Stopping a dead gang waits for its workers to answer, which gives the cluster time
        # to see a node that died with them; only then is the node's fate read.
        self._stop_gang(trial)
        lost, alive = self._vanished([i for i in instances if i in self.name])
        victims = [trial] + [t for t in self.trials.values()
                             if t is not trial and t.gang is not None and set(t.instances) & set(lost)]
        for t in victims[1:]:
            self._absorb(t)
        progress = {inst: {t.id: t.iters_done for t in victims if inst in (instances if t is trial else t.instances)}
                    for inst in lost}
        for t in victims:
            self._unclaim(t.id)                  # the scheduler takes their slots back (lost or failed)
            self.resuming[t.id] = instances if t is trial else t.instances
            t.restarts += 1
            log.warning("trial %s lost its gang (%s); resuming from its checkpoint at step %s", t.id, reason[:300], t.step)
            self._emit("recover", trial=t.id, error=str(exc), step=t.step)
            self._stop_gang(t)
        if not lost:
            self._feed(TrialFailed(trial.id, trial.iters_done))
            return
        self.runner.forget_dead(sorted(alive))
        for inst in lost:
            self._instance_lost(inst, progress[inst])

    def _instance_lost(self, inst: str, progress: dict[str, int]) -> None:
        self.gone.add(inst)
        self.early.discard(inst)
        self.doomed.discard(inst)
        lost = self.name[inst]
        for tid in {t for (n, _), t in self.holder.items() if n == lost}:
            self._unclaim(tid)
        self._feed(InstanceLost(self.name[inst], progress))

    def _watch(self) -> None:
        """Spot notices, instances that vanished, and requested ones that came up meanwhile."""
        self._hear()
        if self.early and self.done is None:
            self._early_ready()
        if self.done is not None:
            return
        nodes = self.cluster.nodes()
        alive = {n.name for n in nodes} | set(self.cluster.doomed())
        missing = [i for i in self.name if i not in self.gone and i not in alive]
        if missing:
            busy = {i for t in self.ganged for i in self.trials[t].instances}
            for inst in [i for i in missing if i not in busy]:
                self._instance_lost(inst, {})       # its trials' futures will fail: handled there
        if self.unready and self.done is None:
            self._map_ready(nodes)

    def _hear(self) -> None:
        """Spot notices: each noticed instance the driver knows goes to the scheduler. A notice of
        one not named yet (it came up, or was noticed, before the driver mapped it) waits until
        it is named (``_map_ready``), or is forgotten at its reclaim."""
        heard, self.unheard = self.unheard + self.cluster.notices(), []
        for notice in heard:
            inst = notice.instance
            if inst in self.doomed or inst in self.gone:
                continue
            if inst not in self.name and not self._name_early(notice):
                if notice.reclaim_at > self.clock.now():
                    self.unheard.append(notice)
                continue
            self.doomed.add(inst)
            log.info("instance %s will be reclaimed in %.0fs", inst, notice.reclaim_at - self.clock.now())
            self._emit("notice", instance=inst, reclaim_at=notice.reclaim_at, at=self.clock.now())
            self._feed(ReclaimNotice(self.name[inst]))

    def _name_early(self, notice: Notice) -> bool:
        """Name a noticed instance still initialising after a requested one of its type (when the
        cluster says its type); it is reported ready from the cluster's ``ready`` event."""
        k = next((k for k, (_, t) in enumerate(self.unready) if t == notice.node_type), None)
        if notice.node_type is None or k is None:
            return False
        name, t = self.unready.pop(k)
        self.real[name], self.name[notice.instance], self.types[notice.instance] = notice.instance, name, t
        self.early.add(notice.instance)
        return True

    def _early_ready(self) -> None:
        """Instances named early (``_name_early``) that came up: the scheduler hears they are ready."""
        events = self.cluster.events()
        up = {e["instance"]: e for e in events if e.get("event") == "ready" and e.get("instance") in self.early}
        for inst, e in up.items():
            self.early.discard(inst)
            if inst in self.gone or self.done is not None:
                continue
            launched = next((x["t"] for x in events if x.get("instance") == inst and x.get("event") == "running"), e["t"])
            self._feed(InstanceReady(self.name[inst], e.get("gpus", 0), launched - self.started))

    def _vanished(self, instances: Sequence[str]) -> tuple[list[str], set[str]]:
        """Which of ``instances`` the cluster no longer has, waiting up to ``settle_s`` for it to
        notice a dead node; and the instances alive."""
        settle = self.clock.now() + self.settle_s
        while True:
            alive = {n.name for n in self.cluster.nodes()} | set(self.cluster.doomed())
            lost = [i for i in dict.fromkeys(instances) if i not in alive]
            if lost or self.clock.now() >= settle:
                return lost, alive
            self.clock.sleep(min(self.poll_s, 1.0))

    def _wait_for_nodes(self) -> None:
        """Wait for the instances requested, waking the scheduler at its ``Wake`` times meanwhile:
        a ``Tick`` may move the request to on-demand (the safety net: spot capacity that never
        comes) or stop the run (the budget), and the wait goes on for what is wanted then. The
        wait fails after ``node_timeout_s`` without the request met, counted from when the
        request last changed (losses while warming up included)."""
        deadline = self.clock.now() + self.node_timeout_s
        while True:
            want = self._want(waited=True)
            until = self.started + self.wake_at if self.wake_at is not None else None
            # A later stage's instances (an eager target's) are asked for too, but not waited for.
            extra = {t: n - want.get(t, 0) for t, n in self._want().items() if n > want.get(t, 0)}
            nodes = self.cluster.wait_nodes(want, max(deadline - self.clock.now(), 0.0), until=until,
                                            **({"extra": extra} if extra else {}))
            self.doomed.intersection_update(self.cluster.doomed())
            if nodes is None:           # the wake came first, or news (a notice) the driver must hear now
                if self.wake_at is not None and self._now() >= self.wake_at - 1e-6:
                    self.wake_at = None
                    self._feed(Tick())
                self._watch()
                if self.done is not None or not self._must_wait():       # the scheduler goes on meanwhile
                    return
                if self._want(waited=True) != want:
                    deadline = self.clock.now() + self.node_timeout_s
                continue
            try:
                # Part of initialising a new instance: warm workers on each GPU, as many as the stage packs.
                # (a fused stage: one worker per GPU, each holding the whole of it, for a group)
                warm_s = self.runner.warm(nodes, 1 if self.fused else self.share)
                break
            except Exception:
                # A node lost while its workers warmed up (a reclaim with no notice): not yet
                # anyone's, so wait again (the standing request replaces it). Else it is real.
                lost, alive = self._vanished([n.name for n in nodes])
                if not lost or self.clock.now() >= deadline:
                    raise
                log.warning("instance(s) %s lost while warming up; waiting for replacements", ", ".join(lost))
                self.runner.forget_dead(sorted(alive))
        self._emit("nodes", stage=self.stage, instances=[n.name for n in nodes], warm_s=warm_s, at=self.clock.now())
        self._map_ready(nodes)

    def _map_ready(self, nodes: Sequence[Node]) -> None:
        """Name the nodes not seen before after the requested instances of their type, in order;
        the scheduler hears of a notice among them before it hears they are ready (it places
        nothing on a noticed instance)."""
        events, ready = None, []
        for node in nodes:
            if node.name in self.name or node.name in self.gone:
                continue
            # The stage running takes a node before a later stage's request does (an eager target's).
            k = next((k for k, (n, t) in enumerate(self.unready) if t == node.node_type and not self._ahead(n)),
                     next((k for k, (_, t) in enumerate(self.unready) if t == node.node_type), None))
            if k is None:
                continue
            name, t = self.unready.pop(k)
            self.real[name], self.name[node.name], self.types[node.name] = node.name, name, t
            if name in self.owners:
                self._emit("owned", instance=node.name, stage=self.owners[name])
            if events is None:
                events = self.cluster.events()
            launched = next((e["t"] for e in events if e.get("instance") == node.name and e.get("event") == "running"),
                            self.clock.now())
            ready.append(InstanceReady(name, node.gpus, launched - self.started))
        if ready:
            self._hear()
        for event in ready:
            if self.done is None:
                self._feed(event)

    # --- applying decisions --------------------------------------------------------------------
    def _apply(self, decisions: list) -> None:
        for d in decisions:
            if isinstance(d, StageStarted):
                self._enter_stage(d)
            elif isinstance(d, StageEnded):
                self._record_stage(d)
            elif isinstance(d, RequestInstances):
                self._request(d)
            elif isinstance(d, StartTrial):
                if d.stage == self.stage:        # (an eager target's, ahead of its stage, ends no scale-up)
                    self.scaling = False
                self._claim(d.trial, d.slots)
                self._flush_stage_wait()
                self._start(d)
            elif isinstance(d, ResizeTrial):
                trial = self._trial(d.trial)
                self._stop_gang(trial)
                self._claim(d.trial, d.slots)
                self._gang(trial, d.slots, d.trials_per_gpu, d.fused)
            elif isinstance(d, StopTrial):
                trial = self._trial(d.trial)
                self._unclaim(d.trial)
                self._stop_gang(trial)
                if d.eliminated:
                    trial.eliminated_after = self.stage
            elif isinstance(d, ReleaseInstances):
                self._release(d)
            elif isinstance(d, RunSync):
                self._sync(d.stage)
            elif isinstance(d, Wake):
                self.wake_at = d.at_s
            elif isinstance(d, Replan):
                log.info("%s", d.line())
                self._emit("replan", line=d.line())
            elif isinstance(d, SafetySwitch):
                log.info("%s", d.line())
                self._emit("switch", line=d.line())
            elif isinstance(d, RetireInstances):
                self._retire(d.names)
            elif isinstance(d, ComputeReplan):
                self.replanning[self.clock.submit(d.compute)] = d.token
            elif isinstance(d, JobDone):
                self.done = d
                if d.stopped:
                    log.warning("%s", d.stopped)
                    self._emit("stopped", reason=d.stopped, best=d.best)
            else:
                raise SpecError(f"driver: unknown decision {d!r}")
        self._flush_stage_wait()

    def _claim(self, tid: str, slots: tuple) -> None:
        """The scheduler gave ``slots`` to ``tid``: whoever held them before no longer does."""
        for other in {self.holder[s] for s in slots if self.holder.get(s, tid) != tid}:
            self._unclaim(other)
        self._unclaim(tid)
        self.claims[tid] = tuple(slots)
        for s in slots:
            self.holder[s] = tid

    def _unclaim(self, tid: str) -> None:
        for s in self.claims.pop(tid, ()):
            if self.holder.get(s) == tid:
                del self.holder[s]

    def _enter_stage(self, d: StageStarted) -> None:
        self.stage, self.stage_start = d.stage, self._now()
        self.stage_trials, self.share, self.scaling = list(d.trials), d.trials_per_gpu, True
        self.fused = d.fused
        self.budget_left = d.budget_left_usd
        self._emit("stage", index=d.stage, trials=len(d.trials), iters=d.iters, gpus_per_trial=d.gpus_per_trial,
                   trials_per_gpu=d.trials_per_gpu, instances=d.instances, spot=d.spot_instances,
                   **({"fused": True} if d.fused else {}), **self._budget())
        self._wait_stage = True

    def _budget(self) -> dict[str, float]:
        return {} if self.budget_left is None else {"budget_left_usd": self.budget_left}

    def _flush_stage_wait(self) -> None:
        """A stage asks for its instances and waits for them before its first TRAIN (unless the
        scheduler started it at once: what it waits for then is a replacement, which comes
        while its trials train)."""
        if self._wait_stage and self.done is None:
            self._wait_stage = False
            self.cluster.scale_to(self._want(), stage=self.stage)
            if self.scaling or not self.unready:   # (a stage that started at once waits for a replacement among its chunks)
                self._wait_for_nodes()

    def _request(self, d: RequestInstances) -> None:
        if d.stage > self.stage:          # an eager target's, ahead of its stage (DESIGN §4.6)
            self.owners.update(dict.fromkeys(d.names, d.stage))
        t = self._node_type(d.market, d.instance_type)
        old = self.real.get(d.replaces) if d.replaces else None
        self.unready += [(name, t) for name in d.names]
        if old is not None and old in self.doomed and old not in self.gone:
            self.cluster.replace(old)        # one more of its type now, while it still runs
            self._emit("replace", instance=old)
        elif not self._wait_stage:           # else the stage's scale-up asks for it before it waits
            # (a replacement for a lost instance: the standing request asks for it already; the
            # same request again tells a virtual cluster when)
            self.cluster.scale_to(self._want(), stage=self.stage)

    def _start(self, d: StartTrial) -> None:
        trial = self._trial(d.trial)
        new_train = self.began.get(d.trial, (None,))[0] != d.stage
        self._gang(trial, d.slots, d.trials_per_gpu, d.fused, new_train=new_train)
        self.left[d.trial] = d.iters
        if new_train:
            self.began[d.trial] = (d.stage, self._now())
            self._emit("start", trial=d.trial, stage=d.stage)
        self.running.add(d.trial)
        self.runner.begin_train(trial.gang, d.stage)
        self._train(trial)

    def _train(self, trial: TrialState) -> None:
        """Train ``trial``'s next chunk: as many of its iterations left as the runner takes at once."""
        n = max(1, min(self.runner.chunk_iters(self.left[trial.id]), self.left[trial.id]))
        future = self.runner.train(trial.gang, n)
        self.pending[future], self.chunk[future] = trial.id, n

    def _gang(self, trial: TrialState, slots: tuple, share: int = 1, fused: bool = False,
              new_train: bool = False) -> None:
        """Give ``trial`` a gang on ``slots`` at ``share`` trials per GPU: its own if it runs there,
        the gang of an idle trial on exactly those instances (handed over), else a new one from
        its checkpoint. A packed gang sits on its slot's GPU: it is kept or handed over only
        on that very slot, and a gang of another share is never reused (its worker holds
        another fraction of a GPU). A member of a fused group (``fused``) is kept on its slot
        but never handed over: the trial joins the group on its slot's GPU instead.

        A function trainable's own gang kept for a new stage's TRAIN (``new_train``) is handed
        back to it from its checkpoint (``reassign``): the function stops at every stage boundary
        and resumes from its latest reported checkpoint, redoing the iterations since, on any
        gang — exactly the ``r_i`` the model counts (DESIGN §4, ``restarts_each_stage``)."""
        wanted = tuple(self.real[n] for n, _ in slots)

        def fits(other: TrialState) -> bool:
            return (other.instances == wanted and other.share == share and other.fused == fused
                    and (share == 1 or other.slots == tuple(slots)))

        if trial.gang is not None and fits(trial):
            if new_train and not fused and self.runner.restarts_each_stage:
                trial.gang = self.runner.reassign(trial.gang, trial.id, self._run_config(trial), trial.checkpoint)
            return
        if trial.gang is not None:
            self._stop_gang(trial)
        taken = {s for s in slots}
        donor = None
        for other in [self.trials[t] for t in sorted(self.ganged, key=self.order.__getitem__)]:
            if other is trial or other.gang is None or other.id in self.running:
                continue
            mine = set(self.claims.get(other.id, ()))
            if fits(other) and not mine and not fused:
                donor = donor or other
            elif not mine or mine & taken:
                self._stop_gang(other)       # idle and in the way: its workers go back to the pool
        if donor is not None:
            gang, donor.gang, donor.instances, donor.slots = donor.gang, None, (), ()
            self.ganged.discard(donor.id)
            trial.gang = self.runner.reassign(gang, trial.id, self._run_config(trial), trial.checkpoint)
        else:
            trial.gang = self.runner.start(trial.id, self._run_config(trial), wanted, trial.checkpoint, trials_per_gpu=share,
                                           gpus=tuple(g for _, g in slots), fused=fused)
        trial.instances, trial.slots, trial.share, trial.fused = wanted, tuple(slots), share, fused
        self.ganged.add(trial.id)
        left = self.resuming.pop(trial.id, None)
        if left is not None:
            self._emit("resume", trial=trial.id, step=trial.step, left=list(left), instances=list(wanted))
        self._emit("gang", trial=trial.id, instances=list(wanted))

    @staticmethod
    def _run_config(trial: TrialState) -> dict[str, Any]:
        """The config its workers build ``trial`` from: a target trial's says so (``TARGET_KEY``)."""
        return {**trial.config, TARGET_KEY: True} if trial.target else trial.config

    def _release(self, d: ReleaseInstances) -> None:
        names = [self.real[n] for n in d.names if n in self.real and self.real[n] not in self.gone]
        cancelled = [n for n in d.names if n not in self.real]
        self.unready = [(n, t) for n, t in self.unready if n not in cancelled]
        if names:        # the stage they last served (the ledger bills their round-up there)
            self._emit("release", instances=list(names), stage=d.stage)
        for inst in names:
            for t in self.trials.values():
                if t.gang is not None and inst in t.instances:
                    self._stop_gang(t)
            self.runner.release_instance(inst)
        if names and all(i in self.doomed for i in names):
            self.cluster.release(names, stage=self.stage)
        elif names:
            keep = [i for i in self.name if i not in self.gone and i not in names]
            self.cluster.release_to(keep, stage=self.stage)
        self.gone.update(names)
        self.doomed.difference_update(names)
        # release_to lowers the request to what is kept: ask again for what is still coming.
        if cancelled or (names and self.unready):
            self.cluster.scale_to(self._want(), stage=self.stage)

    def _sync(self, i: int) -> None:
        """The SYNC barrier: the stage's trials have reported, so rank (the scheduler) and go on."""
        self._sync_stage = i
        sync_s = self.runner.sync_s(i)
        if sync_s > 0:           # a virtual runner's SYNC takes its drawn time; what happened meanwhile first
            self.clock.sleep(sync_s)
            self._watch()
        self._feed(SyncDone(i))

    def _record_stage(self, d: StageEnded) -> None:
        """A stage is over: its record (and, at its SYNC, the ``sync`` event)."""
        self.budget_left = d.budget_left_usd
        end = self._now() if d.at_s is None else d.at_s
        self.stages.append(StageRecord(d.stage, self.stage_start, end, d.instances, list(d.trials),
                                       list(d.promoted), spot_instances=d.spot_instances))
        if d.stage == self._sync_stage:
            self._emit("sync", index=d.stage, promoted=list(d.promoted), **self._budget())
