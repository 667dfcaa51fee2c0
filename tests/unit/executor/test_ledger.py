"""The run's ledger: billing by the simulator's rules, provider events to records, and a
fake-driven run of a deterministic plan costing exactly what the simulator predicts."""

from __future__ import annotations

import pytest

from rubberband import CloudProfile, ExperimentSpec
from rubberband.errors import SpecError
from rubberband.executor.driver import Driver
from rubberband.executor.ledger import Ledger, TrialRun
from rubberband.executor.run import ledger_from_events
from rubberband.plan import plan_allocation
from rubberband.simulator import simulate
from rubberband.testing.builders import fake_cloud, model_profile
from rubberband.testing.fakes import make_fakes

EXACT = {"rel": 1e-12, "abs": 1e-12}
PRICE = 3.6                      # fake_cloud's price, USD per hour: 0.001 USD per second


def launched(ledger: Ledger, name: str, start: float, end: float | None, stage: int = 0,
             stage_released: int | None = None):
    rec = ledger.request(name, start, stage)
    rec.launched_s = start
    rec.released_s = end
    rec.stage_released = stage_released
    return rec


# --- billing rules ------------------------------------------------------------------------

@pytest.mark.parametrize(("lifetime", "granularity", "minimum", "billed"), [
    (61, 60, 0, 120),          # rounded up to the granularity
    (120, 60, 0, 120),
    (10, 1, 60, 60),           # at least the minimum
    (61.2, 1, 60, 62),
    (59.5, 1, 60, 60),
    (0, 60, 0, 0),
])
def test_an_instance_is_billed_rounded_up_and_at_least_the_minimum(lifetime, granularity, minimum, billed):
    ledger = Ledger(fake_cloud(4, granularity_s=granularity, minimum_s=minimum))
    rec = launched(ledger, "i1", 5.0, 5.0 + lifetime)
    assert ledger.instance_cost_usd(rec, now=1e9) == pytest.approx(billed * PRICE / 3600, **EXACT)
    assert ledger.cost_usd(now=1e9) == pytest.approx(billed * PRICE / 3600, **EXACT)


def test_a_running_instance_is_billed_up_to_now_and_an_unlaunched_one_not_at_all():
    ledger = Ledger(fake_cloud(4, minimum_s=0, dataset_gb=10, usd_per_gb=0.02))
    launched(ledger, "i1", 0.0, None)
    ledger.request("i2", 0.0, 0)                      # requested, never running
    assert [r.instance_id for r in ledger.running()] == ["i1", "i2"]
    assert ledger.cost_usd(now=100.0) == pytest.approx(100 * 0.001 + 0.2, **EXACT)


def test_data_is_paid_once_per_launched_instance():
    ledger = Ledger(fake_cloud(4, minimum_s=0, dataset_gb=10, usd_per_gb=0.02))   # 0.2 USD a launch
    launched(ledger, "i1", 0.0, 100.0)
    launched(ledger, "i2", 50.0, 100.0)
    ledger.request("i3", 60.0, 0)
    assert ledger.cost_usd(now=100.0) == pytest.approx(150 * 0.001 + 2 * 0.2, **EXACT)


def test_per_function_billing_charges_only_gpu_seconds_of_trial_runs():
    ledger = Ledger(fake_cloud(4, per_function=True, dataset_gb=10, usd_per_gb=0.02))
    launched(ledger, "i1", 0.0, 1000.0)               # instance time itself is free
    ledger.trials = [TrialRun("a", 0, 1, 0.0, 40.0, 4), TrialRun("b", 0, 2, 10.0, 30.0, 4),
                     TrialRun("a", 1, 4, 40.0, 50.0, 4)]
    gpu_s = 1 * 40 + 2 * 20 + 4 * 10
    assert ledger.cost_usd(now=1000.0) == pytest.approx(gpu_s * 0.001 / 4 + 0.2, **EXACT)


def staged_ledger(per_function: bool, last_release: float | None) -> Ledger:
    ledger = Ledger(fake_cloud(2, per_function=per_function, granularity_s=60, minimum_s=60, dataset_gb=1,
                          usd_per_gb=0.09), stage_windows=[(0.0, 70.0), (70.0, 95.0), (95.0, 200.0)])
    launched(ledger, "i1", 10.0, 200.0, stage=0, stage_released=2)
    launched(ledger, "i2", 10.0, 70.0, stage=0, stage_released=0)
    launched(ledger, "i3", 75.0, 95.0, stage=1, stage_released=1)
    launched(ledger, "i4", 100.0, last_release, stage=2, stage_released=2 if last_release else None)
    ledger.trials = [TrialRun("a", 0, 1, 15.0, 70.0, 3), TrialRun("a", 1, 2, 75.0, 95.0, 3),
                     TrialRun("a", 2, 4, 100.0, 190.0, 3)]
    return ledger


@pytest.mark.parametrize("per_function", [False, True], ids=["per-instance", "per-function"])
@pytest.mark.parametrize("last_release", [200.0, None], ids=["released", "running"])
def test_stage_costs_add_up_to_the_cost(per_function, last_release):
    ledger = staged_ledger(per_function, last_release)
    costs = ledger.stage_costs(now=200.0)
    assert len(costs) == 3 and all(c > 0 for c in costs)
    assert sum(costs) == pytest.approx(ledger.cost_usd(now=200.0), **EXACT)


def test_stage_costs_add_up_when_an_instance_terminates_after_the_last_window():
    ledger = staged_ledger(per_function=False, last_release=210.0)
    assert sum(ledger.stage_costs(now=210.0)) == pytest.approx(ledger.cost_usd(now=210.0), **EXACT)


def test_stage_costs_without_windows_are_empty():
    assert Ledger(fake_cloud(4)).stage_costs(now=10.0) == []


# --- ledger_from_events -------------------------------------------------------------------

def fake_plan(G: int = 2):  # noqa: N803
    return plan_allocation(ExperimentSpec.from_stages([(2, 1), (1, 1)]), (2, 1),
                           model_profile({1: 1.0}), fake_cloud(G), 1e6, samples=1)


def test_ledger_from_events_maps_provider_events_to_records():
    t0 = 500.0
    events = [
        {"event": "request", "instance": "rb-instance-1", "node_id": "n1", "t": t0 + 0.0},
        {"event": "request", "instance": "rb-instance-2", "node_id": "n2", "t": t0 + 0.0},
        {"event": "running", "instance": "rb-instance-1", "t": t0 + 10.0},
        {"event": "running", "instance": "rb-instance-2", "t": t0 + 11.0},
        {"event": "ready", "instance": "rb-instance-1", "t": t0 + 15.0},
        {"event": "ready", "instance": "rb-instance-2", "t": t0 + 16.0},
        {"event": "terminated", "instance": "rb-instance-2", "t": t0 + 40.0},   # released at stage 0's SYNC
        {"event": "request", "instance": "rb-instance-3", "node_id": "n3", "t": t0 + 45.0},
        {"event": "running", "instance": "rb-instance-3", "t": t0 + 55.0},
        {"event": "running", "instance": "rb-ghost", "t": t0 + 56.0},            # never requested: ignored
        {"event": "terminated", "instance": "rb-instance-3", "t": t0 + 70.0},
    ]
    windows = [(0.0, 40.0), (40.0, 80.0)]
    ledger = ledger_from_events(fake_plan(), events, started=t0, stop_time=t0 + 90.0, stage_windows=windows)
    assert set(ledger.instances) == {"rb-instance-1", "rb-instance-2", "rb-instance-3"}
    one, two, three = (ledger.instances[f"rb-instance-{n}"] for n in (1, 2, 3))
    assert (one.requested_s, one.launched_s, one.ready_s) == (0.0, 10.0, 15.0)
    assert one.provider_id == "n1" and one.instance_type == "fake.gpu" and one.price_usd_per_hour == PRICE
    # Never terminated: released when the cluster stopped.
    assert (one.released_s, one.stage_released) == (90.0, 1)
    assert (two.released_s, two.stage_released) == (40.0, 0)
    assert (three.requested_s, three.stage_requested, three.launched_s) == (45.0, 1, 55.0)
    assert (three.released_s, three.stage_released) == (70.0, 1)
    assert ledger.stage_windows == windows
    assert ledger.cost_usd(now=90.0) == pytest.approx((80 + 60 + 60) * 0.001, **EXACT)


def test_an_instance_released_at_a_sync_and_terminated_in_the_next_stage_is_billed_to_the_one_it_served():
    # The driver let rb-instance-2 go at stage 0's SYNC (its ``release`` event); the provider
    # terminated it 1.5 s into stage 1. Its 60 s minimum's top-up is stage 0's, as the model
    # bills it (the last stage it served): it was stage 1's, a stage cost +$0.0137 off on the demo.
    t0 = 500.0
    events = [
        {"event": "request", "instance": "rb-instance-1", "node_id": "n1", "t": t0 + 0.0},
        {"event": "request", "instance": "rb-instance-2", "node_id": "n2", "t": t0 + 0.0},
        {"event": "running", "instance": "rb-instance-1", "t": t0 + 10.0},
        {"event": "running", "instance": "rb-instance-2", "t": t0 + 10.0},
        {"event": "terminated", "instance": "rb-instance-2", "t": t0 + 41.5},
    ]
    windows = [(0.0, 40.0), (40.0, 80.0)]
    told = ledger_from_events(fake_plan(), events, t0, t0 + 90.0, windows, released_in={"rb-instance-2": 0})
    blind = ledger_from_events(fake_plan(), events, t0, t0 + 90.0, windows)
    assert told.instances["rb-instance-2"].stage_released == 0 and blind.instances["rb-instance-2"].stage_released == 1
    top_up = (60.0 - 31.5) * 0.001
    assert told.stage_costs(now=90.0)[0] == pytest.approx(blind.stage_costs(now=90.0)[0] + top_up, **EXACT)
    assert sum(told.stage_costs(now=90.0)) == pytest.approx(sum(blind.stage_costs(now=90.0)), **EXACT)


def test_the_driver_says_which_stage_it_released_instances_in():
    spec = ExperimentSpec.from_stages([(4, 1), (1, 1)])
    plan = plan_allocation(spec, (4, 1), model_profile({1: 1.0}), fake_cloud(2), 1e6, samples=1)
    fakes = make_fakes(2, {1: 1.0})
    out = Driver(plan, fakes.cluster, fakes.runner, {"lr": [0.1, 0.2, 0.3, 0.4]}, "loss", clock=fakes.clock).run()
    released = [e for e in out.timeline if e["event"] == "release"]
    # One of stage 0's two instances at its SYNC, the other when the job ends.
    assert [(e["stage"], len(e["instances"])) for e in released] == [(0, 1), (1, 1)]


def test_ledger_from_aws_events_uses_ec2_ids_times_and_release_reasons(tmp_path):
    import json

    from rubberband.providers.local import LocalCluster

    t0 = 1000.0
    raw = [
        {"event": "request", "instance": "rb-instance-1", "node_id": "n1", "t": t0},
        {"event": "launch_error", "instance": "rb-instance-1", "code": "InsufficientInstanceCapacity", "attempt": 1,
         "retry_in_s": 2.0, "t": t0 + 1},
        {"event": "running", "instance": "rb-instance-1", "ec2_id": "i-1", "market": "spot", "t": t0 + 4.6, "t_ec2": t0 + 4.0},
        {"event": "ready", "instance": "rb-instance-1", "t": t0 + 8},
        {"event": "describe_error", "instance": "-", "error": "x", "t": t0 + 9},
        {"event": "terminated", "instance": "rb-instance-1", "ec2_id": "i-1", "reason": "interrupted", "t": t0 + 30.5,
         "t_ec2": t0 + 30.0},
        {"event": "terminated", "instance": "rb-instance-1", "ec2_id": "i-1", "reason": "shutdown", "t": t0 + 60},  # sweep
        {"event": "request", "instance": "rb-instance-2", "node_id": "n2", "t": t0 + 31},
        {"event": "running", "instance": "rb-instance-2", "ec2_id": "i-2", "market": "spot", "t": t0 + 33.2, "t_ec2": t0 + 33.0},
    ]

    cluster = LocalCluster("run", tmp_path, port=0, sid=0, temp_dir="", provider="aws")
    cluster.events_path.parent.mkdir(parents=True)
    cluster.events_path.write_text("".join(json.dumps(e) + "\n" for e in raw))
    events = cluster.read_events()
    assert events[2]["t_local"] == t0 + 4.6           # EC2's LaunchTime is the ledger's time
    ledger = ledger_from_events(fake_plan(), events, started=t0, stop_time=t0 + 70, stage_windows=[(0.0, 70.0)])
    one, two = ledger.instances["rb-instance-1"], ledger.instances["rb-instance-2"]
    assert (one.provider_id, one.market, one.launched_s, one.released_s, one.release_reason) == ("i-1", "spot", 4.0, 30.0, "interrupted")
    assert (two.provider_id, two.launched_s, two.released_s, two.release_reason) == ("i-2", 33.0, 70.0, "shutdown")
    assert [e["code"] for e in ledger.launch_errors] == ["InsufficientInstanceCapacity"]
    assert ledger.to_dict(now=70.0)["launch_errors"][0]["retry_in_s"] == 2.0


# --- a fake-driven run costs what the simulator predicts ----------------------------------

ITER_S = {1: 4.0, 2: 2.5}
SPACE = {"lr": {"grid": [0.5, 0.1, 0.8, 0.3, 0.7, 0.2, 0.6, 0.4]}}


def drive(stages, allocation, per_function):
    """Run a deterministic plan on fakes whose latencies are the profiles' constants, and
    build the ledger the way ``rubberband.executor.run`` does."""
    provision_s, init_s, G = 10.0, 5.0, 2
    model = model_profile(ITER_S)     # no start-up, no SYNC time
    cl = fake_cloud(G, per_function=per_function, provision_s=provision_s, init_s=init_s, dataset_gb=10, usd_per_gb=0.02)
    spec = ExperimentSpec.from_stages(stages)
    plan = plan_allocation(spec, allocation, model, cl, deadline_s=1e6, samples=2)
    fakes = make_fakes(G, ITER_S, provision_s=provision_s, init_s=init_s)
    outcome = Driver(plan, fakes.cluster, fakes.runner, SPACE, "loss", clock=fakes.clock).run()
    windows = [(s.start_s, s.end_s) for s in outcome.stages]
    ledger = ledger_from_events(plan, fakes.cluster.events(), outcome.started_at, fakes.clock(), windows)
    ledger.trials = [TrialRun(r["trial"], r["stage"], r["gpus"], r["start_s"], r["end_s"], r["iters"], r["iter_s"])
                     for r in outcome.train_runs]
    last_release = max(r.released_s for r in ledger.instances.values())
    return plan, simulate(spec, allocation, model, cl, samples=3), outcome, ledger, last_release


PLANS = [
    (((4, 3), (2, 3), (1, 3)), (4, 4, 2)),               # 2, 2, 1 instances: resize, then scale down
    (((4, 3), (2, 3), (1, 3)), (2, 4, 2)),               # queueing, then a scale-up
    (((8, 10), (4, 10), (2, 10), (1, 10)), (8, 4, 4, 2)),
]


@pytest.mark.parametrize("per_function", [False, True], ids=["per-instance", "per-function"])
@pytest.mark.parametrize(("stages", "allocation"), PLANS)
def test_a_deterministic_run_costs_exactly_what_the_simulator_predicts(stages, allocation, per_function):
    # The fakes reproduce the simulator's model exactly: one SCALE then INIT for all new
    # instances, trials in parallel (list scheduling when they queue), release at the SYNC,
    # the oldest kept; so no tolerance is needed beyond float rounding.
    plan, sim, outcome, ledger, last_release = drive(stages, allocation, per_function)
    assert sim.jct_s[0] == plan.predicted.jct_s[0]
    assert outcome.ended_at - outcome.started_at == pytest.approx(sim.jct_s[0], **EXACT)
    assert ledger.cost_usd(now=last_release) == pytest.approx(sim.cost_usd[0], **EXACT)
    for rec, pred in zip(outcome.stages, sim.stages):
        assert rec.end_s - rec.start_s == pytest.approx(pred.mean_duration_s, **EXACT)
        assert rec.instances == pred.instances


@pytest.mark.parametrize("per_function", [False, True], ids=["per-instance", "per-function"])
@pytest.mark.parametrize(("stages", "allocation"), [PLANS[0], PLANS[2]])
def test_a_deterministic_run_costs_per_stage_what_the_simulator_predicts(stages, allocation, per_function):
    _, sim, _, ledger, last_release = drive(stages, allocation, per_function)
    costs = ledger.stage_costs(now=last_release)
    assert costs == pytest.approx([s.mean_cost_usd for s in sim.stages], **EXACT)


@pytest.mark.parametrize("per_function", [False, True], ids=["per-instance", "per-function"])
def test_a_scale_up_stage_pays_its_own_launches(per_function):
    _, sim, _, ledger, last_release = drive(*PLANS[1], per_function)
    assert ledger.instances["rb-instance-2"].stage_requested == 1
    costs = ledger.stage_costs(now=last_release)
    assert costs == pytest.approx([s.mean_cost_usd for s in sim.stages], **EXACT)


def test_a_reclaimed_spot_instance_is_billed_at_the_spot_price_up_to_the_reclaim():
    # A mixed stage (one on-demand, two spot 1-GPU instances); spot rb-instance-2 gets a
    # 0.5 s notice at t=1022 and is reclaimed at t=1022.5, before its trial's next checkpoint.
    import dataclasses

    cl = fake_cloud(1, minimum_s=0).replace(spot_price_usd_per_hour=1.08)
    spec = ExperimentSpec.from_stages([(3, 10)])
    model = model_profile({1: 4.0})
    plan = dataclasses.replace(plan_allocation(spec, (3,), model, cl, deadline_s=1e6, samples=2), spot_instances=(2,))
    fakes = make_fakes(1, {1: 4.0}, provision_s=10, init_s=5)
    fakes.cluster.notify("rb-instance-2", 0.5, at=1022)
    outcome = Driver(plan, fakes.cluster, fakes.runner, SPACE, "loss", clock=fakes.clock).run()
    windows = [(s.start_s, s.end_s) for s in outcome.stages]
    ledger = ledger_from_events(plan, fakes.cluster.events(), outcome.started_at, fakes.clock(), windows)
    reclaimed = ledger.instances["rb-instance-2"]
    assert (reclaimed.market, reclaimed.release_reason) == ("spot", "interrupted")
    assert reclaimed.price_usd_per_hour == 1.08
    assert (reclaimed.launched_s, reclaimed.released_s) == (10.0, 22.5)     # SCALE end to the reclaim
    assert ledger.instance_cost_usd(reclaimed, now=1e9) == pytest.approx(13 * 1.08 / 3600, **EXACT)   # whole seconds
    on_demand = ledger.instances["rb-instance-1"]
    assert (on_demand.market, on_demand.price_usd_per_hour) == ("on-demand", PRICE)
    end = fakes.clock() - outcome.started_at
    markets = ledger.by_market(now=end)
    assert markets["spot"]["instances"] == 3 and markets["spot"]["reclaimed"] == 1     # with its replacement
    assert markets["on-demand"] == {"instances": 1, "reclaimed": 0, "price_usd_per_hour": PRICE,
                                    "cost_usd": pytest.approx((end - 10.0) * PRICE / 3600, **EXACT)}
    assert ledger.cost_usd(now=end) == pytest.approx(sum(m["cost_usd"] for m in markets.values()), **EXACT)
    assert sum(ledger.stage_costs(now=end)) == pytest.approx(ledger.cost_usd(now=end), **EXACT)


# --- several instance types -----------------------------------------------------------------

def big_cloud() -> CloudProfile:
    """A second type: 4 GPUs at 4x the price, billed per minute, 1 USD of data per launch."""
    return fake_cloud(4, instance_type="fake.big", price_usd_per_hour=4 * PRICE, spot_price_usd_per_hour=PRICE,
                      granularity_s=60, minimum_s=60, dataset_gb=10, usd_per_gb=0.1)


def test_each_instance_is_billed_by_its_own_types_price_billing_and_data():
    ledger = Ledger(fake_cloud(4, minimum_s=0, dataset_gb=1, usd_per_gb=0.05), clouds={"fake.big": big_cloud()},
                    stage_windows=[(0.0, 100.0), (100.0, 300.0)])
    small = launched(ledger, "i1", 0.0, 100.0, stage=0, stage_released=0)
    big = ledger.request("i2", 100.0, 1, instance_type="fake.big")
    big.launched_s, big.released_s, big.stage_released = 110.0, 171.0, 1      # 61 s: two minutes billed
    spot = ledger.request("i3", 100.0, 1, market="spot", instance_type="fake.big")
    spot.launched_s, spot.released_s, spot.stage_released = 110.0, 130.0, 1  # 20 s: the one-minute minimum
    assert (small.instance_type, small.price_usd_per_hour) == ("fake.gpu", PRICE)
    assert (big.instance_type, big.price_usd_per_hour, spot.price_usd_per_hour) == ("fake.big", 4 * PRICE, PRICE)
    assert ledger.instance_cost_usd(small, now=300.0) == pytest.approx(100 * 0.001, **EXACT)
    assert ledger.instance_cost_usd(big, now=300.0) == pytest.approx(120 * 0.004, **EXACT)
    assert ledger.instance_cost_usd(spot, now=300.0) == pytest.approx(60 * 0.001, **EXACT)
    data = 0.05 + 2 * 1.0                 # each launch pays its own type's data
    total = 100 * 0.001 + 120 * 0.004 + 60 * 0.001 + data
    assert ledger.cost_usd(now=300.0) == pytest.approx(total, **EXACT)
    assert sum(ledger.stage_costs(now=300.0)) == pytest.approx(total, **EXACT)
    assert ledger.stage_costs(now=300.0)[0] == pytest.approx(100 * 0.001 + 0.05, **EXACT)
    out = ledger.to_dict(now=300.0)
    assert out["instance_type"] == "fake.gpu/fake.big" and out["cost_usd"] == pytest.approx(total, **EXACT)
    assert out["by_type"]["fake.big"]["cost_usd"] == pytest.approx(120 * 0.004 + 60 * 0.001 + 2.0, **EXACT)
    assert {k: v["instances"] for k, v in out["markets"].items()} == \
        {"on-demand fake.gpu": 1, "on-demand fake.big": 1, "spot fake.big": 1}
    assert [i["instance_id"] for i in out["instances"]] == ["i1", "i2", "i3"]
    # Price and billing are each type's, not the first type's for all.
    assert out["price_usd_per_hour"] == {"fake.gpu": PRICE, "fake.big": 4 * PRICE}
    assert set(out["billing"]) == {"fake.gpu", "fake.big"}


def test_an_instance_of_a_type_the_plan_has_no_profile_for_is_one_line():
    with pytest.raises(SpecError, match=r"^ledger: an instance of fake.other, which the plan has no profile for "
                                        r"\(it has fake.gpu, fake.big\)$"):
        Ledger(fake_cloud(4), clouds={"fake.big": big_cloud()}).request("i1", 0.0, 0, instance_type="fake.other")


def test_ledger_from_events_prices_each_request_by_its_instance_type():
    import dataclasses

    plan = dataclasses.replace(fake_plan(), instance_types=("fake.gpu", "fake.big"),
                               type_clouds={"fake.gpu": fake_cloud(2), "fake.big": big_cloud()})
    t0 = 500.0
    events = [
        {"event": "request", "instance": "rb-instance-1", "instance_type": "fake.gpu", "market": "on-demand", "t": t0},
        {"event": "running", "instance": "rb-instance-1", "t": t0 + 10.0},
        {"event": "terminated", "instance": "rb-instance-1", "t": t0 + 40.0},
        {"event": "request", "instance": "rb-instance-2", "instance_type": "fake.big", "market": "on-demand", "t": t0 + 40.0},
        {"event": "running", "instance": "rb-instance-2", "market": "spot", "t": t0 + 50.0},   # what EC2 launched
        {"event": "terminated", "instance": "rb-instance-2", "t": t0 + 70.0},
    ]
    ledger = ledger_from_events(plan, events, started=t0, stop_time=t0 + 90.0, stage_windows=[(0.0, 40.0), (40.0, 80.0)])
    one, two = ledger.instances["rb-instance-1"], ledger.instances["rb-instance-2"]
    assert (one.instance_type, one.price_usd_per_hour) == ("fake.gpu", PRICE)
    assert (two.instance_type, two.market, two.price_usd_per_hour) == ("fake.big", "spot", PRICE)
    assert ledger.cost_usd(now=90.0) == pytest.approx(60 * 0.001 + 60 * 0.001 + 1.0, **EXACT)
