"""Drive a ``Scheduler`` to the end the simplest way, for its unit tests: apply its decisions in
order, in virtual time, and hand it back the events they cause.

Instances come up as soon as they are requested, a SYNC takes ``sync_s``, and a TRAIN either
finishes as soon as it starts (``train_s=None``) or takes ``train_s(decision)`` seconds, the
trials in flight finishing in time order. Nothing is lost or reclaimed; a re-plan
(``ComputeReplan``) is computed at once. The real backend is the executor's ``Driver``; this
one has no ports, so a test reads the decisions alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from rubberband.scheduler import (
    ComputeReplan,
    Decision,
    InstanceReady,
    ReplanReady,
    RequestInstances,
    RunSync,
    Scheduler,
    StartTrial,
    SyncDone,
    TrainFinished,
)


def by_number(trial: str, step: int) -> float:
    """A trial scores its number whatever its step (``t007`` scores 7.0): ranks fixed up front."""
    return float(trial[-3:])


def drive(scheduler: Scheduler, *, gpus: int | Mapping[str, int] = 4,
          metric: Callable[[str, int], float] = by_number, train_s: Callable[[StartTrial], float] | None = None,
          tick_s: float = 1.0, sync_s: float = 0.0, now: float = 0.0, running: Sequence[StartTrial] = (),
          steps: Mapping[str, int] | None = None) -> list[Decision]:
    """Start ``scheduler`` at ``now`` and apply its decisions until none is left; return them all,
    in the order applied.

    Args:
        gpus: the GPUs of each instance, or of each instance type by name.
        metric: what a trial scores at a step.
        train_s: how long a ``StartTrial`` trains; ``None``: it finishes as soon as it starts.
        tick_s: the time applying each decision takes (the clock advances by it first).
        sync_s: the time a SYNC takes.
        running: for a scheduler already started: the TRAINs it started that are still running
            (they finish first, one a tick, or after their ``train_s``); nothing is started then.
        steps: the step each trial is at before this call (the backend's record; default 0).
    """
    trained = dict(steps or {})               # what a backend knows: the step each trial is trained to
    in_flight: dict[str, float] = {}          # trial -> when its TRAIN ends (train_s given)
    pending: list[Decision] = []
    log: list[Decision] = []

    def train(d: StartTrial) -> None:
        nonlocal pending
        trained[d.trial] = trained.get(d.trial, 0) + d.iters
        if train_s is None:
            pending += scheduler.on(TrainFinished(d.trial, trained[d.trial], metric(d.trial, trained[d.trial])), now)
        else:
            in_flight[d.trial] = now + train_s(d)

    if running:
        for started in running:
            now += tick_s if train_s is None else 0.0
            train(started)
    else:
        pending = list(scheduler.start(now))
    while pending or in_flight:
        if not pending:
            trial, now = min(in_flight.items(), key=lambda kv: kv[1])
            del in_flight[trial]
            pending += scheduler.on(TrainFinished(trial, trained[trial], metric(trial, trained[trial])), now)
            continue
        d = pending.pop(0)
        log.append(d)
        now += tick_s
        if isinstance(d, RequestInstances):
            g = gpus if isinstance(gpus, int) else gpus[d.instance_type]
            for name in d.names:
                pending += scheduler.on(InstanceReady(name, g, now), now)
        elif isinstance(d, StartTrial):
            train(d)
        elif isinstance(d, RunSync):
            now += sync_s
            pending += scheduler.on(SyncDone(d.stage), now)
        elif isinstance(d, ComputeReplan):            # off the loop in a real run; here at once
            pending += scheduler.on(ReplanReady(d.token, d.compute()), now)
    return log


__all__ = ["by_number", "drive"]
