"""The executor's ports: what the control loop needs from a cluster and a trial runner.

The driver (``driver.py``) only talks to these protocols, so the same control loop runs
against in-process fakes in unit tests (``rubberband.testing.fakes``), a local Ray cluster,
and EC2.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Node:
    """A ready instance: its name (also the Ray resource that pins bundles to it) and GPUs."""

    name: str
    gpus: int


@dataclass
class TrainResult:
    """What one trial reports after a chunk of iterations."""

    step: int
    iter_times: list[float]
    metrics: dict[str, float]
    checkpoint: bytes | None = None
    digests: list[list[float]] | None = None     # per rank: parameter sum, sum of squares, step


class Clock(Protocol):
    def now(self) -> float: ...


class ClusterPort(Protocol):
    """Grows and shrinks the set of instances; nodes are listed oldest first."""

    def scale_to(self, count: int, stage: int) -> None: ...
    def wait_nodes(self, count: int, timeout_s: float) -> list[Node]: ...
    def release_to(self, keep: Sequence[str], stage: int) -> None: ...
    def nodes(self) -> list[Node]: ...
    def shutdown(self) -> None: ...
    def events(self) -> list[dict[str, Any]]: ...


class TrialRunnerPort(Protocol):
    """Starts gangs of workers on given instances, trains them, and stops them.

    A gang exposes ``instances`` (the instance of each worker); ``reassign`` hands a running
    gang to another trial of the same size on the same instances (actor reuse).
    """

    def start(self, trial: str, config: dict[str, Any], instances: Sequence[str], checkpoint: bytes | None) -> Any: ...
    def reassign(self, gang: Any, trial: str, config: dict[str, Any], checkpoint: bytes | None) -> Any: ...
    def train(self, gang: Any, iters: int) -> Any: ...
    def wait(self, pending: Sequence[Any], timeout_s: float) -> tuple[list[Any], list[Any]]: ...
    def result(self, future: Any) -> TrainResult: ...
    def stop(self, gang: Any) -> None: ...
    def warm(self, nodes: Sequence[Node]) -> float: ...
    def release_instance(self, instance: str) -> None: ...
    def forget_dead(self, alive: Sequence[str]) -> None: ...
    def shutdown(self) -> None: ...
