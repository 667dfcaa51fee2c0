"""Ray adapters of the executor's ports: gangs of DDP actors, and the local cluster's nodes."""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rubberband.errors import ProviderError
from rubberband.executor.ports import Node, Notice, Request, TrainResult
from rubberband.executor.spot_notice import NoticeBoard, NoticeWatcher
from rubberband.executor.worker import DDPWorker, load_trainer
from rubberband.function_api import is_function_trainable
from rubberband.nodes import INSTANCE_PREFIX, NodeType, counts, describe, within
from rubberband.providers.base import LAUNCH_ERRORS, ProviderEvent

try:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the executor needs Ray: pip install 'rubberband[ray,torch]'") from exc


def keep_oldest(nodes: Sequence[Node], target: Request) -> list[str]:
    """The instances to keep for ``target``: the oldest of each node type (``nodes`` are
    oldest first), so the most recently launched of each type go first (DESIGN §4)."""
    left = dict(target)
    keep = []
    for node in nodes:
        if node.node_type is not None and left.get(node.node_type, 0) > 0:
            left[node.node_type] -= 1
            keep.append(node.name)
    return keep


@dataclass(eq=False)
class Gpu:
    """One GPU of one instance, held by a one-bundle placement group (``{"GPU": 1, <instance>:
    0.001}``), with up to ``share`` worker actors of ``num_gpus = 1/share`` each (1: a whole
    GPU). Packed trials on one of the scheduler's slots share one of these, so they share one
    physical GPU whatever Ray would pick for free-floating fractions; ``slot`` is the
    scheduler's GPU index it serves on its instance once a packed trial has used it. The group
    holds the whole GPU, so a stage packing fewer trials (``k <= share``; 1: unpacked) uses it
    as it is: only ``k`` of its workers at a time."""

    pg: Any
    instance: str
    share: int
    workers: list[Worker] = field(default_factory=list)
    slot: int | None = None
    group: FusedSlot | None = None     # the fused group its one worker trains (DESIGN §4.5)


@dataclass(eq=False)
class Worker:
    """A warm worker actor on one GPU (or a ``1/share`` of it) of one instance."""

    actor: Any
    gpu: Gpu

    @property
    def instance(self) -> str:
        return self.gpu.instance


@dataclass(eq=False)
class Gang:
    """One trial's workers, all on the instances the placement controller chose."""

    trial: str
    workers: list[Worker]
    instances: tuple[str, ...]
    share: int = 1
    group: FusedSlot | None = None      # a member of this fused group (DESIGN §4.5)

    @property
    def actors(self) -> list[Any]:
        return [w.actor for w in self.workers]


@dataclass(eq=False)
class FusedSlot:
    """A fused group on one GPU: one worker holding the whole GPU trains its members as one
    program (``DDPWorker.assign_group``). Members join (``start``) and leave (``stop``) one by
    one; the runner trains, as one round, the members that asked for a chunk when it next waits,
    rebuilding the worker's group from the members' latest checkpoints when they are not the
    ones it holds (a member that joined or left, the next wave of a stage)."""

    worker: Worker
    members: dict[str, tuple[dict[str, Any], Any]] = field(default_factory=dict)   # trial -> (config, checkpoint)
    built: tuple[str, ...] = ()                  # the members the worker's group holds, in its order
    asked: dict[str, GangFuture] = field(default_factory=dict)   # chunks asked for, not yet trained


@dataclass(eq=False)
class RoundRefs:
    """One round of a fused group in flight: the worker's per-member results and checkpoints."""

    results: Any
    checkpoints: Any
    members: tuple[str, ...]
    fetched: tuple[list[Any], list[Any]] | None = None      # (results, checkpoints), read once for all members


@dataclass(eq=False)
class GangFuture:
    """A chunk of training in flight: rank 0's result and the other ranks' completions."""

    gang: Gang
    rank0: Any
    others: list[Any]
    iters: int = 0
    round: RoundRefs | None = None        # a fused member's: its group's round, once trained


class RayTrialRunner:
    """Runs trials as gangs of warm ``DDPWorker`` actors pinned to the placement's instances.

    Each GPU of an instance is held by its own placement group that also asks for the
    instance's own resource (``rb-instance-<n>``), so a gang sits exactly where the placement
    controller put it; the GPU's workers (one, or ``k`` of ``1/k`` GPU each in a packed stage)
    are scheduled into that group. Workers are started once per GPU when an instance joins
    (``warm``: process start, torch import, the trainer's ``prepare``) and then reused trial
    after trial, like Ray Tune's ``reuse_actors``; a resize forms a new gang from warm workers
    and restores the checkpoint. A stage that packs ``k`` trials per GPU warms ``k`` workers
    on each GPU: an idle GPU whose workers hold more than ``1/k`` of it is replaced (its
    workers killed, the GPU freed, new ones started); one whose workers hold less keeps ``k``
    of them (the surplus idle ones are killed, so their memory goes back to the trials).
    """

    def __init__(self, trainer: Any, seed: int = 0, timeout_s: float = 180.0, time_attr: str | None = None):
        self.trainer, self.seed, self.timeout_s, self.time_attr = trainer, seed, timeout_s, time_attr
        self._worker_cls = ray.remote(num_cpus=0, num_gpus=1, max_restarts=0, max_task_retries=0)(DDPWorker)
        self.gpus: dict[str, list[Gpu]] = {}       # instance -> its GPUs with workers
        self.busy: set[Worker] = set()

    @functools.cached_property
    def restarts_each_stage(self) -> bool:
        """A function trainable restarts from its checkpoint at every stage, kept gang or not
        (ports); ``trainer`` may name it (``module:function``), loaded here as the workers load it
        (on first use: a kept gang at a new stage)."""
        trainer = self.trainer
        return is_function_trainable(load_trainer(trainer) if isinstance(trainer, str) else trainer)

    # --- warm workers --------------------------------------------------------------------
    def _new_gpu(self, instance: str, share: int) -> Gpu:
        pg = placement_group([{"GPU": 1, instance: 0.001}], strategy="STRICT_PACK")
        try:
            ray.get(pg.ready(), timeout=self.timeout_s)
        except Exception as exc:
            remove_placement_group(pg)
            raise ProviderError(f"instance {instance}: no free GPU for a worker: {exc}") from exc
        gpu = Gpu(pg, instance, share)
        self.gpus.setdefault(instance, []).append(gpu)
        return gpu

    def _new_worker(self, gpu: Gpu) -> Worker:
        actor = self._worker_cls.options(
            num_gpus=1 / gpu.share,
            scheduling_strategy=PlacementGroupSchedulingStrategy(gpu.pg, placement_group_bundle_index=0),
        ).remote(self.trainer, self.seed, self.time_attr)
        worker = Worker(actor, gpu)
        gpu.workers.append(worker)
        return worker

    def _idle(self, gpu: Gpu) -> list[Worker]:
        return [w for w in gpu.workers if w not in self.busy]

    def _in_use(self, gpu: Gpu) -> int:
        return sum(1 for w in gpu.workers if w in self.busy)

    def _drop_too_coarse(self, instance: str, share: int, limit: int | None = None) -> None:
        """Free up to ``limit`` wholly idle GPUs of ``instance`` whose workers hold more than
        ``1/share`` of a GPU (too few of them fit on it)."""
        coarse = [g for g in self.gpus.get(instance, []) if g.share < share and not self._in_use(g)]
        for gpu in coarse[:limit]:
            self._drop(gpu)

    def warm(self, nodes: Sequence[Node], trials_per_gpu: int = 1) -> float:
        """Give every GPU of ``nodes`` ``trials_per_gpu`` warm workers (the stage's packing; see
        the class docstring for GPUs warmed for another share); return seconds taken."""
        t0 = time.time()
        k = trials_per_gpu
        fresh = []
        for node in nodes:
            self._drop_too_coarse(node.name, k)
            for gpu in [g for g in self.gpus.get(node.name, []) if g.share >= k]:
                for w in self._idle(gpu)[:max(0, len(gpu.workers) - max(k, self._in_use(gpu)))]:
                    self._kill(w)
                fresh += [self._new_worker(gpu) for _ in range(k - len(gpu.workers))]
            for _ in range(node.gpus - len(self.gpus.get(node.name, ()))):
                gpu = self._new_gpu(node.name, k)
                fresh += [self._new_worker(gpu) for _ in range(k)]
        if fresh:
            ray.get([w.actor.warmup.remote() for w in fresh], timeout=self.timeout_s)
        return time.time() - t0

    def _kill(self, worker: Worker) -> None:
        """Kill a worker; its GPU's placement group goes with its last worker."""
        self.busy.discard(worker)
        _kill_quietly(worker.actor)
        gpu = worker.gpu
        if worker in gpu.workers:
            gpu.workers.remove(worker)
        if not gpu.workers:
            self._drop(gpu)

    def _drop(self, gpu: Gpu) -> None:
        for w in list(gpu.workers):
            self.busy.discard(w)
            _kill_quietly(w.actor)
        gpu.workers.clear()
        mine = self.gpus.get(gpu.instance, [])
        if gpu in mine:
            mine.remove(gpu)
            if not mine:
                del self.gpus[gpu.instance]
        try:
            remove_placement_group(gpu.pg)
        except Exception:
            pass

    def release_instance(self, instance: str) -> None:
        """Stop the warm workers of an instance about to be released (so it is idle)."""
        for gpu in list(self.gpus.get(instance, [])):
            self._drop(gpu)

    def forget_dead(self, alive: Sequence[str]) -> None:
        """Drop workers of instances that are gone (a lost node)."""
        for inst in [i for i in self.gpus if i not in alive]:
            self.release_instance(inst)

    def shutdown(self) -> None:
        for inst in list(self.gpus):
            self.release_instance(inst)

    # The model's time is real here: one iteration per chunk (each ends in a checkpoint), no
    # draws at a TRAIN's start, and a SYNC takes what the driver's barrier takes.
    def begin_train(self, gang: Gang, stage: int) -> None:
        return None

    def chunk_iters(self, left: int) -> int:
        return 1

    def sync_s(self, stage: int) -> float:
        return 0.0

    # --- gangs ---------------------------------------------------------------------------
    def _take(self, instance: str, share: int, slot: int | None) -> tuple[Worker, bool]:
        """An idle worker for a trial ``share`` to a GPU on ``instance`` (packed: on the GPU
        serving ``slot``), and whether it is new (not warmed up yet)."""
        mine = [g for g in self.gpus.get(instance, []) if g.share >= share]
        if share > 1:
            # The slot's GPU; else a free one not yet serving another slot, so the trials the
            # scheduler packs onto one slot share one GPU.
            gpu = next((g for g in mine if g.slot == slot), None) or next(
                (g for g in mine if g.slot is None and not self._in_use(g)), None)
        else:
            gpu = next((g for g in mine if not self._in_use(g)), None)
        if gpu is None:
            self._drop_too_coarse(instance, share, limit=1)     # make room for a GPU of this share
            gpu = self._new_gpu(instance, share)
        elif self._in_use(gpu) >= share:
            raise ProviderError(f"instance {instance}: its GPU {slot} already runs {share} trials")
        if share > 1:
            gpu.slot = slot
        idle = self._idle(gpu)
        if idle:
            return idle[-1], False
        return self._new_worker(gpu), True

    def start(self, trial: str, config: dict[str, Any], instances: Sequence[str], checkpoint: bytes | None,
              trials_per_gpu: int = 1, gpus: Sequence[int] | None = None, fused: bool = False) -> Gang:
        """Form ``trial``'s gang, one worker on each of ``instances``, and restore ``checkpoint``.
        Packed (``trials_per_gpu`` k > 1): each worker takes ``1/k`` of the GPU that serves the
        scheduler's GPU index ``gpus[j]`` on its instance, beside the other trials placed there.
        Fused: the trial joins the fused group of that GPU (``FusedSlot``; its worker holds the
        whole GPU), up to ``trials_per_gpu`` members."""
        if fused:
            if len(instances) != 1:
                raise ProviderError(f"trial {trial}: a fused trial runs on one GPU, not on {len(instances)}")
            return self._join(trial, config, instances[0], checkpoint, gpus[0] if gpus else None, trials_per_gpu)
        workers, fresh = [], []
        try:
            for j, inst in enumerate(instances):
                worker, new = self._take(inst, trials_per_gpu, gpus[j] if gpus else None)
                self.busy.add(worker)
                workers.append(worker)
                if new:
                    fresh.append(worker)
            if fresh:
                ray.get([w.actor.warmup.remote() for w in fresh], timeout=self.timeout_s)
            if len(workers) > 1:
                port = ray.get(workers[0].actor.free_port.remote(), timeout=self.timeout_s)
                ray.get([w.actor.join.remote(rank, len(workers), port) for rank, w in enumerate(workers)],
                        timeout=self.timeout_s)
            ckpt = ray.put(checkpoint) if checkpoint is not None else None
            ray.get([w.actor.assign.remote(config, ckpt, trial) for w in workers], timeout=self.timeout_s)
        except Exception:
            for w in workers:
                self._kill(w)
            raise
        return Gang(trial, workers, tuple(instances), trials_per_gpu)

    def reassign(self, gang: Gang, trial: str, config: dict[str, Any], checkpoint: bytes | None) -> Gang:
        """Hand a gang's running workers to another trial (no process or group restart). A fused
        member's gang is never handed over: the driver has the trial join its GPU's group."""
        if gang.group is not None:
            raise ProviderError(f"trial {trial}: a fused member's gang is not handed over; start the trial fused")
        ckpt = ray.put(checkpoint) if checkpoint is not None else None
        ray.get([a.assign.remote(config, ckpt, trial) for a in gang.actors], timeout=self.timeout_s)
        gang.trial = trial
        return gang

    def train(self, gang: Gang, iters: int) -> GangFuture:
        if gang.group is not None:         # trained with the group's other members at the next wait
            future = GangFuture(gang, None, [], int(iters))
            gang.group.asked[gang.trial] = future
            return future
        refs = [a.train.remote(iters) for a in gang.actors]
        ckpt = gang.actors[0].checkpoint.remote()
        return GangFuture(gang, refs[0], refs[1:] + [ckpt])

    def wait(self, pending: Sequence[GangFuture], timeout_s: float) -> tuple[list[GangFuture], list[GangFuture]]:
        self._train_rounds(pending)
        by_ref: dict[Any, list[GangFuture]] = {}
        for f in pending:
            if f.rank0 is not None:
                by_ref.setdefault(f.rank0, []).append(f)
        if not by_ref:
            raise ProviderError("fused groups: chunks were asked for, but none could be trained")
        ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=timeout_s)
        done = [f for r in ready for f in by_ref[r]]      # a fused round: every member at once
        return done, [f for f in pending if f not in done]

    def result(self, future: GangFuture) -> TrainResult:
        if future.round is not None:
            return self._member_result(future)
        out = ray.get(future.rank0, timeout=self.timeout_s)
        rest = ray.get(future.others, timeout=self.timeout_s)
        digests = [out.get("digest")] + [o.get("digest") for o in rest[:-1]]
        return TrainResult(step=int(out["step"]), iter_times=list(out["iter_times"]),
                           metrics=dict(out.get("metrics", {})), checkpoint=rest[-1], digests=digests,
                           gpu_ids=[out.get("gpu_ids")] + [o.get("gpu_ids") for o in rest[:-1]],
                           redone=int(out.get("redone", 0)))

    def digests(self, gang: Gang) -> list[list[float]]:
        """Parameter digests of every rank (identical in a healthy gang)."""
        return ray.get([a.param_digest.remote() for a in gang.actors], timeout=self.timeout_s)

    def stop(self, gang: Gang) -> None:
        """Release a gang's workers back to the warm pool (or kill them if they are unhealthy); a
        fused member leaves its group (the worker goes back to the pool with the last one)."""
        if gang.group is not None:
            self._leave(gang)
            return
        try:
            ray.get([a.leave.remote() for a in gang.actors], timeout=30)
        except Exception:  # a dead or stuck gang cannot leave cleanly; replace its workers
            for w in gang.workers:
                self._kill(w)
            return
        for w in gang.workers:
            self.busy.discard(w)


    # --- fused groups (DESIGN §4.5) -----------------------------------------------------------
    def _join(self, trial: str, config: dict[str, Any], instance: str, checkpoint: bytes | None,
              slot: int | None, limit: int) -> Gang:
        """``trial`` joins the fused group serving the scheduler's GPU ``slot`` on ``instance``
        (a new group on an idle GPU when none serves it yet)."""
        mine = self.gpus.get(instance, [])
        gpu = next((g for g in mine if g.group is not None and g.slot == slot), None)
        if gpu is None:
            # Any idle GPU takes the group (its surplus workers go); else a new one, whole.
            gpu = next((g for g in mine if g.group is None and not self._in_use(g)), None) or self._new_gpu(instance, 1)
            idle = self._idle(gpu)
            for extra in idle[1:]:                           # one worker holds the group
                self._kill(extra)
            worker = idle[0] if idle else self._new_worker(gpu)
            if not idle:
                ray.get(worker.actor.warmup.remote(), timeout=self.timeout_s)
            gpu.slot, gpu.group = slot, FusedSlot(worker)
            self.busy.add(worker)
        group = gpu.group
        assert group is not None
        if len(group.members) >= limit:
            raise ProviderError(f"instance {instance}: the fused group on its GPU {slot} already has {limit} members")
        group.members[trial] = (dict(config), checkpoint)
        return Gang(trial, [group.worker], (instance,), limit, group=group)

    def _train_rounds(self, pending: Sequence[GangFuture]) -> None:
        """Train, as one round per fused group, the members that asked for a chunk; the worker's
        group is rebuilt from the members' latest checkpoints when they are not the ones it
        holds."""
        for group in {f.gang.group for f in pending if f.gang.group is not None and f.round is None}:
            assert group is not None
            members = tuple(t for t in group.members if t in group.asked)
            if not members:
                continue
            iters = {group.asked[t].iters for t in members}
            if len(iters) > 1:
                raise ProviderError(f"fused group of {', '.join(members)}: its members asked for {sorted(iters)} "
                                    "iterations; a group trains them in step")
            actor = group.worker.actor
            if members != group.built:
                configs = [group.members[t][0] for t in members]
                ckpts = [group.members[t][1] for t in members]
                ray.get(actor.assign_group.remote(list(members), configs, ckpts), timeout=self.timeout_s)
                group.built = members
            rnd = RoundRefs(actor.train.remote(iters.pop()), actor.checkpoint_group.remote(), members)
            for t in members:
                future = group.asked.pop(t)
                future.rank0, future.others, future.round = rnd.results, [rnd.checkpoints], rnd

    def _member_result(self, future: GangFuture) -> TrainResult:
        """A fused member's share of its group's round; its checkpoint is kept for a rebuild."""
        rnd, gang = future.round, future.gang
        assert rnd is not None and gang.group is not None
        if rnd.fetched is None:
            rnd.fetched = (ray.get(rnd.results, timeout=self.timeout_s), ray.get(rnd.checkpoints, timeout=self.timeout_s))
        outs, ckpts = rnd.fetched
        i = rnd.members.index(gang.trial)
        out = outs[i]
        if gang.trial in gang.group.members:
            gang.group.members[gang.trial] = (gang.group.members[gang.trial][0], ckpts[i])
        return TrainResult(step=int(out["step"]), iter_times=list(out["iter_times"]),
                           metrics=dict(out.get("metrics", {})), checkpoint=ckpts[i], digests=[out.get("digest")],
                           gpu_ids=[out.get("gpu_ids")])

    def _leave(self, gang: Gang) -> None:
        """A fused member leaves its group; with the last one, the worker drops the group and
        goes back to the warm pool (killed if it cannot)."""
        group = gang.group
        assert group is not None
        group.members.pop(gang.trial, None)
        group.asked.pop(gang.trial, None)
        if group.members:
            return
        worker = group.worker
        if worker.gpu.group is group:
            worker.gpu.group = None
        try:
            ray.get(worker.actor.leave.remote(), timeout=30)
        except Exception:
            if worker in worker.gpu.workers:
                self._kill(worker)
            return
        self.busy.discard(worker)


class RayClusterPort:
    """The cluster port over a Ray cluster autoscaled by ``request_resources``, by node type.

    Each instance is a Ray node with ``gpus_per_instance`` GPUs, a unique resource
    ``rb-instance-<n>`` and its node type's slot resource (``rubberband.nodes``); nodes
    are ordered oldest first by ``<n>``. The request is one bundle of a type's slot per
    wanted instance of that type, plus one per noticed instance still up (so its replacement
    is launched beside it); a noticed instance stops counting shortly before its reclaim
    (``RECLAIM_MARGIN_S``, or half the notice when that is shorter), so the autoscaler does
    not replace it twice. Spot nodes whose provider names a metadata
    endpoint (or all spot nodes, given ``metadata_url``: real EC2) get a ``NoticeWatcher``
    actor that posts notices to the port's ``NoticeBoard``.
    """

    RECLAIM_MARGIN_S = 3.0     # stop asking for a noticed instance this long before its reclaim

    def __init__(self, gpus_per_instance: int, types: Sequence[NodeType] = (), events: Any = None, poll_s: float = 0.2,
                 release_file: str | None = None, require_ready: bool | None = None,
                 metadata_url: str | None = None, watch_poll_s: float = 1.0, request: Any = None,
                 clock: Any = time.time):
        """``request(bundles=...)``: how the demand reaches the autoscaler (Ray's ``request_resources``);
        ``clock``: the wall clock notices' reclaim times are read against."""
        from ray.autoscaler.sdk import request_resources

        self._request = request or request_resources
        self._clock = clock
        self.G = gpus_per_instance
        self.types = {t.slot: t for t in types}
        self.release_file = release_file
        self.released: set[str] = set()
        self.wanted: dict[NodeType, int] = {}
        self.noticed: dict[str, tuple[NodeType, float]] = {}     # instance -> (its type, when to stop asking)
        self._events: Callable[[], list[dict[str, Any]]] = events or (lambda: [])
        # Whether the provider says when initialisation ends (a `ready` event); real EC2
        # workers join by themselves, and a live Ray node is then ready.
        self._require_ready = events is not None if require_ready is None else require_ready
        self.poll_s = poll_s
        self.metadata_url, self.watch_poll_s = metadata_url, watch_poll_s
        self._board: Any = None
        self._watchers: dict[str, Any] = {}
        self._pushed: list[dict[str, int]] | None = None
        self._reclaim_times: dict[str, float] = {}      # from the notices read

    def _alive(self, events: list[dict[str, Any]] | None = None) -> list[Node]:
        """Every live, ready node of ours not released (noticed ones included)."""
        events = self._events() if events is None else events
        ready = {e["instance"] for e in events if e.get("event") == ProviderEvent.READY}
        out = []
        for n in ray.nodes():
            if not n.get("Alive"):
                continue
            res = n.get("Resources", {})
            names = [k for k in res if k.startswith(INSTANCE_PREFIX)]
            types = [self.types[k] for k in res if k in self.types]
            if (names and types and res.get("GPU", 0) > 0 and (self._require_ready is False or names[0] in ready)
                    and names[0] not in self.released):
                out.append(Node(names[0], int(res["GPU"]), types[0]))
        return sorted(out, key=lambda node: int(node.name[len(INSTANCE_PREFIX):]))

    def _usable(self, alive: list[Node]) -> list[Node]:
        return [n for n in alive if n.name not in self.noticed]

    def nodes(self) -> list[Node]:
        return self._usable(self._alive())

    def doomed(self) -> list[str]:
        return [n.name for n in self._alive() if n.name in self.noticed]

    def _push(self, alive: list[Node] | None = None) -> None:
        """Ask the autoscaler for the wanted instances plus the noticed ones still up."""
        if alive is None:
            alive = self._alive() if self.noticed else []
        up = {n.name for n in alive}
        now = self._clock()
        want = dict(self.wanted)
        for name, (node_type, until) in self.noticed.items():
            if name in up and now < until:
                want[node_type] = want.get(node_type, 0) + 1
        bundles = [{t.slot: 1} for t, n in sorted(want.items()) for _ in range(n)]
        if bundles != self._pushed:
            self._request(bundles=bundles)
            self._pushed = bundles

    def scale_to(self, request: Request, stage: int) -> None:
        self.wanted = {t: n for t, n in request.items() if n}
        self._push()

    def wait_nodes(self, request: Request, timeout_s: float, until: float | None = None,
                   extra: Request | None = None, surplus_grace_s: float = 3.0) -> list[Node] | None:
        """Wait until exactly ``request`` usable instances of each type are ready; ``None`` when
        ``until`` (on ``clock``) comes first. ``extra``: requested too, not waited for (an eager
        target's, DESIGN §4.6): up to that many more of each type may be ready, and are no surplus."""
        extra = {t: n for t, n in (extra or {}).items() if n}
        deadline = time.time() + timeout_s
        surplus_since = None
        while True:
            events = self._events()      # read once per poll: readiness and launch failures
            alive = self._alive(events)
            self.noticed = {k: v for k, v in self.noticed.items() if k in {n.name for n in alive}}
            self._push(alive)
            usable = self._usable(alive)
            have = counts(n.node_type for n in usable if n.node_type is not None)
            if within(have, have, request, extra):
                return usable
            fatal = [e for e in events if e.get("event") == ProviderEvent.LAUNCH_FAILED and e.get("fatal")]
            if fatal:
                raise ProviderError(f"cluster: cannot launch instances: {fatal[-1].get('error')}")
            if any(n > request.get(t, 0) + extra.get(t, 0) for t, n in have.items()):
                # A node the autoscaler launched against a request that was just lowered (a
                # release racing its loop) would be kept forever: release the newest surplus.
                surplus_since = surplus_since or time.time()
                if time.time() - surplus_since > surplus_grace_s:
                    keep = set(keep_oldest(usable, {t: request.get(t, 0) + extra.get(t, 0)
                                                    for t in {*request, *extra}}))
                    self.release([n.name for n in usable if n.name not in keep], stage=-1)
                    surplus_since = None
            else:
                surplus_since = None
            if until is not None and self._clock() >= until:
                return None
            if time.time() > deadline:
                failures = [e for e in events if e.get("event") in LAUNCH_ERRORS]
                why = ""
                if failures:
                    last = failures[-1]
                    why = f"; last launch error: {last.get('code') or last.get('error')} ({len(failures)} failed attempt(s))"
                raise ProviderError(f"cluster: {describe(have)} alive, waited {timeout_s:.0f}s for {describe(request)}{why}")
            time.sleep(self.poll_s)

    def release_to(self, keep: Sequence[str], stage: int) -> None:
        """Keep exactly ``keep`` (the request drops to their types) and release every other instance."""
        alive = self._alive()
        kept = set(keep)
        self.wanted = counts(n.node_type for n in alive
                             if n.node_type is not None and n.name in kept and n.name not in self.noticed)
        self.release([n.name for n in alive if n.name not in kept], stage)

    def release(self, instances: Sequence[str], stage: int) -> None:
        """Release ``instances``: lower the request first, then have the provider terminate
        exactly those (listed in its release file)."""
        self.released |= set(instances)
        for name in instances:
            self.noticed.pop(name, None)
            watcher = self._watchers.pop(name, None)
            if watcher is not None:
                _kill_quietly(watcher)
        self._push()
        if self.release_file:
            tmp = self.release_file + ".tmp"
            with open(tmp, "w") as fh:
                json.dump(sorted(self.released), fh)
            os.replace(tmp, self.release_file)

    # --- spot notices ------------------------------------------------------------------------
    def _watch(self, alive: list[Node], events: list[dict[str, Any]]) -> None:
        """Start a notice watcher on every spot node that has a metadata endpoint and none yet."""
        urls = {e["instance"]: e["metadata_url"] for e in events
                if e.get("event") == ProviderEvent.READY and e.get("metadata_url")}
        for node in alive:
            url = urls.get(node.name) or (self.metadata_url if node.node_type and node.node_type.spot else None)
            if url is None or node.name in self._watchers:
                continue
            if self._board is None:
                self._board = ray.remote(num_cpus=0)(NoticeBoard).remote()
            watcher_cls = ray.remote(num_cpus=0, max_restarts=0)(NoticeWatcher)
            self._watchers[node.name] = watcher_cls.options(resources={node.name: 0.001}).remote(
                node.name, url, self._board, self.watch_poll_s)

    def notices(self) -> list[Notice]:
        events = self._events()
        alive = self._alive(events)
        self._watch(alive, events)
        self._push(alive)
        if self._board is None:
            return []
        try:
            posted = ray.get(self._board.take.remote(), timeout=10)
        except Exception:     # the board is the driver's own actor: a hiccup loses nothing
            return []
        out = [Notice(p["instance"], float(p["reclaim_at"])) for p in posted]
        self._reclaim_times.update((n.instance, n.reclaim_at) for n in out)
        return out

    def replace(self, instance: str) -> None:
        """Request one more instance of ``instance``'s type now; it stops counting as usable."""
        alive = self._alive()
        node = next((n for n in alive if n.name == instance), None)
        if node is None or node.node_type is None:
            return
        now = self._clock()
        reclaim_at = self._reclaim_times.get(instance, now + 120.0)     # AWS gives two minutes
        self.noticed[instance] = (node.node_type, reclaim_at - min(self.RECLAIM_MARGIN_S, (reclaim_at - now) / 2))
        self._push(alive)

    def shutdown(self) -> None:
        for watcher in self._watchers.values():
            _kill_quietly(watcher)
        self._watchers.clear()
        if self._board is not None:
            _kill_quietly(self._board)
            self._board = None
        try:
            self.scale_to({}, -1)
        except Exception:
            pass

    def events(self) -> list[dict[str, Any]]:
        return self._events()


def _kill_quietly(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:
        pass
