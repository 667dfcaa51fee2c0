"""The driver: runs a plan stage by stage through a cluster port and a trial runner port.

Per stage: ask the cluster for the stage's instances, let the placement policy map trials
to instances (keeping each trial's workers together and unchanged trials where they are),
start or continue each trial's gang, train the stage's iterations one at a time (the
checkpoint after each one is what a trial resumes from if its node dies), hand a freed GPU
to the next queued trial, rank trials at the SYNC and keep the best ``1/eta``, and, when
the next stage needs fewer instances of a node type (an instance type on a market), pack the
survivors onto the oldest instances of each type before releasing the newest.

Spot (DESIGN §4.1): each stage asks for its spot and on-demand instances as two node types.
A reclaimed instance is a lost node: its trials resume from their checkpoints on the
replacement the cluster launches for the standing request. With an interruption notice, the
replacement is requested at the notice; each trial on the noticed instance finishes its
iteration (its checkpoint), then moves to the replacement, and the emptied instance is let go.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rubberband.errors import ProviderError, RubberbandError, SpecError
from rubberband.executor.ports import ClusterPort, Node, Request, TrialRunnerPort
from rubberband.executor.search_space import sample_configs
from rubberband.placement import InfeasiblePlacementError, Placement, place, scale_down_plan
from rubberband.plan.plan import Plan
from rubberband.providers.node_types import ON_DEMAND, SPOT, NodeType, counts

log = logging.getLogger("rubberband.executor")

MAX_TRIAL_RESTARTS = 3


def stage_request(plan: Plan, stage: int) -> dict[NodeType, int]:
    """The instances stage ``stage`` of ``plan`` holds, by node type (its spot and on-demand parts)."""
    held, spot = plan.instances[stage], plan.spot_counts[stage]
    request = {NodeType(plan.instance_type, ON_DEMAND): held - spot, NodeType(plan.instance_type, SPOT): spot}
    return {t: n for t, n in request.items() if n}


def keep_oldest(nodes: Sequence[Node], target: Request) -> list[str]:
    """The instances to keep for ``target``: the oldest of each node type (``nodes`` are
    oldest first), so the most recently launched of each type go first (DESIGN §4)."""
    left = dict(target)
    keep = []
    for node in nodes:
        if left.get(node.node_type, 0) > 0:
            left[node.node_type] -= 1
            keep.append(node.name)
    return keep


@dataclass
class TrialState:
    """One trial as the driver tracks it."""

    id: str
    config: dict[str, Any]
    bracket: int
    checkpoint: bytes | None = None
    step: int = 0
    metric: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    gang: Any = None
    instances: tuple[str, ...] = ()
    history: list[dict[str, Any]] = field(default_factory=list)
    eliminated_after: int | None = None
    restarts: int = 0
    ranks_in_sync: bool = True     # every multi-worker gang's ranks held identical parameters


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


class Driver:
    """The control loop over one plan (see the module docstring)."""

    def __init__(self, plan: Plan, cluster: ClusterPort, runner: TrialRunnerPort, search_space: dict[str, Any],
                 metric: str, mode: str = "min", seed: int = 0, clock: Callable[[], float] = time.time,
                 checkpoint_dir: str | Path | None = None, node_timeout_s: float = 300.0,
                 wait_timeout_s: float = 600.0, on_event: Callable[[str, dict[str, Any]], None] | None = None,
                 keep_warm: bool = False, poll_s: float = 1.0):
        if mode not in ("min", "max"):
            raise SpecError(f"mode: expected min or max, got {mode!r}")
        self.plan, self.cluster, self.runner = plan, cluster, runner
        self.search_space, self.metric, self.mode, self.seed = search_space, metric, mode, seed
        self.clock = clock
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.node_timeout_s, self.wait_timeout_s = node_timeout_s, wait_timeout_s
        self.on_event = on_event or (lambda kind, data: None)
        self.keep_warm = keep_warm      # leave the runner's warm workers up (back-to-back runs)
        self.poll_s = poll_s            # how often a waiting driver looks for interruption notices
        self.request: dict[NodeType, int] = {}      # what the current stage holds
        self.doomed: set[str] = set()               # instances under an interruption notice
        self.trials: dict[str, TrialState] = {}
        self.stages: list[StageRecord] = []
        self.train_runs: list[dict[str, Any]] = []
        self.placement = Placement()

    # --- helpers -----------------------------------------------------------------------------
    def _emit(self, kind: str, **data: Any) -> None:
        self.on_event(kind, data)

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
        if trial.gang is not None:
            try:
                self.runner.stop(trial.gang)
            finally:
                trial.gang, trial.instances = None, ()
        if trial.id in self.placement.assignments:
            self.placement = _without(self.placement, [trial.id])

    def _instances_of(self, placement: Placement, trial: str) -> tuple[str, ...]:
        return tuple(str(node) for node, _ in placement.slots(trial))

    def _launch_all(self, tids: Sequence[str]) -> None:
        """Give each trial a gang on its placed instances: keep its own when it is already
        there, else release the old one first (its workers go back to the warm pool)."""
        wanted = {tid: self._instances_of(self.placement, tid) for tid in tids}
        for tid in tids:
            trial = self.trials[tid]
            if trial.gang is not None and trial.instances != wanted[tid]:
                self.runner.stop(trial.gang)
                trial.gang, trial.instances = None, ()
        for tid in tids:
            trial = self.trials[tid]
            if trial.gang is None:
                trial.gang = self.runner.start(tid, trial.config, wanted[tid], trial.checkpoint)
                trial.instances = wanted[tid]
                self._emit("gang", trial=tid, instances=list(wanted[tid]))

    def _launch(self, trial: TrialState, instances: tuple[str, ...]) -> Any:
        """Resume one trial on ``instances`` (after its gang was lost)."""
        if trial.gang is not None and trial.instances == instances:
            return trial.gang
        if trial.gang is not None:
            self.runner.stop(trial.gang)
        trial.gang = self.runner.start(trial.id, trial.config, instances, trial.checkpoint)
        trial.instances = instances
        self._emit("gang", trial=trial.id, instances=list(instances))
        return trial.gang

    def _better(self, value: float) -> float:
        return value if self.mode == "min" else -value

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> DriverOutcome:
        spec, plan = self.plan.spec, self.plan
        started = self.clock()
        bracket = -1
        active: list[str] = []
        for i, stage in enumerate(spec.stages):
            if i in spec.bracket_starts:
                bracket += 1
                for tid in active:
                    self._stop_gang(self.trials[tid])
                configs = sample_configs(self.search_space, stage.num_trials, seed=self.seed + 1000 * bracket)
                active = []
                for j, config in enumerate(configs):
                    tid = f"b{bracket}-t{j:03d}" if len(spec.bracket_starts) > 1 else f"t{j:03d}"
                    self.trials[tid] = TrialState(tid, config, bracket)
                    active.append(tid)
            if len(active) != stage.num_trials:
                raise RubberbandError(f"stage {i}: {len(active)} trials alive but the spec runs {stage.num_trials}")
            stage_start = self.clock() - started
            count, m = plan.instances[i], plan.gpus_per_trial[i]
            slots = min(plan.allocation[i], stage.num_trials)
            self.request = stage_request(plan, i)
            spot = plan.spot_counts[i]
            self._emit("stage", index=i, trials=stage.num_trials, iters=stage.iters, gpus_per_trial=m, instances=count,
                       spot=spot)
            self.cluster.scale_to(self.request, stage=i)
            nodes = self.cluster.wait_nodes(self.request, self.node_timeout_s)
            warm_s = self.runner.warm(nodes)     # part of initialising a new instance: one warm worker per GPU
            self._emit("nodes", stage=i, instances=[n.name for n in nodes], warm_s=warm_s, at=self.clock())
            self._run_stage(i, stage.iters, active, slots, m, nodes, started)
            # SYNC: rank and promote within the bracket.
            next_same = i + 1 < spec.num_stages() and (i + 1) not in spec.bracket_starts
            ranked = sorted(active, key=lambda t: self._better(self.trials[t].metric))
            keep = ranked[: spec.stages[i + 1].num_trials] if next_same else []
            for tid in active:
                if tid not in keep:
                    trial = self.trials[tid]
                    trial.eliminated_after = i
                    self._stop_gang(trial)
            if i + 1 < spec.num_stages():
                target = stage_request(plan, i + 1)
            else:
                target = dict(self.request) if self.keep_warm else {}
            held = counts(n.node_type for n in self.cluster.nodes())
            if any(n > target.get(t, 0) for t, n in held.items()):
                self._pack_and_release(i, keep, target)
            self.stages.append(StageRecord(i, stage_start, self.clock() - started, count, list(active), list(keep),
                                           spot_instances=spot))
            self._emit("sync", index=i, promoted=keep)
            active = keep
        for trial in self.trials.values():
            self._stop_gang(trial)
        if not self.keep_warm:
            self.runner.shutdown()
        return DriverOutcome(self.trials, self.stages, self.train_runs, started, self.clock())

    def _pack_and_release(self, index: int, survivors: list[str], target: Request) -> None:
        """Scale down at a SYNC: pack before releasing (DESIGN §6) and release the most
        recently launched instances of each node type (DESIGN §4), keeping the oldest
        ``target[t]`` of each type ``t`` (the right market goes: a stage that holds fewer spot
        instances releases spot ones).

        Survivors that will run next stage at their current size stay where they are if
        their instances are kept, else move (checkpointed every iteration: restarted on the
        kept instances) before the newest are released. A survivor that the next stage
        resizes or queues restarts then anyway, so it is stopped rather than moved; so is one
        that does not fit on the kept instances (the next stage moves it to a market it
        launches only then).
        """
        carried: set[str] = set()
        if survivors:   # only when the next stage continues this bracket
            m, slots = self.plan.gpus_per_trial[index + 1], self.plan.allocation[index + 1]
            carried = {t for t in survivors[:slots] if len(self.placement.assignments.get(t, ())) == m}
        for tid in survivors:
            if tid not in carried:
                self._stop_gang(self.trials[tid])
        nodes = self.cluster.nodes()
        keep = set(keep_oldest(nodes, target))
        # scale_down_plan keeps the first nodes it is given: the chosen ones, oldest first.
        ordered = [(n.name, n.gpus) for n in nodes if n.name in keep] + [(n.name, n.gpus) for n in nodes if n.name not in keep]
        try:
            packed = scale_down_plan(self.placement, ordered, len(keep))
        except InfeasiblePlacementError:
            for tid in carried:
                self._stop_gang(self.trials[tid])
            packed = scale_down_plan(self.placement, ordered, len(keep))
        self.placement = packed.placement
        self._launch_all(list(packed.moved))
        for node in packed.release:
            self.runner.release_instance(node)
        self.cluster.release_to(list(packed.keep), stage=index)

    def _run_stage(self, index: int, iters: int, active: list[str], slots: int, m: int, nodes: list[Node],
                   started: float) -> None:
        node_pairs = [(n.name, n.gpus) for n in nodes]
        queue = list(active)
        first = queue[:slots]
        # Trials not running now free their slots; the rest keep theirs where they can.
        self.placement = _without(self.placement, [t for t in self.placement.trials() if t not in first])
        for tid in list(self.placement.trials()):
            if tid in first and len(self.placement.slots(tid)) != m:
                self._stop_gang(self.trials[tid])
        self.placement = place({t: m for t in first}, node_pairs, previous=self.placement)
        if self.placement.unplaced:
            raise ProviderError(f"stage {index}: cannot place trials {list(self.placement.unplaced)} on {len(nodes)} instances")
        for tid in active:
            if tid not in first:
                self._stop_gang(self.trials[tid])
        queue = queue[slots:]
        remaining: dict[str, int] = {}
        began: dict[str, float] = {}
        compute: dict[str, list[float]] = {}
        pending: dict[Any, str] = {}

        def start(tid: str, began_at: float) -> None:
            # A TRAIN node starts before its gang is formed: start-up (workers joining, the
            # checkpoint restored) is part of it, as in the simulator's model.
            remaining[tid] = iters
            began[tid] = began_at - started
            self._emit("start", trial=tid, stage=index)
            pending[self.runner.train(self.trials[tid].gang, 1)] = tid

        launched_at = self.clock()
        self._launch_all(first)
        for tid in first:
            start(tid, launched_at)
        last_report = self.clock()
        while pending:
            done, _ = self.runner.wait(list(pending), min(self.poll_s, self.wait_timeout_s))
            self._take_notices(index)
            if not done:
                if self.clock() - last_report > self.wait_timeout_s:
                    raise ProviderError(f"stage {index}: no trial reported for {self.wait_timeout_s:.0f}s")
                continue
            last_report = self.clock()
            for future in done:
                tid = pending.pop(future)
                trial = self.trials[tid]
                try:
                    res = self.runner.result(future)
                except Exception as exc:  # the gang died (its node went away): resume from checkpoint
                    self._recover(trial, exc, m)
                    pending[self.runner.train(trial.gang, 1)] = tid
                    self._release_vacated(index)
                    continue
                self._save_checkpoint(trial, res.checkpoint)
                trial.step = res.step
                compute.setdefault(tid, []).extend(res.iter_times)
                if res.digests and len(res.digests) > 1:
                    first = res.digests[0]
                    trial.ranks_in_sync = trial.ranks_in_sync and all(
                        d is not None and all(abs(a - b) <= 1e-9 * max(1.0, abs(a)) for a, b in zip(d, first))
                        for d in res.digests)
                remaining[tid] -= 1
                if remaining[tid] > 0:
                    if self.doomed.intersection(trial.instances):
                        # Its instance is about to be reclaimed: move now, from this checkpoint.
                        self._resume_elsewhere(trial, m)
                        self._release_vacated(index)
                    pending[self.runner.train(trial.gang, 1)] = tid
                    continue
                trial.metrics = dict(res.metrics)
                if self.metric not in res.metrics:
                    raise SpecError(f"metric: the trainer reports {sorted(res.metrics)}, not {self.metric!r}; set `metric:` to one of them")
                trial.metric = float(res.metrics[self.metric])
                end = self.clock() - started
                trial.history.append({"stage": index, "iters": iters, "gpus": m, "step": trial.step,
                                      "instances": list(trial.instances), "restarts": trial.restarts,
                                      "start_s": began[tid], "end_s": end, **trial.metrics})
                self.train_runs.append({"trial": tid, "stage": index, "gpus": m, "start_s": began[tid], "end_s": end,
                                        "iters": iters, "iter_s": compute.pop(tid, [])})
                self._emit("trial", trial=tid, stage=index, metric=trial.metric, step=trial.step)
                if queue:   # this GPU takes the next queued trial, in the same running workers
                    nxt = self.trials[queue.pop(0)]
                    handoff_at = self.clock()
                    slots_freed = self.placement.slots(tid)
                    gang, trial.gang, trial.instances = trial.gang, None, ()
                    self.placement = Placement({**{t: s for t, s in self.placement.assignments.items() if t != tid},
                                                nxt.id: slots_freed})
                    nxt.gang = self.runner.reassign(gang, nxt.id, nxt.config, nxt.checkpoint)
                    nxt.instances = self._instances_of(self.placement, nxt.id)
                    start(nxt.id, handoff_at)

    # --- spot notices and lost nodes ----------------------------------------------------------
    def _take_notices(self, index: int) -> None:
        """Request a replacement for every instance that got an interruption notice (so its
        provisioning overlaps the notice window) and let go of it at once if it runs nothing."""
        for notice in self.cluster.notices():
            if notice.instance in self.doomed or notice.instance not in {n.name for n in self.cluster.nodes()}:
                continue
            self.doomed.add(notice.instance)
            self.cluster.replace(notice.instance)
            log.info("instance %s will be reclaimed in %.0fs; requested its replacement", notice.instance,
                        notice.reclaim_at - self.clock())
            self._emit("notice", instance=notice.instance, reclaim_at=notice.reclaim_at, at=self.clock())
        self._release_vacated(index)

    def _release_vacated(self, index: int) -> None:
        """Let go of noticed instances that no trial uses any more (before the cloud takes them)."""
        busy = {inst for t in self.trials.values() if t.gang is not None for inst in t.instances}
        vacated = sorted(d for d in self.doomed if d not in busy)
        if vacated:
            for name in vacated:
                self.runner.release_instance(name)
            self.cluster.release(vacated, stage=index)
            self.doomed.difference_update(vacated)

    def _recover(self, trial: TrialState, exc: Exception, m: int) -> None:
        trial.restarts += 1
        if trial.restarts > MAX_TRIAL_RESTARTS:
            raise ProviderError(f"trial {trial.id}: failed {trial.restarts} times, last: {exc}") from exc
        reason = " ".join(str(exc).split())      # Ray's errors span lines; a log line does not
        log.warning("trial %s lost its gang (%s); resuming from its checkpoint at step %s", trial.id, reason[:300], trial.step)
        self._emit("recover", trial=trial.id, error=str(exc), step=trial.step)
        self._resume_elsewhere(trial, m)

    def _resume_elsewhere(self, trial: TrialState, m: int) -> None:
        """Stop the trial's gang and resume it from its checkpoint on the stage's usable
        instances (waiting for the replacements of lost or noticed ones)."""
        left = list(trial.instances)
        self._stop_gang(trial)
        nodes = self.cluster.wait_nodes(self.request, self.node_timeout_s)
        self.doomed.intersection_update(self.cluster.doomed())     # reclaimed ones are gone
        self.runner.forget_dead([n.name for n in nodes] + sorted(self.doomed))
        self.runner.warm(nodes)
        pairs = [(n.name, n.gpus) for n in nodes]
        others = [t for t in self.placement.trials() if t != trial.id]
        alive_nodes = {n for n, _ in pairs}
        # Trials still running on a noticed instance keep their slots there until they move.
        stale = [t for t in others if any(node not in alive_nodes and node not in self.doomed
                                           for node, _ in self.placement.slots(t))]
        self.placement = _without(self.placement, [trial.id, *stale])
        reserved = [t for t in self.placement.trials() if not self.doomed.intersection(self._instances_of(self.placement, t))]
        current = Placement({t: s for t, s in self.placement.assignments.items() if t in reserved})
        self.placement = _merge(place({**{t: len(current.slots(t)) for t in reserved}, trial.id: m}, pairs,
                                      previous=current, reserved=reserved),
                                _without(self.placement, reserved))
        if trial.id in self.placement.unplaced:
            raise ProviderError(f"trial {trial.id}: no room to resume after its node was lost")
        self._launch(trial, self._instances_of(self.placement, trial.id))
        self._emit("resume", trial=trial.id, step=trial.step, left=left, instances=list(trial.instances))


def _merge(first: Placement, second: Placement) -> Placement:
    """Both placements' assignments (they place different trials on different GPUs)."""
    return Placement({**second.assignments, **first.assignments}, unplaced=first.unplaced)


def _without(placement: Placement, trials: Sequence[str]) -> Placement:
    drop = set(trials)
    return Placement({t: s for t, s in placement.assignments.items() if t not in drop})


def best_trial(trials: dict[str, TrialState], mode: str) -> TrialState | None:
    """The trial with the best final metric among those that ran longest."""
    finished = [t for t in trials.values() if t.metric is not None and math.isfinite(t.metric)]
    if not finished:
        return None
    most = max(t.step for t in finished)
    top = [t for t in finished if t.step == most]
    return min(top, key=lambda t: t.metric if mode == "min" else -t.metric)
