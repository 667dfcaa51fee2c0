"""The spot safety net and the hard budget in the scheduler: scripted event streams, no simulator."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rubberband import ExperimentSpec, Market, SpecError
from rubberband.plan import plan_allocation
from rubberband.profiles.cloud import CloudProfile
from rubberband.scheduler import (
    InstanceLost,
    InstanceReady,
    JobDone,
    ReleaseInstances,
    RequestInstances,
    SafetyNet,
    SafetySwitch,
    Scheduler,
    StartTrial,
    StopTrial,
    SyncDone,
    Tick,
    TrainFinished,
    Wake,
)
from rubberband.scheduler.safety import Budget, check_budget
from rubberband.testing.builders import cloud_profile, model_profile
from tests.unit.scheduler.test_scheduler import MODEL, cloud, of

# SHA(4, 1, 2): 4 trials of 1 iteration, then 2. With MODEL (10 s an iteration on 1 GPU, 1 s
# start-up, 1 s SYNC, no variance) and SCALE = INIT = 5 s, on-demand from the start takes
# SCALE+INIT 10 + (1 + 10) + 1 + (1 + 10) + 1 = 34 s; the net needs 2 x 10 = 20 s of slack.
SPEC = ExperimentSpec.sha(4, 1, 2, eta=2)


def spot_plan(deadline: float, allocation=(4, 2), instances=None):
    return plan_allocation(SPEC, list(allocation), MODEL, cloud("spot"), deadline, instances=instances, samples=4)


def netted(plan, **kw) -> Scheduler:
    return Scheduler(plan, mode="min", safety_net=SafetyNet(MODEL, plan.cloud, plan.deadline_s), **kw)


def test_the_net_switches_to_on_demand_when_the_slack_runs_out_while_spot_waits_for_capacity():
    sched = netted(spot_plan(100.0))
    first = sched.start(0.0)
    (spot,) = of(first, RequestInstances)
    assert spot.market is Market.SPOT
    # slack 100 - 34 = 66 s: woken when it would be down to 20 s if nothing progressed.
    assert of(first, Wake) == [Wake(46.0)]
    # At 46 s the spot request still waits; the scale-up it waited for is over, so on-demand
    # would take 24 s: slack 30 s, not yet; woken again at 56 s.
    assert sched.on(Tick(), 46.0) == [Wake(56.0)]
    out = sched.on(Tick(), 56.0)
    switch = of(out, SafetySwitch)
    assert switch == [SafetySwitch(56.0, 0, 1, 20.0, 20.0)]
    assert switch[0].line() == "safety net: 20.0s slack < 20.0s needed; stages 0-1 move to on-demand"
    # The spot request is cancelled and the position asks for on-demand instead.
    assert of(out, ReleaseInstances) == [ReleaseInstances(spot.names, 0)]
    (od,) = of(out, RequestInstances)
    assert od.market is Market.ON_DEMAND and len(od.names) == 1
    # The stage starts on the on-demand instance; nothing asks for spot again.
    out = sched.on(InstanceReady(od.names[0], 4, 61.0), 66.0)
    assert {s.trial for s in of(out, StartTrial)} == {"t000", "t001", "t002", "t003"}
    assert [s.spot_instances for s in sched.report().stages] == [0, 0] and not of(sched.on(Tick(), 70.0), SafetySwitch)


def test_without_the_net_the_same_wait_only_waits():
    sched = Scheduler(spot_plan(100.0))
    assert not of(sched.start(0.0), Wake)
    assert sched.on(Tick(), 56.0) == []


def test_a_reclaim_that_eats_the_slack_retires_the_spot_instance_still_training():
    # Two spot instances of 2 GPUs hold stage 0 (4 trials on 1 GPU each).
    plan = spot_plan(62.0, instances=[2, 1])
    sched = netted(plan)
    (req,) = of(sched.start(0.0), RequestInstances)
    a, b = req.names
    out = sched.on(InstanceReady(a, 2, 5.0), 10.0) + sched.on(InstanceReady(b, 2, 5.0), 10.0)
    on_b = [s.trial for s in of(out, StartTrial) if s.slots[0][0] == b]
    assert len(on_b) == 2 and not of(out, SafetySwitch)
    # a is reclaimed 9 s into the TRAINs: its two trials start over, 11 s more each, and the
    # slack (62 - 19 - 11 - 1 - 11 - 1 = 19 s) no longer covers 20 s: the net switches.
    out = sched.on(InstanceLost(a, {}), 19.0)
    assert of(out, SafetySwitch) and [s.spot_instances for s in sched.report().stages] == [0, 0]
    # a's spot replacement, asked for before the switch, is cancelled; both positions go on-demand.
    (spot_again,) = [r for r in of(out, RequestInstances) if r.market is Market.SPOT]
    assert spot_again.replaces == a
    (od,) = [r for r in of(out, RequestInstances) if r.market is Market.ON_DEMAND]
    assert len(od.names) == 2
    assert of(out, ReleaseInstances) == [ReleaseInstances(spot_again.names, 0)]   # b trains on: kept for now
    out = sched.on(TrainFinished(on_b[0], 1, 0.5), 21.0)
    assert not of(out, ReleaseInstances) and not of(out, StartTrial)   # nothing new is placed on b
    out = sched.on(TrainFinished(on_b[1], 1, 0.6), 21.0)
    assert of(out, ReleaseInstances) == [ReleaseInstances((b,), 0)]


def test_a_request_the_budget_cannot_pay_stops_the_job_before_it_is_made():
    # One on-demand p3.8xlarge at $12/h bills at least 60 s: $0.20; $0.15 cannot pay it.
    plan = plan_allocation(SPEC, [4, 2], MODEL, cloud(), 100.0, samples=4)
    out = Scheduler(plan, budget_usd=0.15).start(0.0)
    assert not of(out, RequestInstances)
    (done,) = of(out, JobDone)
    assert done.best is None and done.stopped.startswith("budget: $0.1500 left of $0.1500 cannot pay the minimum charge")


def test_a_budget_running_out_mid_stage_stops_cleanly_with_everything_released():
    plan = plan_allocation(SPEC, [4, 2], MODEL, cloud(), 100.0, samples=4)
    sched = Scheduler(plan, budget_usd=0.30)
    first = sched.start(0.0)
    (req,) = of(first, RequestInstances)
    out = sched.on(InstanceReady(req.names[0], 4, 5.0), 10.0)
    assert len(of(out, StartTrial)) == 4
    assert sched.report().budget_left_usd == pytest.approx(0.30 - 0.20)      # the minimum charge so far
    # $0.30 at $12/h is 90 s from the launch at 5 s: woken (early, as if billing grew from
    # now) until two billing seconds are left, at 93 s.
    while not of(out, JobDone):
        (wake,) = of(out, Wake)
        at = wake.at_s
        out = sched.on(Tick(), at)
    assert at == pytest.approx(93.0)
    assert {s.trial for s in of(out, StopTrial)} == {"t000", "t001", "t002", "t003"}
    assert of(out, ReleaseInstances) == [ReleaseInstances(req.names, 0)]
    (done,) = of(out, JobDone)
    assert "budget: $0.29" in done.stopped and sched.report().done and sched.report().budget_left_usd >= 0


def test_bad_budgets_are_one_line_naming_the_flag():
    with pytest.raises(SpecError, match=r"--budget: expected a positive amount of dollars, got 0"):
        check_budget(0, SPEC, MODEL, cloud())
    # 6 trial-iterations of 10 GPU-seconds on 4-GPU instances: 15 instance-seconds, less than one
    # instance's 60 s minimum, at $4/h spot: $0.0667.
    with pytest.raises(SpecError, match=r"--budget: \$0\.0500 is below the cheapest possible run of this job, \$0\.0667"):
        check_budget(0.05, SPEC, MODEL, cloud("spot"))


def test_the_cheapest_run_is_a_lower_bound_the_plan_meets():
    # The minimum charge covers the instance's first 60 s, iterations included: the least a run
    # costs is the larger of the two, not their sum ($0.0833 for SPEC on spot, above a run that
    # trains all 6 trial-iterations on one instance within its first minute).
    assert check_budget(0.07, SPEC, MODEL, cloud("spot")) == 0.07
    # Iterations past the minimum: 2 x 10 trials x 2 iterations x 10 GPU-seconds = 400 GPU-seconds,
    # 100 s on a 4-GPU instance at $12/h = $0.3333, above the minimum ($0.20), and no plan is cheaper.
    spec, od = ExperimentSpec.from_stages([(20, 2)]), cloud_profile("p3.8xlarge", 4, 12.0)
    plan = plan_allocation(spec, [4], MODEL, od, 3600.0, samples=4)
    assert plan.predicted.mean_cost_usd >= 400 / 4 * 12.0 / 3600
    with pytest.raises(SpecError, match=r"\$0\.3333"):
        check_budget(0.33, spec, MODEL, od)
    assert check_budget(plan.predicted.mean_cost_usd, spec, MODEL, od) == plan.predicted.mean_cost_usd


def test_the_cheapest_run_prices_a_target_stage_by_the_target_profile():
    # SPEC's 60 GPU-seconds, then its winner trained 10 iterations at full width, 40 GPU-seconds
    # each (DESIGN §4.6): 460 GPU-seconds, 115 s on 4 GPUs at $12/h = $0.3833 (by the
    # surrogate's profile the target stage would be 100 GPU-seconds: $0.20, the minimum).
    target = model_profile({g: 40.0 / g for g in (1, 2, 4, 8)}, startup_s=1.0, sync_s=1.0, name="full")
    spec, od = SPEC.with_target(10), cloud_profile("p3.8xlarge", 4, 12.0)
    with pytest.raises(SpecError, match=r"\$0\.3833"):
        check_budget(0.30, spec, MODEL, od, target_model=target)
    assert check_budget(0.30, spec, MODEL, od) == 0.30


def test_the_budget_pays_a_stages_on_demand_and_spot_requests_together_or_stops():
    # Stage 0 on 2 on-demand and 2 spot 1-GPU instances: minimum charges 2 x $0.20 + 2 x $0.0667
    # = $0.5333. $0.45 pays either market's pair alone, not both: nothing is requested.
    plan = replace(plan_allocation(SPEC, [4, 2], MODEL, cloud("spot", G=1), 100.0, instances=[4, 2], samples=4),
                   spot_instances=(2, 1))
    out = Scheduler(plan, budget_usd=0.45).start(0.0)
    assert not of(out, RequestInstances)
    (done,) = of(out, JobDone)
    assert done.stopped == ("budget: $0.4500 left of $0.4500 cannot pay the minimum charge of "
                            "2 more p3.8xlarge (on-demand) and 2 more p3.8xlarge (spot): $0.5333")
    # $0.54 pays both pairs: all four are requested.
    out = Scheduler(plan, budget_usd=0.54).start(0.0)
    assert sorted((r.market.value, len(r.names)) for r in of(out, RequestInstances)) == [("on-demand", 2), ("spot", 2)]


def test_the_budget_prices_by_the_clouds_own_rule_and_refuses_spot_with_no_spot_price():
    od_only = CloudProfile.from_dict({"instance_type": "p3.8xlarge", "gpus_per_instance": 4, "price_usd_per_hour": 12.0})
    budget = Budget(cloud(), 10.0)
    assert budget.hourly(Market.SPOT) == 4.0 and budget.hourly(Market.ON_DEMAND) == 12.0
    # Billing a spot instance at the on-demand price (as the budget once did) hid a profile error.
    with pytest.raises(SpecError, match=r"market: spot asked of p3\.8xlarge, which has no spot_price_usd_per_hour"):
        Budget(od_only, 10.0).hourly(Market.SPOT)


def unmodelled_spot() -> CloudProfile:
    """``cloud("spot")`` with no preemption model: its spot instances are never reclaimed."""
    data = cloud("spot").to_dict()
    data.pop("spot", None)
    return CloudProfile.from_dict(data)


def test_spot_that_cannot_be_reclaimed_and_comes_in_time_never_switches_however_short_the_slack():
    # Deadline 40 s: 6 s of on-demand slack, under the 20 s the net needs, from the start.
    plan = plan_allocation(SPEC, [4, 2], MODEL, unmodelled_spot(), 40.0, samples=4)
    assert not plan.cloud.spot.at_risk and plan.spot_counts[0] > 0
    sched = netted(plan)
    first = sched.start(0.0)
    assert not of(first, SafetySwitch)
    (spot,) = of(first, RequestInstances)
    assert spot.market is Market.SPOT
    # Woken only for the request's capacity wait (two replacement delays), which never comes due.
    assert of(first, Wake) == [Wake(20.0)]
    out = sched.on(InstanceReady(spot.names[0], 4, 5.0), 10.0)
    assert len(of(out, StartTrial)) == 4 and not of(out, SafetySwitch)
    assert not of(sched.on(Tick(), 20.0), SafetySwitch) and not sched.report().switches


def test_unmodelled_spot_that_waits_for_capacity_moves_to_on_demand():
    """A profile with no preemption model (the shipped AWS regions) still has spot requests the
    cloud may never grant: a wait of two replacement delays arms the net like a reclaim does
    (it waited until the node timeout failed the run)."""
    plan = plan_allocation(SPEC, [4, 2], MODEL, unmodelled_spot(), 40.0, samples=4)
    sched = netted(plan)
    (spot,) = of(sched.start(0.0), RequestInstances)
    out = sched.on(Tick(), 20.0)
    assert of(out, SafetySwitch) and of(out, ReleaseInstances) == [ReleaseInstances(spot.names, 0)]
    (od,) = of(out, RequestInstances)
    assert od.market is Market.ON_DEMAND and [s.spot_instances for s in sched.report().stages] == [0, 0]


def test_the_net_on_reclaimable_spot_waits_for_spot_to_cost_time_before_switching():
    sched = netted(spot_plan(40.0))       # slack short from the start, but nothing went wrong yet
    first = sched.start(0.0)
    assert not of(first, SafetySwitch)
    (spot,) = of(first, RequestInstances)
    # Woken when the request would count as waiting for capacity: two replacement delays.
    assert of(first, Wake) == [Wake(20.0)]
    out = sched.on(InstanceReady(spot.names[0], 4, 5.0), 10.0)
    assert not of(out, SafetySwitch) and len(of(out, StartTrial)) == 4
    # The first reclaim arms it: the slack is short, so the rest goes to on-demand.
    out = sched.on(InstanceLost(spot.names[0], {}), 15.0)
    assert of(out, SafetySwitch) and [s.spot_instances for s in sched.report().stages] == [0, 0]


def test_the_net_prices_a_surrogate_jobs_target_stage_by_the_target_profile():
    # SPEC, then the winner trained 2 iterations at full width: 40 s an iteration on 1 GPU, not
    # the surrogate's 10 (DESIGN §4.6). On-demand from the start: 10 + 11 + 1 + 11 + 1 + (1 + 80)
    # + 1 = 116 s; with a 200 s deadline and 20 s needed the net wakes at 64 s. Priced by the
    # surrogate's profile the target stage would take 22 s, T_od 56 s, and the net would wake at
    # 124 s, after the spot plan could no longer move to on-demand in time.
    target = model_profile({g: 40.0 / g for g in (1, 2, 4, 8)}, startup_s=1.0, sync_s=1.0, name="full")
    spec = SPEC.with_target(2)
    plan = plan_allocation(spec, [4, 2, 1], MODEL, cloud("spot"), 200.0, samples=4, target_model=target)
    net = SafetyNet(MODEL, plan.cloud, plan.deadline_s, target_model=target)
    assert of(Scheduler(plan, mode="min", safety_net=net).start(0.0), Wake) == [Wake(64.0)]
    blind = SafetyNet(MODEL, plan.cloud, plan.deadline_s)
    assert of(Scheduler(plan, mode="min", safety_net=blind).start(0.0), Wake) == [Wake(124.0)]
    # The target's pace is its own: a surrogate running 1.5x slow does not stretch it.
    assert net.train_s(1, 2, 1, factor=1.5, target=True) == 1.0 + 80.0
    assert net.train_s(1, 2, 1, factor=1.5) == 1.0 + 30.0


def test_the_net_prices_the_redone_iterations_of_running_queued_and_future_trains():
    # A function trainable that checkpoints every 2 iterations resumes stage 1 from step 0 after
    # its 1 iteration of stage 0: each TRAIN of stage 1 trains that iteration again (r = 0, 1,
    # DESIGN §4): 2 iterations, 21 s. On 1 GPU the 2 trials of stage 1 queue; on-demand from the
    # start: 10 + 11 + 1 + 2 x 21 + 1 = 65 s, so with a 200 s deadline and 20 s needed the net
    # wakes at 115 s (at 135 s, 20 s late, without the redone iterations).
    model = MODEL.replace(checkpoint_every=2)
    plan = spot_plan(200.0, allocation=(4, 1))
    net = SafetyNet(model, plan.cloud, plan.deadline_s)
    sched = Scheduler(plan, mode="min", safety_net=net)
    assert of(sched.start(0.0), Wake) == [Wake(115.0)]
    # In stage 1 (1 GPU, 2 trials): one TRAIN running, started fresh (owes its redone
    # iteration), one queued (owes it too): 21 + 21 + 1 = 43 s left, not 23.
    out = sched.on(InstanceReady("i000", 4, 5.0), 10.0)
    for d in of(out, StartTrial):
        out = sched.on(TrainFinished(d.trial, 1, float(d.trial[-1])), 21.0)
    out = sched.on(SyncDone(0), 22.0)
    assert len(of(out, StartTrial)) == 1 and sched._queue
    assert sched._finish_on_demand_s(net) == pytest.approx(21.0 + 21.0 + 1.0)
    # 5 s into the running TRAIN: 16 s of it left.
    sched.on(Tick(), 27.0)
    assert sched._finish_on_demand_s(net) == pytest.approx(16.0 + 21.0 + 1.0)
