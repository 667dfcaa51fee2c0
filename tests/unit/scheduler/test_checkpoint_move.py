"""A trial on a noticed instance moves at its next checkpoint (``TrialCheckpoint``), not at the reclaim."""

from __future__ import annotations

from rubberband import ExperimentSpec, Market
from rubberband.scheduler import (
    InstanceReady,
    ReclaimNotice,
    ReleaseInstances,
    RequestInstances,
    Scheduler,
    StartTrial,
    TrialCheckpoint,
)
from tests.unit.scheduler.test_scheduler import make_plan


def started() -> tuple[Scheduler, StartTrial]:
    plan = make_plan(ExperimentSpec.from_stages([(2, 10)]), [8], market="spot")
    sched = Scheduler(plan)
    sched.start(0.0)
    starts = sched.on(InstanceReady("i000", 4, 1.0), 3.0) + sched.on(InstanceReady("i001", 4, 1.0), 3.0)
    victim = next(d for d in starts if d.slots[0][0] == "i001")
    out = sched.on(ReclaimNotice("i001"), 50.0)
    assert out == [RequestInstances(("i001.1",), "p3.8xlarge", Market.SPOT, 0, replaces="i001")]
    return sched, victim


def test_a_checkpoint_before_the_replacement_is_up_keeps_the_trial_where_it_is():
    sched, victim = started()
    assert sched.on(TrialCheckpoint(victim.trial, 4), 51.0) == []
    assert sched._placement[victim.trial] == victim.slots


def test_a_checkpoint_once_the_replacement_is_up_moves_the_trial_and_releases_the_noticed_instance():
    sched, victim = started()
    assert sched.on(InstanceReady("i001.1", 4, 55.0), 60.0) == []       # the trial still trains on i001
    out = sched.on(TrialCheckpoint(victim.trial, 4), 61.0)
    assert out == [StartTrial(victim.trial, 0, tuple(("i001.1", g) for g in range(4)), 6),
                   ReleaseInstances(("i001",), 0)]
    assert sched.on(TrialCheckpoint(victim.trial, 5), 62.0) == []      # on a good instance now: nothing to do
