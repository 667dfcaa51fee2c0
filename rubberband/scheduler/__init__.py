"""The scheduler: one pure decision-maker for SHA and HyperBand jobs over real or simulated clusters."""

from rubberband.scheduler.events import (
    ComputeReplan,
    Decision,
    Event,
    InstanceLost,
    InstanceReady,
    JobDone,
    ReclaimNotice,
    ReleaseInstances,
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
from rubberband.scheduler.safety import Budget, SafetyNet
from rubberband.scheduler.scheduler import (
    MAX_TRIAL_RESTARTS,
    Scheduler,
    is_superseded,
    is_target_trial,
    surrogate_winner,
    target_trial,
)

__all__ = ["MAX_TRIAL_RESTARTS", "Budget", "ComputeReplan", "Decision", "Event", "InstanceLost", "InstanceReady", "JobDone",
           "ReclaimNotice", "ReleaseInstances", "Replan", "ReplanReady", "Replanner", "RequestInstances", "ResizeTrial",
           "RetireInstances", "RunSync", "SafetyNet", "SafetySwitch", "Scheduler", "SchedulerReport", "StageEnded",
           "StageFollowed", "StageStarted", "StartTrial", "StopTrial", "SyncDone", "Tick", "TrainFinished",
           "TrialCheckpoint", "TrialFailed", "TrialRecord", "Wake", "is_superseded", "is_target_trial", "surrogate_winner", "target_trial"]
