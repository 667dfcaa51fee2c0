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
    StartTrial,
    StopTrial,
    SyncDone,
    TrainFinished,
    TrialFailed,
)
from rubberband.scheduler.replan import Replan, Replanner
from rubberband.scheduler.scheduler import Scheduler, TrialInfo

__all__ = ["Decision", "Event", "InstanceLost", "InstanceReady", "JobDone", "ReclaimNotice", "ReleaseInstances",
           "Replan", "Replanner", "RequestInstances", "ResizeTrial", "RunSync", "Scheduler", "StartTrial", "StopTrial", "SyncDone",
           "TrainFinished", "TrialFailed", "TrialInfo"]
