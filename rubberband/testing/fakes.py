"""In-process fakes of the executor's ports (a clock, a cluster, a trial runner) for unit tests:
the rehearsal's virtual-time ports (``rubberband.executor.sim.VirtualCluster`` and
``VirtualRunner``, which ``SimClusterPort`` and ``SimRunnerPort`` configure with the truth's
draws) in a test configuration, with call logs and controls (lost instances, notices, injected
failures, markets with no capacity).

Time is manual: the cluster launches what a request misses (at ``scale_to``, ``wait_nodes`` and,
for a noticed instance, ``replace``), each instance up after the constant launch latency; a wait
for instances moves the clock as the rehearsal's does (``VirtualCluster.wait_nodes``: it returns
at each instance up or notice); a notice and its reclaim happen at their times on the clock; the
runner trains a chunk to finish ``iters * L(m)`` fake seconds after it is submitted (``wait``
advances the clock to the earliest finish), with constant iteration times, so trials on
different GPUs run in parallel in fake time exactly as the simulator assumes.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rubberband.errors import ProviderError
from rubberband.executor.ports import Node, TrainResult, VirtualClock
from rubberband.executor.sim import SimChunk, SimGang, VirtualCluster, VirtualRunner
from rubberband.nodes import NodeType, instance_name


class FakeClock(VirtualClock):
    """The ports' ``VirtualClock``, starting at 1000 s; calling it returns ``now()``."""

    def __init__(self, start: float = 1000.0):
        super().__init__(start)

    def __call__(self) -> float:
        return self.t


class FakeCluster(VirtualCluster):
    """The virtual-time cluster (``rubberband.executor.sim.VirtualCluster``, the rehearsal's) in a
    test configuration: numbered instances ``rb-instance-<n>`` of the requested node types that
    take ``provision_s`` to run and ``init_s`` more to be ready (constants, read at each
    launch), all of a request at once; they live until released, lost (``lose``) or reclaimed
    after a notice (``notify``). Waits and replacements are the rehearsal's
    (``VirtualCluster``); only launches differ. Events use the local provider's format (with each
    instance's market). ``no_capacity``: markets whose launches fail until it is emptied (a zone
    out of spot): their requests are never granted."""

    def __init__(self, clock: FakeClock, gpus_per_instance: int, provision_s: float = 0.0, init_s: float = 0.0,
                 calls: list[tuple[Any, ...]] | None = None):
        super().__init__(clock)
        self.G = gpus_per_instance
        self.provision_s, self.init_s = provision_s, init_s
        self.no_capacity: set[str] = set()
        # Every port call as ("cluster", method, *args); share the list with a FakeRunner to
        # see the order of both.
        self.calls: list[tuple[Any, ...]] = [] if calls is None else calls

    # --- views -----------------------------------------------------------------------------
    @property
    def alive(self) -> list[str]:
        """Instances not released or lost, oldest first (launched ones not ready yet included)."""
        return list(self.live)

    @property
    def launched(self) -> int:
        """How many instances were launched."""
        return self._launched

    def called(self, method: str) -> list[tuple[Any, ...]]:
        """The arguments of every call of ``method``."""
        return [c[2:] for c in self.calls if c[:2] == ("cluster", method)]

    def _record(self, method: str, *args: Any) -> None:
        self.calls.append(("cluster", method, *args))

    # --- the configuration of the virtual cluster -----------------------------------------
    def _name(self, n: int) -> str:
        return instance_name(n)

    def _gpus(self, name: str) -> int:
        return self.G

    def _launch(self, node_types: list[Any]) -> None:
        t = self.clock.now()
        for node_type in sorted(k for k in node_types if k.market not in self.no_capacity):
            launched = t + self.provision_s
            self._add(node_type, t, launched, launched + self.init_s, math.inf, math.inf, self.G)

    def _event(self, kind: str, instance: str, t: float, **extra: Any) -> None:
        self._events.append({"event": kind, "instance": instance, "node_id": f"fake-{instance}", "t": t, **extra})

    def _launched_at(self, name: str) -> None:
        inst, t = self.instances[name], self.node_type[name]
        self._event("request", name, inst.requested_s, node_type=t.ray_name, market=t.market,
                    instance_type=t.instance_type)
        self._event("running", name, inst.launched_s)
        self._event("ready", name, inst.ready_s)

    def _up(self, name: str, at: float, gpus: int) -> None:
        self._nodes = None             # its events were written at its launch
        self._news = True

    def _end(self, name: str, reason: str, at: float | None = None) -> None:
        super()._end(name, reason, at)
        at = self.clock.now() if at is None else at     # its events to come never happen
        self._events = [e for e in self._events if e["instance"] != name or e["t"] <= at]
        self._event("terminated", name, at, reason=reason)

    # --- the port --------------------------------------------------------------------------
    def scale_to(self, request: Mapping[NodeType, int], stage: int) -> None:
        self._record("scale_to", _plain(request), stage)
        super().scale_to(request, stage)

    def wait_nodes(self, request: Mapping[NodeType, int], timeout_s: float,
                   until: float | None = None, extra: Mapping[NodeType, int] | None = None) -> list[Node] | None:
        self._record("wait_nodes", _plain(request))
        return super().wait_nodes(request, timeout_s, until, extra)

    def release_to(self, keep: Sequence[str], stage: int) -> None:
        self._record("release_to", list(keep), stage)
        super().release_to(keep, stage)

    def release(self, instances: Sequence[str], stage: int) -> None:
        self._record("release", list(instances), stage)
        super().release(instances, stage)

    def replace(self, instance: str) -> None:
        self._record("replace", instance)
        super().replace(instance)

    def shutdown(self) -> None:
        self._record("shutdown")
        super().shutdown()

    def events(self) -> list[dict[str, Any]]:
        return [dict(e) for e in self._events]

    # --- test controls ---------------------------------------------------------------------
    def lose(self, instance: str, reason: str = "lost", at: float | None = None) -> None:
        """The instance dies (at clock time ``at``, default now): gangs on it fail their next
        result (with a ``FakeRunner`` that was given this cluster). ``reason="interrupted"`` is
        a spot reclaim."""
        self._record("lose", instance)
        if instance not in self.live:
            raise AssertionError(f"lose: {instance} is not alive")
        self._end(instance, reason, at)

    def notify(self, instance: str, notice_s: float, at: float | None = None) -> None:
        """``instance`` gets an interruption notice at clock time ``at`` (default now) and is
        reclaimed ``notice_s`` later, unless the driver released it before (an instance not
        alive at ``at`` gets none)."""
        at = self.clock.now() if at is None else at
        self.clock.call_at(at, functools.partial(self._notify, instance, at + notice_s))

    def _notify(self, instance: str, down: float) -> None:
        if instance not in self.live:
            return
        self.instances[instance].down_s = down
        self.clock.call_at(down, functools.partial(self._reclaimed, instance))
        self._noticed(instance)


def _plain(request: Mapping[NodeType, int]) -> dict[str, int]:
    """A request as ``{node type name: count}`` (readable in call logs)."""
    return {t.name: n for t, n in sorted(request.items()) if n}


FakeGang = SimGang         # a gang of the virtual runner (its trial's config and step kept)
FakeFuture = SimChunk      # a chunk of the virtual runner


@dataclass
class GangRecord:
    """One ``start``: which trial, on which instances (one per worker), from which step, at how
    many trials per GPU on which GPU indices."""

    trial: str
    instances: tuple[str, ...]
    size: int
    from_step: int
    checkpoint: bytes | None
    at: float
    share: int = 1
    gpus: tuple[int, ...] = ()
    fused: bool = False


def default_metrics(config: Mapping[str, Any], step: int) -> dict[str, float]:
    """``loss`` grows with ``lr`` and shrinks with steps; ``accuracy = 1 - loss``."""
    loss = float(config["lr"]) + 1.0 / (1 + step)
    return {"loss": loss, "accuracy": 1.0 - loss}


def encode_checkpoint(trial: str, step: int) -> bytes:
    return json.dumps({"trial": trial, "step": step}).encode()


def decode_checkpoint(blob: bytes) -> dict[str, Any]:
    return json.loads(blob.decode())


@dataclass
class _Failure:
    trial: str
    step: int
    times: int
    lose_instance: bool


class FakeRunner(VirtualRunner):
    """The virtual-time runner (``rubberband.executor.sim.VirtualRunner``, the rehearsal's) in a
    test configuration: constant iteration times instead of draws, a deterministic metric and
    checkpoints that carry the step; each iteration is a chunk, as on a real cluster.

    Args:
        clock: the shared ``FakeClock``.
        iter_s: seconds per iteration by gang size (GPUs per trial).
        gpus_per_instance: checked on every start: no instance runs more than its GPUs' worth of
            workers (a packed worker counts ``1/k``), and no GPU index more than ``k`` packed ones.
        steps_per_iter: optimizer steps per iteration (``step += iters * steps_per_iter``).
        metrics: ``(config, step) -> metrics``; ``default_metrics`` ranks trials by ``lr``.
        cluster: if given, a gang on an instance the cluster lost fails its next result.
        calls: a call log to share with a ``FakeCluster`` (entries ``("runner", method, *args)``).
        pace: ``step -> factor`` on the iteration time of a gang at that step (a trainer that
            slows down as it trains); default 1.
        packed_iter_s: seconds per iteration of a 1-GPU trial packed ``k`` to a GPU, by ``k``.
        fused_iter_s: seconds per iteration of a fused group of ``F`` on one GPU, by ``F``.
        checkpoint_every: play a function trainable that checkpoints every ``c`` iterations
            (``"never"``: none): a gang started or handed its trial from a checkpoint of ``D``
            iterations trains ``D mod c`` (``D``) again first, as the worker's function does;
            a kept gang trains on. ``None`` (default): a class trainer, nothing redone.
    """

    def __init__(self, clock: FakeClock, iter_s: Mapping[int, float], gpus_per_instance: int,
                 steps_per_iter: int = 1, metrics: Callable[[Mapping[str, Any], int], dict[str, float]] = default_metrics,
                 cluster: FakeCluster | None = None, calls: list[tuple[Any, ...]] | None = None,
                 pace: Callable[[int], float] | None = None, packed_iter_s: Mapping[int, float] | None = None,
                 fused_iter_s: Mapping[int, float] | None = None, checkpoint_every: int | str | None = None):
        super().__init__(clock)
        self.checkpoint_every = checkpoint_every
        self.restarts_each_stage = checkpoint_every is not None
        self.iter_s, self.G = dict(iter_s), gpus_per_instance
        self.packed_iter_s = dict(packed_iter_s or {})
        self.fused_iter_s = dict(fused_iter_s or {})
        self.pace = pace or (lambda step: 1.0)
        self.steps_per_iter, self.metrics, self.cluster = steps_per_iter, metrics, cluster
        self.calls: list[tuple[Any, ...]] = [] if calls is None else calls
        self.starts: list[GangRecord] = []
        self.live: list[SimGang] = []
        self.max_in_flight = 0
        self.shut_down = False
        self._in_flight: set[str] = set()
        self._failures: list[_Failure] = []

    def _record(self, method: str, *args: Any) -> None:
        self.calls.append(("runner", method, *args))

    # --- test controls and views -----------------------------------------------------------
    def fail(self, trial: str, at_step: int, times: int = 1, lose_instance: bool = False) -> None:
        """The chunk of ``trial`` that would reach ``at_step`` fails ``times`` times, as a lost
        gang does; with ``lose_instance`` the cluster also loses the gang's first instance."""
        self._failures.append(_Failure(trial, at_step, times, lose_instance))

    def called(self, method: str) -> list[tuple[Any, ...]]:
        """The arguments of every call of ``method``."""
        return [c[2:] for c in self.calls if c[:2] == ("runner", method)]

    def gangs_of(self, trial: str) -> list[GangRecord]:
        return [g for g in self.starts if g.trial == trial]

    def gpus_in_use(self) -> dict[str, float]:
        """GPUs held per instance: 1 per worker, ``1/k`` per packed one."""
        used: dict[str, float] = {}
        for gang in self.live:
            for inst in gang.instances:
                used[inst] = used.get(inst, 0) + 1 / gang.share
        return used

    def packed_on(self) -> dict[tuple[str, int], list[str]]:
        """The trials of the live packed gangs, by (instance, GPU index)."""
        out: dict[tuple[str, int], list[str]] = {}
        for gang in self.live:
            if gang.share > 1:
                for inst, g in zip(gang.instances, gang.gpus or ()):
                    out.setdefault((inst, g), []).append(gang.trial)
        return out

    def _redo(self, gang: SimGang, stage: int) -> int:
        if self.checkpoint_every is None:
            return 0
        done = gang.step // self.steps_per_iter
        return done if self.checkpoint_every == "never" else done % int(self.checkpoint_every)

    def _iter_s(self, gang: SimGang) -> float:
        base = (self.fused_iter_s[gang.share] if gang.fused else
                self.packed_iter_s[gang.share] if gang.share > 1 else self.iter_s[len(gang.instances)])
        return base * self.pace(gang.step)

    # --- the port --------------------------------------------------------------------------
    def warm(self, nodes: Sequence[Node], trials_per_gpu: int = 1) -> float:
        self._record("warm", [n.name for n in nodes], trials_per_gpu)
        return 0.0

    def release_instance(self, instance: str) -> None:
        self._record("release_instance", instance)
        busy = [g.trial for g in self.live if instance in g.instances]
        if busy:
            raise AssertionError(f"{instance} released while gangs of {busy} still run on it")

    def forget_dead(self, alive: Sequence[str]) -> None:
        self._record("forget_dead", list(alive))
        for gang in [g for g in self.live if any(i not in alive for i in g.instances)]:
            self.live.remove(gang)
            gang.alive = False

    def shutdown(self) -> None:
        self._record("shutdown")
        self.shut_down = True

    def start(self, trial: str, config: dict[str, Any], instances: Sequence[str], checkpoint: bytes | None,
              trials_per_gpu: int = 1, gpus: Sequence[int] | None = None, fused: bool = False) -> SimGang:
        self._record("start", trial, tuple(instances))
        step = decode_checkpoint(checkpoint)["step"] if checkpoint is not None else 0
        if trials_per_gpu > 1 and (len(instances) != 1 or not gpus or len(gpus) != 1):
            raise AssertionError(f"packed start of {trial}: one instance and its GPU index expected, "
                                 f"got {list(instances)} and {gpus}")
        gang = SimGang(trial, tuple(instances), trials_per_gpu, tuple(gpus or ()), config=dict(config), step=step,
                       fused=fused)
        self.live.append(gang)
        over = {i: n for i, n in self.gpus_in_use().items() if n > self.G + 1e-9}
        if over:
            raise AssertionError(f"instance GPUs over-subscribed starting {trial} on {list(instances)}: {over}")
        crowded = {s: t for s, t in self.packed_on().items() if len(t) > trials_per_gpu or s[1] >= self.G}
        if trials_per_gpu > 1 and crowded:
            raise AssertionError(f"a GPU over-packed starting {trial}: {crowded}")
        self.starts.append(GangRecord(trial, gang.instances, len(gang.instances), step, checkpoint, self.clock.now(),
                                      trials_per_gpu, gang.gpus or (), fused))
        return gang

    def reassign(self, gang: SimGang, trial: str, config: dict[str, Any], checkpoint: bytes | None) -> SimGang:
        self._record("reassign", gang.trial, trial)
        gang.trial, gang.config, gang.resumed = trial, dict(config), True
        gang.step = decode_checkpoint(checkpoint)["step"] if checkpoint is not None else 0
        return gang

    def train(self, gang: SimGang, iters: int) -> SimChunk:
        if not gang.alive:
            raise AssertionError(f"train on a stopped gang of {gang.trial}")
        self._in_flight.add(gang.trial)
        self.max_in_flight = max(self.max_in_flight, len(self._in_flight))
        return super().train(gang, iters)

    def result(self, chunk: SimChunk) -> TrainResult:
        gang = chunk.gang
        self._in_flight.discard(chunk.trial)
        new_step = gang.step + chunk.done * self.steps_per_iter
        for f in self._failures:
            if f.trial == chunk.trial and f.times > 0 and gang.step < f.step <= new_step:
                f.times -= 1
                if f.lose_instance and self.cluster is not None:
                    self.cluster.lose(gang.instances[0])
                raise ProviderError(f"injected failure: the gang of {chunk.trial} was lost before step {f.step}")
        if self.cluster is not None and any(i not in self.cluster.alive for i in gang.instances):
            raise ProviderError(f"the gang of {chunk.trial} lost its instance")
        gang.step = new_step
        return TrainResult(step=new_step, iter_times=[chunk.iter_s] * chunk.done,
                           metrics=self.metrics(gang.config, new_step),
                           checkpoint=encode_checkpoint(chunk.trial, new_step), redone=chunk.redone)

    def chunk_iters(self, left: int) -> int:
        return 1          # each iteration a chunk, ending in a checkpoint, as on a real cluster

    def stop(self, gang: SimGang) -> None:
        self._record("stop", gang.trial)
        if gang in self.live:
            self.live.remove(gang)
        gang.alive = False


@dataclass
class Fakes:
    """A clock, a cluster and a runner wired together, sharing one call log."""

    clock: FakeClock
    cluster: FakeCluster
    runner: FakeRunner

    @property
    def calls(self) -> list[tuple[Any, ...]]:
        return self.cluster.calls


def make_fakes(gpus_per_instance: int, iter_s: Mapping[int, float], provision_s: float = 0.0, init_s: float = 0.0,
               steps_per_iter: int = 1, start: float = 1000.0, pace: Callable[[int], float] | None = None,
               packed_iter_s: Mapping[int, float] | None = None, fused_iter_s: Mapping[int, float] | None = None,
               checkpoint_every: int | str | None = None) -> Fakes:
    """A clock, a cluster and a runner that share the clock and the call log (the runner
    sees instances the cluster loses)."""
    clock = FakeClock(start)
    calls: list[tuple[Any, ...]] = []
    cluster = FakeCluster(clock, gpus_per_instance, provision_s, init_s, calls=calls)
    runner = FakeRunner(clock, iter_s, gpus_per_instance, steps_per_iter, cluster=cluster, calls=calls, pace=pace,
                        packed_iter_s=packed_iter_s, fused_iter_s=fused_iter_s, checkpoint_every=checkpoint_every)
    return Fakes(clock, cluster, runner)
