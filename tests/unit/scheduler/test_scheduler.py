"""The scheduler with no Ray and no simulator: scripted event streams in, decisions out."""

from __future__ import annotations

import math

import pytest

from rubberband import CloudProfile, ExperimentSpec, Market, SpecError
from rubberband.errors import ProviderError
from rubberband.plan import plan_allocation
from rubberband.scheduler import (
    InstanceLost,
    InstanceReady,
    JobDone,
    ReclaimNotice,
    ReleaseInstances,
    RequestInstances,
    ResizeTrial,
    RunSync,
    Scheduler,
    StartTrial,
    StopTrial,
    SyncDone,
    TrainFinished,
    TrialFailed,
)
from rubberband.testing.builders import cloud_profile, model_profile, spot_market
from rubberband.testing.drive import drive

MODEL = model_profile({g: 10.0 / g for g in (1, 2, 4, 8)}, startup_s=1.0, sync_s=1.0, name="m")


def cloud(market: str = "on-demand", G: int = 4) -> CloudProfile:  # noqa: N803 - the paper's symbol
    return cloud_profile("p3.8xlarge", G, 12.0, spot_price_usd_per_hour=4.0, market=market, provision_s=5, init_s=5,
                         spot=spot_market(1.0, notice_s=120) if market == "spot" else None)


def make_plan(spec: ExperimentSpec, allocation, market: str = "on-demand", instances=None):
    return plan_allocation(spec, allocation, MODEL, cloud(market), 3600.0, instances=instances, samples=4)


def of(log, kind):
    return [d for d in log if isinstance(d, kind)]


def test_a_sha_job_runs_end_to_end_promoting_the_best_half():
    spec = ExperimentSpec.sha(8, 1, 4, eta=2)
    plan = make_plan(spec, [8] * spec.num_stages())
    sched = Scheduler(plan, mode="min")
    log = drive(sched)
    # metric = trial number, minimised: t000.. are best; each SYNC keeps the first n_{i+1}.
    for i in range(spec.num_stages()):
        started = [d.trial for d in of(log, StartTrial) if d.stage == i]
        assert started == [f"t{j:03d}" for j in range(spec.stages[i].num_trials)]
        assert {d.iters for d in of(log, StartTrial) if d.stage == i} == {spec.stages[i].iters}
    eliminated = [d.trial for d in of(log, StopTrial) if d.eliminated]
    assert sorted(eliminated) == [f"t{j:03d}" for j in range(8)]        # everyone stops at the end
    assert of(log, JobDone) == [JobDone("t000")]
    assert sched.report().trials["t000"].step == 4                             # trained to max_iters
    assert sched.report().trials["t007"].eliminated_after == 0
    # Instances: the plan's counts requested, everything released by the end.
    requested = [n for d in of(log, RequestInstances) for n in d.names]
    released = [n for d in of(log, ReleaseInstances) for n in d.names]
    assert len(requested) == max(plan.instances) and sorted(released) == sorted(requested)


def test_promotion_is_a_stable_sort_and_a_nan_metric_ranks_last():
    spec = ExperimentSpec.from_stages([(4, 1), (2, 1)])
    values = {"t000": math.nan, "t001": 0.5, "t002": 0.5, "t003": 0.9}
    sched = Scheduler(make_plan(spec, [4, 2]), mode="max")
    log = drive(sched, metric=lambda trial, step: values[trial])
    second = [d.trial for d in of(log, StartTrial) if d.stage == 1]
    assert second == ["t003", "t001"]           # 0.9, then the first of the two 0.5s; NaN last
    assert sched.report().best == "t003"


def test_a_hyperband_job_runs_each_bracket_with_its_own_trials():
    spec = ExperimentSpec.chain(ExperimentSpec.hyperband(1, 9, eta=3))
    plan = make_plan(spec, [s.num_trials for s in spec.stages])
    sched = Scheduler(plan, mode="min")
    log = drive(sched)
    for b, start in enumerate(spec.bracket_starts):
        first = [d.trial for d in of(log, StartTrial) if d.stage == start]
        assert first == [f"b{b}-t{j:03d}" for j in range(spec.stages[start].num_trials)]
    # A bracket's trials all stop at its last SYNC, before the next bracket starts any.
    for b, start in enumerate(spec.bracket_starts[1:], 1):
        first_start = log.index(next(d for d in of(log, StartTrial) if d.stage == start))
        stops = [i for i, d in enumerate(log) if isinstance(d, StopTrial) and d.trial.startswith(f"b{b - 1}-")]
        assert max(stops) < first_start
    # The winner trained longest (bracket 0 goes furthest) and is best among those.
    most = max(t.step for t in sched.report().trials.values())
    assert sched.report().best_trial.step == most
    assert of(log, JobDone)[0].best == sched.report().best


def test_queued_trials_take_the_gpus_of_finished_ones():
    spec = ExperimentSpec.from_stages([(6, 1), (1, 1)])
    plan = make_plan(spec, [2, 1])                   # 6 trials on 2 GPUs: one at a time per GPU
    sched = Scheduler(plan)
    events = sched.start(0.0)
    (request,) = of(events, RequestInstances)
    out = sched.on(InstanceReady(request.names[0], 4, 5.0), 10.0)
    assert [d.trial for d in out] == ["t000", "t001"]
    out = sched.on(TrainFinished("t001", 1, 0.3), 20.0)
    assert out == [StartTrial("t002", 0, sched._placement["t002"], 1)]
    assert "t001" not in sched._placement and len(sched._placement["t002"]) == 1


def test_a_sync_packs_survivors_onto_the_oldest_instances_then_releases_the_newest():
    spec = ExperimentSpec.from_stages([(4, 1), (2, 1)])
    plan = make_plan(spec, [16, 8])                  # 4 GPUs/trial on 4 instances, then 2 instances
    sched = Scheduler(plan, mode="min")
    (request,) = of(sched.start(0.0), RequestInstances)
    assert request.names == ("i000", "i001", "i002", "i003") and request.market is Market.ON_DEMAND
    starts = []
    for k, name in enumerate(request.names):
        starts += sched.on(InstanceReady(name, 4, 1.0), 2.0 + k)
    on = {d.trial: d.slots[0][0] for d in starts}
    # The two best run on the two newest instances.
    ranks = {trial: 1.0 if on[trial] in ("i002", "i003") else 2.0 for trial in on}
    out = []
    for trial in on:
        out += sched.on(TrainFinished(trial, 1, ranks[trial]), 10.0)
    assert out[-1] == RunSync(0)
    out = sched.on(SyncDone(0), 11.0)
    moves = of(out, ResizeTrial)
    assert sorted(m.trial for m in moves) == sorted(t for t in on if on[t] in ("i002", "i003"))
    assert {m.slots[0][0] for m in moves} == {"i000", "i001"}
    assert of(out, ReleaseInstances) == [ReleaseInstances(("i003", "i002"), 0)]
    assert out.index(moves[-1]) < out.index(of(out, ReleaseInstances)[0])     # pack first
    # Stage 1 needs no new instance: the survivors start at once, where they were moved.
    assert [(d.trial, d.slots) for d in of(out, StartTrial)] == [(m.trial, m.slots) for m in moves]


def test_a_reclaim_notice_requests_a_replacement_and_the_trial_resumes_on_it():
    spec = ExperimentSpec.from_stages([(2, 10)])
    plan = make_plan(spec, [8], market="spot")       # 4 GPUs/trial: one spot instance each
    sched = Scheduler(plan)
    (request,) = of(sched.start(0.0), RequestInstances)
    assert request.market is Market.SPOT
    starts = sched.on(InstanceReady("i000", 4, 1.0), 3.0) + sched.on(InstanceReady("i001", 4, 1.0), 3.0)
    victim = next(d.trial for d in starts if d.slots[0][0] == "i001")
    out = sched.on(ReclaimNotice("i001"), 50.0)
    assert out == [RequestInstances(("i001.1",), "p3.8xlarge", Market.SPOT, 0, replaces="i001")]
    # Lost with 4 of 10 iterations checkpointed: nothing else has room, so it waits.
    assert sched.on(InstanceLost("i001", {victim: 4}), 170.0) == []
    out = sched.on(InstanceReady("i001.1", 4, 60.0), 171.0)
    assert out == [StartTrial(victim, 0, tuple(("i001.1", g) for g in range(4)), 6)]


def test_an_instance_lost_without_notice_is_replaced_too_and_a_failed_gang_restarts():
    spec = ExperimentSpec.from_stages([(2, 10)])
    plan = make_plan(spec, [8], market="spot")
    sched = Scheduler(plan)
    sched.start(0.0)
    starts = sched.on(InstanceReady("i000", 4, 1.0), 3.0) + sched.on(InstanceReady("i001", 4, 1.0), 3.0)
    trial = starts[0].trial
    out = sched.on(InstanceLost(starts[0].slots[0][0], {trial: 2}), 30.0)
    assert [type(d) for d in out] == [RequestInstances] and out[0].replaces == starts[0].slots[0][0]
    other = starts[1]
    out = sched.on(TrialFailed(other.trial, 7), 31.0)      # its instance lives: it restarts there
    assert out == [StartTrial(other.trial, 0, other.slots, 3)]


def test_new_trials_are_not_placed_on_a_noticed_instance():
    spec = ExperimentSpec.from_stages([(2, 1)])
    plan = make_plan(spec, [8], market="spot")
    sched = Scheduler(plan)
    sched.start(0.0)
    sched.on(InstanceReady("i000", 4, 1.0), 2.0)
    sched.on(ReclaimNotice("i001"), 2.5)                 # noticed before it was ever ready
    out = sched.on(InstanceReady("i001", 4, 1.0), 3.0)   # the scale-up is over: the stage starts
    assert [(type(d), d.slots[0][0]) for d in out] == [(StartTrial, "i000")]    # none on i001
    out = sched.on(InstanceReady("i001.1", 4, 3.0), 20.0)
    assert [(type(d), d.slots[0][0]) for d in out] == [(StartTrial, "i001.1")]


def test_events_out_of_turn_are_refused():
    sched = Scheduler(make_plan(ExperimentSpec.from_stages([(2, 1)]), [2]))
    sched.start(0.0)
    with pytest.raises(SpecError, match=r"SyncDone for stage 0, but stage 0 is scaling"):
        sched.on(SyncDone(0), 1.0)
    with pytest.raises(SpecError, match=r"start\(\) was already called"):
        sched.start(0.0)
    with pytest.raises(SpecError, match=r"mode: expected min or max, got 'best'"):
        Scheduler(sched._plan, mode="best")


def test_a_gang_that_keeps_failing_on_live_instances_fails_the_job():
    spec = ExperimentSpec.from_stages([(1, 10)])
    sched = Scheduler(make_plan(spec, [4]))
    sched.start(0.0)
    (start,) = sched.on(InstanceReady("i000", 4, 1.0), 2.0)
    for k in range(3):
        assert sched.on(TrialFailed(start.trial, k), 10.0 + k) == [StartTrial(start.trial, 0, start.slots, 10 - k)]
    with pytest.raises(ProviderError, match=r"^trial t000: its gang failed 4 times on live instances"):
        sched.on(TrialFailed(start.trial, 3), 20.0)


def test_keep_warm_releases_nothing_at_the_end():
    spec = ExperimentSpec.from_stages([(4, 1), (2, 1)])
    warm = drive(Scheduler(make_plan(spec, [16, 8]), keep_warm=True))
    cold = drive(Scheduler(make_plan(spec, [16, 8])))
    assert [d.names for d in of(warm, ReleaseInstances)] == [("i003", "i002")]          # the scale-down only
    assert [d.names for d in of(cold, ReleaseInstances)] == [("i003", "i002"), ("i001", "i000")]
    assert of(warm, JobDone) == of(cold, JobDone)
