"""The executor's ports: what the control loop needs from a cluster and a trial runner.

The driver (``driver.py``) only talks to these protocols, so the same control loop runs
against in-process fakes in unit tests (``rubberband.testing.fakes``), a local Ray cluster,
and EC2.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from rubberband.errors import ProviderError
from rubberband.nodes import NodeType

# What the driver asks the cluster for: how many instances of each node type (an instance
# type on a market). Several instance types per stage fit the same shape.
Request = Mapping[NodeType, int]


@dataclass(frozen=True)
class Node:
    """A ready instance: its name (also the Ray resource that pins bundles to it), GPUs and type."""

    name: str
    gpus: int
    node_type: NodeType | None = None


@dataclass(frozen=True)
class Notice:
    """A spot interruption notice: ``instance`` will be reclaimed at ``reclaim_at`` (clock time).

    ``node_type``: given by a cluster that notices instances still initialising (the ``sim``
    backend): the driver names such an instance at once after a requested one of its type, so
    its replacement is asked at the notice (DESIGN §4.1), and reports it ready from the
    cluster's ``ready`` event."""

    instance: str
    reclaim_at: float
    node_type: NodeType | None = None


@dataclass
class TrainResult:
    """What one trial reports after a chunk of iterations."""

    step: int
    iter_times: list[float]
    metrics: dict[str, float]
    checkpoint: bytes | None = None
    digests: list[list[float]] | None = None     # per rank: parameter sum, sum of squares, step
    gpu_ids: list[list[str]] | None = None       # per rank: the GPU(s) it trained on (Ray's ids on its node)
    redone: int = 0      # iterations trained again first: a function trainable resumed from an older checkpoint


class Clock(Protocol):
    """The driver's time: ``now`` in seconds (any origin); ``sleep`` to let time pass while it
    waits for a cluster to notice something (a virtual clock just moves on); ``submit`` to run
    slow work (a re-plan) off the driver's loop — on the wall clock in a worker thread, on a
    virtual clock at once, at the same instant (deterministic)."""

    def now(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...
    def submit(self, work: Callable[[], Any]) -> Future: ...


def done_now(work: Callable[[], Any]) -> Future:
    """``work()`` run at once, as a finished ``Future`` (what a virtual clock's ``submit`` returns)."""
    future: Future = Future()
    try:
        future.set_result(work())
    except BaseException as exc:       # handed to whoever reads the result, as a worker thread would
        future.set_exception(exc)
    return future


class WallClock:
    """The real clock, for runs on real clusters; ``submit`` runs work on one worker thread."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(seconds, 0.0))

    def submit(self, work: Callable[[], Any]) -> Future:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rubberband-replan")
        return self._pool.submit(work)


class VirtualClock:
    """Virtual time, for rehearsals (the ``sim`` backend) and unit tests: ``now`` moves only when
    told (``advance``, ``advance_to``, ``sleep``), and what a port scheduled with ``call_at``
    happens as time passes it, in time order (ties: in the order scheduled); ``next_at`` says
    when the next thing is due, so a port that waits can stop there. ``submit`` runs work at
    once, at this very instant (deterministic)."""

    def __init__(self, start: float = 0.0):
        self.t = float(start)
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.advance(max(seconds, 0.0))

    def submit(self, work: Callable[[], Any]) -> Future:
        return done_now(work)

    def call_at(self, at: float, happen: Callable[[], None]) -> None:
        """Run ``happen()`` when time reaches ``at`` (at once if it has)."""
        heapq.heappush(self._due, (float(at), next(self._seq), happen))

    def next_at(self) -> float:
        """When the next scheduled happening is due (``inf``: none)."""
        return self._due[0][0] if self._due else math.inf

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        return self.advance_to(self.t + seconds)

    def advance_to(self, at: float) -> float:
        """Move to ``at`` (never back), running every happening due by then at its own time."""
        while self._due and self._due[0][0] <= at:
            when, _, happen = heapq.heappop(self._due)
            self.t = max(self.t, when)
            happen()
        self.t = max(self.t, at)
        return self.t


class ChunkInterrupted(ProviderError):
    """A chunk of iterations cut short by the loss of an instance, after ``done`` (its completed,
    checkpointed iterations; ``None``: none). A runner that trains several iterations per chunk
    (a virtual one: ``TrialRunnerPort.chunk_iters``) raises it so that the driver keeps them."""

    def __init__(self, message: str, done: TrainResult | None = None):
        super().__init__(message)
        self.done = done


class ClusterPort(Protocol):
    """Grows and shrinks the set of instances, by node type; nodes are listed oldest first.

    ``scale_to`` asks for instances by node type; ``wait_nodes`` waits until exactly that
    many usable ones of each type are ready (and raises ``ProviderError`` after ``timeout_s``
    seconds), or, given ``until`` (a time on the driver's clock), returns ``None`` once that
    time comes with the request not met yet: the driver wakes its scheduler then and waits
    again, perhaps for another request. ``release_to`` keeps the named instances and
    releases every other one (the request drops to what is kept); ``release`` lets named
    instances go without changing the request. ``notices`` returns spot interruption notices
    received since the last call; ``replace`` requests one more instance of a noticed
    instance's type at once and stops counting the noticed one as usable (``nodes`` no longer
    lists it; ``doomed`` lists noticed instances still up), so provisioning overlaps the
    notice window (DESIGN §4.1).
    """

    def scale_to(self, request: Request, stage: int) -> None: ...
    def wait_nodes(self, request: Request, timeout_s: float, until: float | None = None,
                   extra: Request | None = None) -> list[Node] | None: ...
    def release_to(self, keep: Sequence[str], stage: int) -> None: ...
    def release(self, instances: Sequence[str], stage: int) -> None: ...
    def nodes(self) -> list[Node]: ...
    def notices(self) -> list[Notice]: ...
    def doomed(self) -> list[str]: ...
    def replace(self, instance: str) -> None: ...
    def shutdown(self) -> None: ...
    def events(self) -> list[dict[str, Any]]: ...


class TrialRunnerPort(Protocol):
    """Starts gangs of workers on given instances, trains them, and stops them.

    A gang exposes ``instances`` (the instance of each worker); ``reassign`` hands a running
    gang to another trial of the same size on the same instances (actor reuse). A packed
    stage (``trials_per_gpu`` k > 1) starts 1-GPU trials that take ``1/k`` of the GPU serving
    the scheduler's GPU index ``gpus[0]`` on their instance; ``warm`` readies workers of the
    stage's share. A fused stage (``fused``, DESIGN §4.5) starts its trials ``trials_per_gpu`` to
    a GPU as members of one program on that GPU's one worker: the runner trains the members
    that asked for a chunk together, as one group.

    ``restarts_each_stage``: the runner hosts function trainables (DESIGN §4, redone
    iterations), so a trial's TRAIN of a new stage restarts its function from the latest
    checkpoint it reported, as Ray Tune resumes a paused trial — also on a gang the driver
    keeps across the SYNC (the driver hands the gang back to its own trial with ``reassign``).
    The function then trains again what it trained since that checkpoint, which is what the
    model counts; a class trainer (``False``) resumes exactly and its kept gang trains on.

    Three hooks let a virtual runner (the ``sim`` backend) keep the model's time where a real
    cluster's time is real: ``begin_train`` says a trial's TRAIN of stage ``stage`` starts (or
    resumes) on a gang (a virtual runner draws its iteration latency and owes its start-up);
    ``chunk_iters`` how many of the ``left`` iterations to train in one chunk (a real runner:
    1, each iteration ending in a checkpoint; a virtual one: all, ending the chunk where the
    instance is reclaimed, as ``ChunkInterrupted``); ``sync_s`` how long a stage's SYNC takes
    beyond what the driver does (a real runner: 0).
    """

    restarts_each_stage: bool

    def start(self, trial: str, config: dict[str, Any], instances: Sequence[str], checkpoint: bytes | None,
              trials_per_gpu: int = 1, gpus: Sequence[int] | None = None, fused: bool = False) -> Any: ...
    def reassign(self, gang: Any, trial: str, config: dict[str, Any], checkpoint: bytes | None) -> Any: ...
    def train(self, gang: Any, iters: int) -> Any: ...
    def wait(self, pending: Sequence[Any], timeout_s: float) -> tuple[list[Any], list[Any]]: ...
    def result(self, future: Any) -> TrainResult: ...
    def stop(self, gang: Any) -> None: ...
    def warm(self, nodes: Sequence[Node], trials_per_gpu: int = 1) -> float: ...
    def release_instance(self, instance: str) -> None: ...
    def forget_dead(self, alive: Sequence[str]) -> None: ...
    def shutdown(self) -> None: ...
    def begin_train(self, gang: Any, stage: int) -> None: ...
    def chunk_iters(self, left: int) -> int: ...
    def sync_s(self, stage: int) -> float: ...
