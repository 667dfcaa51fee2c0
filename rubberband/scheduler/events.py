"""What the scheduler hears (events) and what it answers (decisions): plain frozen values.

A backend — the real driver over Ray, or the virtual-clock ``sim`` cluster — turns what
happens on its cluster into events, hands each to ``Scheduler.on`` with the time it happened,
and applies the decisions returned, in order. Instances and trials are named by the
scheduler; a backend maps its own node ids to those names. The clock is an event too: a
``Wake`` decision asks for a ``Tick`` at a time, for the checks that time alone can trigger
(the spot safety net's slack running out, the budget running out).

The decisions are the scheduler's whole API: a backend learns when a stage starts and ends
(``StageStarted``, ``StageEnded``: its shape as followed, re-plans included), which spot
instances the safety net retires (``RetireInstances``), and at the end reads one frozen
``SchedulerReport`` (``Scheduler.report()``): the trials, the stages as followed, the
re-plans, the switches and the budget. Nothing outside ``rubberband.scheduler`` reads the
scheduler's state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rubberband.placement import Slot
from rubberband.plan.plan import Plan
from rubberband.profiles.cloud import CloudProfile, Market
from rubberband.scheduler.replan import Replan
from rubberband.units import format_duration


# --- events ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class InstanceReady:
    """A requested instance is running and initialised (end of INIT_INSTANCE); it was
    launched — billed from — ``launched_s`` (the end of its SCALE)."""

    name: str
    gpus: int
    launched_s: float


@dataclass(frozen=True)
class ReclaimNotice:
    """The provider will reclaim this spot instance soon (AWS: two minutes); it still runs."""

    name: str


@dataclass(frozen=True)
class InstanceLost:
    """The instance is gone (reclaimed, or its node died). ``progress``: the trials that were
    training on it and the step each had checkpointed (they resume from there)."""

    name: str
    progress: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TrialFailed:
    """A trial's gang died while its instances live on; it resumes from checkpoint ``step``."""

    trial: str
    step: int


@dataclass(frozen=True)
class TrainFinished:
    """A trial trained the iterations its ``StartTrial`` asked for: now at ``step``, scoring ``metric``."""

    trial: str
    step: int
    metric: float


@dataclass(frozen=True)
class SyncDone:
    """The SYNC barrier the scheduler asked for (``RunSync``) is over: rank and move on."""

    stage: int


@dataclass(frozen=True)
class TrialCheckpoint:
    """A trial on an instance under a reclaim notice checkpointed mid-TRAIN, now at ``step``:
    a backend that checkpoints every iteration reports it so the trial can move off the
    doomed instance before the reclaim rather than lose the iteration in progress."""

    trial: str
    step: int


@dataclass(frozen=True)
class Tick:
    """The clock reached the time a ``Wake`` asked for (the safety net's or the budget's check)."""


Replanned = tuple[Plan, Replan] | None
"""What a re-plan (``ComputeReplan.compute``) returns: the new plan and its record, or ``None``
to keep the plan."""


@dataclass(frozen=True)
class ReplanReady:
    """The re-plan a ``ComputeReplan`` asked for is done: ``result`` is what its ``compute``
    returned (a new plan and its record, or ``None``: keep the plan)."""

    token: int
    result: Replanned = field(default=None, compare=False, repr=False)


Event = (InstanceReady | ReclaimNotice | InstanceLost | TrialFailed | TrainFinished | SyncDone | Tick
         | TrialCheckpoint | ReplanReady)


# --- decisions -------------------------------------------------------------------------------
@dataclass(frozen=True)
class RequestInstances:
    """Launch one instance per name on ``market`` (node type = instance type x market).

    The requests of one answer that are not replacements form one scale-up: one SCALE for
    all of them (DESIGN §4). ``replaces`` names the reclaimed instance a replacement stands in for.
    """

    names: tuple[str, ...]
    instance_type: str
    market: Market
    stage: int
    replaces: str | None = None


@dataclass(frozen=True)
class ReleaseInstances:
    """Terminate these instances, or cancel them if they are still being provisioned."""

    names: tuple[str, ...]
    stage: int


@dataclass(frozen=True)
class StartTrial:
    """Train ``trial`` for ``iters`` more iterations on ``slots`` (its gang: started, resumed
    from its checkpoint, or kept if it already runs there). A TRAIN node: start-up included.
    ``trials_per_gpu`` > 1: a packed stage, the one slot is shared by up to that many trials
    (each takes ``1/trials_per_gpu`` of the GPU); with ``fused``, the trials on the slot train
    as one program, a fused group of up to ``trials_per_gpu`` (DESIGN §4.5)."""

    trial: str
    stage: int
    slots: tuple[Slot, ...]
    iters: int
    trials_per_gpu: int = 1
    fused: bool = False


@dataclass(frozen=True)
class ResizeTrial:
    """Move an idle trial's gang to ``slots`` (checkpoint, restart there): packing at a SYNC;
    ``trials_per_gpu`` and ``fused`` as in ``StartTrial``."""

    trial: str
    slots: tuple[Slot, ...]
    trials_per_gpu: int = 1
    fused: bool = False


@dataclass(frozen=True)
class StageStarted:
    """Stage ``stage`` begins (before its requests, if it scales up): its shape as the scheduler
    follows it now (a re-plan may have changed it), the trials it runs and, with a budget,
    what is left of it."""

    stage: int
    trials: tuple[str, ...]
    iters: int
    gpus_per_trial: int
    trials_per_gpu: int
    instances: int
    spot_instances: int
    instance_type: str
    cloud: CloudProfile               # the profile of its instance type (prices, latencies, market)
    budget_left_usd: float | None = None
    fused: bool = False               # its trials train ``trials_per_gpu`` to a GPU as fused groups


@dataclass(frozen=True)
class StageEnded:
    """Stage ``stage`` is over (its SYNC, or the budget stopped the job in it): the trials it
    ran, those promoted to the next stage, the instances it held, and the budget left."""

    stage: int
    trials: tuple[str, ...]
    promoted: tuple[str, ...]
    instances: int
    spot_instances: int
    budget_left_usd: float | None = None
    at_s: float | None = None            # when it ended (its SYNC), on the events' clock


@dataclass(frozen=True)
class ComputeReplan:
    """Run ``compute()`` (the re-plan of the stages after ``stage``: a plan search, seconds of
    CPU) off the loop that watches instances and trials, and report ``ReplanReady(token,
    result)`` when it is done; a backend in virtual time runs it at once. At a SYNC the
    scheduler goes on to the next stage when the plan comes; at a reclaim it goes on training."""

    token: int
    stage: int
    compute: Callable[[], Replanned] = field(compare=False, repr=False)


@dataclass(frozen=True)
class RetireInstances:
    """The safety net moved off these spot instances: ask for them no more and do not wait for
    them (their trials finish their TRAIN there; a ``ReleaseInstances`` follows)."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class StopTrial:
    """Stop the trial's gang; ``eliminated``: it lost at a SYNC, else it waits for its next turn."""

    trial: str
    eliminated: bool


@dataclass(frozen=True)
class RunSync:
    """Every TRAIN of ``stage`` finished: run the SYNC barrier, then report ``SyncDone``."""

    stage: int


@dataclass(frozen=True)
class JobDone:
    """The last SYNC is over and every instance released; ``best`` is the winning trial.

    ``stopped``: the job stopped early, with every instance released and ``best`` the best
    trial so far (the budget ran out); this one-line reason says why."""

    best: str | None
    stopped: str | None = None


@dataclass(frozen=True)
class Wake:
    """Report a ``Tick`` at ``at_s`` (virtual or wall seconds, as ``now``); it replaces any
    earlier ``Wake`` not yet due. Nothing else happening by then may still call for a decision."""

    at_s: float


@dataclass(frozen=True)
class SafetySwitch:
    """The spot safety net moved stages ``first_stage..last_stage`` to on-demand (log it; the
    requests and releases it takes follow as their own decisions)."""

    at_s: float
    first_stage: int
    last_stage: int
    slack_s: float                   # deadline - now - the on-demand finish estimate
    needed_s: float                  # what the slack must cover: twice SCALE + INIT

    def line(self) -> str:
        """``safety net: 3m12s slack < 4m40s needed; stages 2-3 move to on-demand``"""
        stages = (f"stage {self.first_stage}" if self.first_stage == self.last_stage
                  else f"stages {self.first_stage}-{self.last_stage}")
        slack = ("-" if self.slack_s < 0 else "") + format_duration(abs(self.slack_s))
        return (f"safety net: {slack} slack < {format_duration(self.needed_s)} needed; "
                f"{stages} move to on-demand")

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "line": self.line()}


Decision = (RequestInstances | ReleaseInstances | StartTrial | ResizeTrial | StopTrial | RunSync | JobDone | Replan
            | Wake | SafetySwitch | StageStarted | StageEnded | RetireInstances | ComputeReplan)


# --- the report ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialRecord:
    """One trial at the end: its bracket, last checkpointed step and metric, the stage it was
    eliminated after (``None``: it was not), and one entry per TRAIN it finished
    (``stage``, ``step``, ``metric``, ``end_s``)."""

    id: str
    bracket: int
    step: int
    metric: float | None
    eliminated_after: int | None
    history: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class StageFollowed:
    """One stage as the scheduler followed it (re-plans and the safety net included)."""

    allocation: int
    instances: int
    spot_instances: int
    gpus_per_trial: int
    trials_per_gpu: int
    instance_type: str
    fused_per_gpu: int = 1


@dataclass(frozen=True)
class SchedulerReport:
    """What the scheduler decided, frozen at the time ``Scheduler.report()`` is called
    (normally after ``JobDone``): the best trial, why it stopped early (``None``: it did
    not), every trial, every stage as followed, the profile of each instance type it used,
    the re-plans, the safety net's switches and the budget (``None``: none)."""

    best: str | None
    stopped: str | None
    trials: Mapping[str, TrialRecord]
    stages: tuple[StageFollowed, ...]
    clouds: Mapping[str, CloudProfile]
    replans: tuple[Replan, ...]
    switches: tuple[SafetySwitch, ...]
    budget_usd: float | None
    budget_left_usd: float | None
    done: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "trials", MappingProxyType(dict(self.trials)))
        object.__setattr__(self, "clouds", MappingProxyType(dict(self.clouds)))

    @property
    def best_trial(self) -> TrialRecord | None:
        return self.trials[self.best] if self.best is not None else None
