"""rb.simulate with spot instances (DESIGN §4.1): the rate-0 equivalence, an independent
renewal-process oracle for one instance, mixed stages, and bad input."""

import numpy as np
import pytest

from rubberband.errors import SpecError
from rubberband.profiles.cloud import Market
from rubberband.profiles.distributions import Constant, Normal
from rubberband.profiles.model import ModelProfile
from rubberband.profiles.spot import SpotMarket
from rubberband.simulator import simulate
from rubberband.spec import ExperimentSpec
from rubberband.testing.builders import cloud_profile, spot_cloud
from rubberband.testing.spot_oracle import one_instance_job

MODEL = ModelProfile({1: Normal(4.0, 0.4), 2: Normal(2.2, 0.2), 4: Normal(1.3, 0.1), 8: Normal(0.8, 0.08)},
                     trial_startup_s=Normal(8.0, 1.0), sync_s=Constant(1.0), name="m")
SPEC = ExperimentSpec.sha(num_trials=16, min_iters=2, max_iters=40, eta=2)


ALLOCATION = [16, 8, 8, 4, 2]


def test_with_every_rate_at_zero_a_spot_plan_is_an_on_demand_plan_at_the_spot_price_to_the_last_bit():
    spot = simulate(SPEC, ALLOCATION, MODEL, spot_cloud(spot=SpotMarket(notice_s=120)), samples=300, seed=3)
    priced = spot_cloud(market=Market.ON_DEMAND, price_usd_per_hour=3.67, spot_price_usd_per_hour=None)
    on_demand = simulate(SPEC, ALLOCATION, MODEL, priced, samples=300, seed=3)
    assert np.array_equal(spot.jct_s, on_demand.jct_s)
    assert np.array_equal(spot.cost_usd, on_demand.cost_usd)
    assert spot.spot_instances == spot.instances


def test_an_on_demand_stage_in_a_spot_market_is_never_interrupted():
    risky = spot_cloud(spot=SpotMarket(rate_per_hour=5.0))
    none_spot = simulate(SPEC, ALLOCATION, MODEL, risky, samples=200, seed=1, spot_instances=[0] * 5)
    on_demand = simulate(SPEC, ALLOCATION, MODEL, spot_cloud(market=Market.ON_DEMAND), samples=200, seed=1)
    assert np.array_equal(none_spot.jct_s, on_demand.jct_s)
    assert np.array_equal(none_spot.cost_usd, on_demand.cost_usd)


def test_more_spot_instances_are_cheaper_and_slower_and_reclaims_are_counted():
    risky = spot_cloud(spot=SpotMarket(notice_s=120, rate_per_hour=2.0))
    held = simulate(SPEC, ALLOCATION, MODEL, risky, samples=400, seed=2, spot_instances=[0] * 5).instances
    results = [simulate(SPEC, ALLOCATION, MODEL, risky, samples=400, seed=2,
                        spot_instances=[min(k, h) for h in held]) for k in (0, 1, 2, 4)]
    costs = [r.mean_cost_usd for r in results]
    jcts = [r.mean_jct_s for r in results]
    assert costs == sorted(costs, reverse=True)
    assert jcts[-1] > jcts[0]
    assert sum(s.mean_reclaims for s in results[-1].stages) > 0
    assert sum(s.mean_reclaims for s in results[0].stages) == 0


# --- the one-instance case against an independent renewal process ----------------------------
ONE_GPU = ModelProfile({1: Normal(2.0, 0.3)}, trial_startup_s=Normal(5.0, 1.0), sync_s=Constant(2.0), name="one")


@pytest.mark.parametrize("notice", [0.0, 120.0])
def test_one_instance_agrees_with_a_renewal_process(notice):
    spec = ExperimentSpec.sha(num_trials=8, min_iters=40, max_iters=640, eta=2)
    cloud = cloud_profile("p3.2xlarge", 1, 3.06, spot_price_usd_per_hour=0.92, market=Market.SPOT,
                          spot=SpotMarket(notice_s=notice, rate_per_hour=3.0), provision_s=Normal(60.0, 10.0),
                          init_s=Normal(90.0, 15.0), granularity_s=1.0, minimum_s=60.0, dataset_gb=1.0,
                          usd_per_gb=0.02)
    sim = simulate(spec, [1] * spec.num_stages(), ONE_GPU, cloud, samples=4000, seed=0)
    jct, cost = one_instance_job([(s.num_trials, s.iters) for s in spec.stages], ONE_GPU.latency(1),
                                 ONE_GPU.trial_startup_s, ONE_GPU.sync_s, cloud.provision_latency_s,
                                 cloud.init_latency_s, 3.0, notice, 0.92, 1.0, 60.0, 0.02, samples=4000, seed=1)
    assert sim.mean_jct_s == pytest.approx(jct.mean(), rel=0.015)
    assert sim.mean_cost_usd == pytest.approx(cost.mean(), rel=0.02)
    assert sum(s.mean_reclaims for s in sim.stages) > 1.0      # the check has reclaims to check


@pytest.mark.parametrize(
    ("spot_instances", "pattern"),
    [([1, 1], r"spot_instances: expected 5 counts"),
     ([9, 0, 0, 0, 0], r"spot_instances\[0\]: expected a whole number of the stage's 4 instances \(0\.\.4\), got 9"),
     ([-1, 0, 0, 0, 0], r"spot_instances\[0\]"),
     ([0.5, 0, 0, 0, 0], r"spot_instances\[0\]"),
     ("1,1", r"spot_instances: expected 5 counts")],
)
def test_bad_spot_counts_name_the_stage(spot_instances, pattern):
    with pytest.raises(SpecError, match=pattern):
        simulate(SPEC, ALLOCATION, MODEL, spot_cloud(), samples=10, spot_instances=spot_instances)


def test_spot_needs_a_spot_price():
    cloud = spot_cloud(market=Market.ON_DEMAND, spot_price_usd_per_hour=None)
    with pytest.raises(SpecError, match=r"spot_instances: p3\.8xlarge has no spot_price_usd_per_hour"):
        simulate(SPEC, ALLOCATION, MODEL, cloud, samples=10, spot_instances=[1, 0, 0, 0, 0])


def test_a_stage_that_changes_market_launches_all_its_instances():
    risky = spot_cloud(spot=SpotMarket(rate_per_hour=1.0))
    r = simulate(SPEC, ALLOCATION, MODEL, risky, samples=50, seed=0, spot_instances=[4, 0, 0, 0, 0])
    held = r.instances
    assert [s.new_instances for s in r.stages][:2] == [held[0], held[1]]     # spot -> on-demand: all new
    same = simulate(SPEC, ALLOCATION, MODEL, risky, samples=50, seed=0, spot_instances=[0] * 5)
    assert same.stages[1].new_instances == max(0, held[1] - held[0])


# --- edges a review found -------------------------------------------------------------------
def test_instances_reclaimed_faster_than_they_can_start_is_one_error_not_a_hang():
    hopeless = spot_cloud(spot=SpotMarket(rate_per_hour=1e6))
    with pytest.raises(SpecError, match=r"spot\.preemption: spot instances are reclaimed faster than they can start"):
        simulate(SPEC, ALLOCATION, MODEL, hopeless, samples=5, seed=0)


def test_a_trace_zone_with_only_short_available_stretches_is_one_error_not_a_hang():
    from rubberband.profiles.spot import SpotTrace

    flicker = SpotTrace("z", 1, np.array([0.0, 10.0]), np.array([1, 0]), 100.0)   # up 10 s in 100
    with pytest.raises(SpecError, match=r"zone z's available stretches"):
        simulate(SPEC, ALLOCATION, MODEL, spot_cloud(spot=SpotMarket(trace=flicker)), samples=5, seed=0)


def test_per_function_billing_prices_each_stage_at_its_market():
    od = simulate(SPEC, ALLOCATION, MODEL, spot_cloud(market=Market.ON_DEMAND, per_function=True), samples=50,
                  spot_instances=[0] * 5)
    spot = simulate(SPEC, ALLOCATION, MODEL, spot_cloud(market=Market.ON_DEMAND, per_function=True), samples=50,
                    spot_instances=list(od.instances))
    data = 0.15 * 0.09 * sum(s.new_instances for s in od.stages)
    assert spot.mean_cost_usd - data == pytest.approx((od.mean_cost_usd - data) * 3.67 / 12.24)


# --- gang traces: a count of available instances caps how many spot instances are held ------
from rubberband.profiles.spot import SpotTrace  # noqa: E402
from rubberband.simulator.spot import trace_offsets  # noqa: E402
from rubberband.testing.spot_oracle import gang_trace_job  # noqa: E402

COUNTS = [(0.0, 4), (300.0, 2), (900.0, 0), (1200.0, 3), (2000.0, 4), (2600.0, 1), (3000.0, 4)]
GANG_SPEC = ExperimentSpec.sha(num_trials=4, min_iters=40, max_iters=160, eta=2)        # 4, 2, 1 trials


STEADY_SCALE, STEADY_INIT = Constant(30.0), Constant(60.0)


def _gang_cloud(nodes, provision=STEADY_SCALE, init=STEADY_INIT):
    counts = [(t, min(c, nodes)) for t, c in COUNTS]
    trace = SpotTrace("g", nodes, np.array([t for t, _ in counts]), np.array([c for _, c in counts]), 3600.0)
    return counts, cloud_profile("g1", 1, 3.0, spot_price_usd_per_hour=1.0, market=Market.SPOT,
                                 spot=SpotMarket(trace=trace), provision_s=provision, init_s=init)


def _oracle(cloud, counts, model, samples, seed):
    offsets = trace_offsets(cloud.spot, seed, samples)           # the one thing shared: where each sample starts
    return gang_trace_job(list(GANG_SPEC.trials), [s.iters for s in GANG_SPEC.stages], counts, 3600.0, offsets,
                          model.latency(1), model.trial_startup_s, model.sync_s, cloud.provision_latency_s,
                          cloud.init_latency_s, seed=0, gang=cloud.spot.trace.nodes > 1)


@pytest.mark.parametrize("nodes", [4, 1])          # a cap; and the all-or-none single-instance trace
def test_a_trace_replays_sample_by_sample_as_an_independent_event_simulation(nodes):
    counts, cloud = _gang_cloud(nodes)
    model = ModelProfile({1: Constant(7.0)}, trial_startup_s=Constant(5.0), sync_s=Constant(2.0), name="c")
    sim = simulate(GANG_SPEC, list(GANG_SPEC.trials), model, cloud, samples=300, seed=4)
    jct, reclaims = _oracle(cloud, counts, model, 300, 4)
    assert sim.jct_s == pytest.approx(jct, rel=1e-12)
    per_sample = sum(s.mean_reclaims for s in sim.stages)
    assert per_sample == pytest.approx(reclaims.mean(), rel=1e-12) and per_sample > 0.5


def test_a_gang_trace_agrees_with_the_independent_simulation_in_distribution():
    counts, cloud = _gang_cloud(4, Normal(30.0, 5.0), Normal(60.0, 10.0))
    model = ModelProfile({1: Normal(7.0, 1.0)}, trial_startup_s=Normal(5.0, 1.0), sync_s=Constant(2.0), name="n")
    sim = simulate(GANG_SPEC, list(GANG_SPEC.trials), model, cloud, samples=3000, seed=4)
    jct, reclaims = _oracle(cloud, counts, model, 3000, 4)
    assert sim.mean_jct_s == pytest.approx(jct.mean(), rel=0.015)
    assert sum(s.mean_reclaims for s in sim.stages) == pytest.approx(reclaims.mean(), rel=0.05)


def test_a_cap_reclaims_only_what_is_over_it():
    _, capped = _gang_cloud(4)
    _, all_or_none = _gang_cloud(1)
    model = ModelProfile({1: Constant(7.0)}, trial_startup_s=Constant(5.0), sync_s=Constant(2.0), name="c")
    gang = simulate(GANG_SPEC, list(GANG_SPEC.trials), model, capped, samples=300, seed=4)
    zone = simulate(GANG_SPEC, list(GANG_SPEC.trials), model, all_or_none, samples=300, seed=4)
    # The counts drop below 4 more often than to 0: more instances go, but none while the zone is up at all.
    assert sum(s.mean_reclaims for s in gang.stages) > sum(s.mean_reclaims for s in zone.stages)


def test_more_spot_instances_than_a_gang_trace_has_is_one_error():
    _, cloud = _gang_cloud(4)
    spec = ExperimentSpec.sha(num_trials=8, min_iters=4, max_iters=16, eta=2)
    with pytest.raises(SpecError, match=r"spot\.preemption\.trace\.nodes: zone g's 4-instance trace caps spot "
                                        r"instances at 4, and stage 0 holds 8; hold at most 4"):
        simulate(spec, [8, 4, 2], ONE_GPU, cloud, samples=10)
    assert simulate(spec, [8, 4, 2], ONE_GPU, cloud, samples=10, spot_instances=[4, 4, 2]).spot_instances == (4, 4, 2)
