"""The scheduler: one pure decision-maker for SHA and HyperBand jobs over real or simulated clusters."""

from rubberband.scheduler.events import (
    Decision,
    Event,
    InstanceLost,
    InstanceReady,
    JobDone,
    ReclaimNotice,
    ReleaseInstances,
    RequestInstances,
    ResizeTrial,
    RunSync,
    SafetySwitch,
    StartTrial,
    StopTrial,
    SyncDone,
    Tick,
    TrainFinished,
    TrialCheckpoint,
    TrialFailed,
    Wake,
)
from rubberband.scheduler.replan import Replan, Replanner
from rubberband.scheduler.safety import Budget, SafetyNet
from rubberband.scheduler.scheduler import Scheduler, TrialInfo

__all__ = ["Budget", "Decision", "Event", "InstanceLost", "InstanceReady", "JobDone", "ReclaimNotice",
           "ReleaseInstances", "Replan", "Replanner", "RequestInstances", "ResizeTrial", "RunSync", "SafetyNet",
           "SafetySwitch", "Scheduler", "StartTrial", "StopTrial", "SyncDone", "Tick", "TrainFinished", "TrialCheckpoint", "TrialFailed",
           "TrialInfo", "Wake"]
