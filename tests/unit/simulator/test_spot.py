"""Spot reclaims in the simulator's kernel: schedules of instance positions and TRAIN nodes
that lose the iteration in progress and resume on a replacement (DESIGN §4.1)."""

import numpy as np
import pytest

from rubberband.errors import SpecError
from rubberband.profiles.cloud import CloudProfile
from rubberband.profiles.distributions import Constant, LogNormal, Normal
from rubberband.profiles.spot import SpotMarket, SpotTrace
from rubberband.simulator.model import StageShape, list_schedule
from rubberband.simulator.spot import PositionSchedule, bill_window, run_stage, trial_positions

CLOUD = CloudProfile(instance_type="t", gpus_per_instance=4, price_usd_per_hour=3.0, spot_price_usd_per_hour=1.0,
                     provision_latency_s=Constant(5.0), init_latency_s=Constant(10.0))


def _schedule(market, positions=1, samples=3, start=5.0, up=15.0, offset=0.0, spot=True):
    t0 = np.zeros(samples)
    return PositionSchedule(CLOUD, market, seed=0, stage=0, t0=t0,
                            start=np.full((positions, samples), start), up=np.full((positions, samples), up),
                            spot=np.full(positions, spot), offset=np.full(samples, offset))


def _shape(n, a, iters, G=4):
    from rubberband.simulator.model import gpus_per_trial, instances_needed, running_trials

    return StageShape(0, n, iters, a, gpus_per_trial(n, a), running_trials(n, a), instances_needed(n, a, G))


@pytest.mark.parametrize(("n", "a"), [(8, 8), (8, 3), (2, 8), (1, 12)])
def test_without_reclaims_a_stage_runs_as_on_demand(n, a):
    rng = np.random.default_rng(1)
    shape = _shape(n, a, iters=7)
    latency, startup = rng.uniform(1, 2, (n, 50)), rng.uniform(0, 3, (n, 50))
    schedule = _schedule(SpotMarket(), positions=shape.instances_needed, samples=50, start=0.0, up=0.0)
    ready = rng.uniform(0, 5, 50)
    trained, _ = run_stage(schedule, shape, 4, ready, latency, startup)
    durations = startup + 7 * latency
    want = durations.max(axis=0) if a >= n else list_schedule(durations, shape.running)
    assert trained == pytest.approx(ready + want, rel=1e-12)


def test_trials_pack_on_positions_as_design_4_says():
    assert trial_positions(_shape(8, 8, 1), 4)[:, 0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert trial_positions(_shape(4, 8, 1), 4)[:, 0].tolist() == [0, 0, 1, 1]
    assert trial_positions(_shape(1, 12, 1), 4).tolist() == [[0, 1, 2]]


# A zone up for [0, 100), down for [100, 150), then up until the trace repeats at 1000.
TRACE = SpotTrace("z", 1, np.array([0.0, 100.0, 150.0]), np.array([1, 0, 1]), 1000.0)


def test_a_reclaimed_trial_keeps_its_completed_iterations_and_resumes_on_the_replacement():
    schedule = _schedule(SpotMarket(trace=TRACE))
    shape = _shape(1, 1, iters=20)
    trained, _ = run_stage(schedule, shape, 4, np.full(3, 15.0), np.full((1, 3), 10.0), np.full((1, 3), 2.0))
    # Ready at 15; 8 iterations done by 97, the 9th lost at the reclaim at 100; capacity back at
    # 150, SCALE 5 and INIT 10: up at 165; start-up 2 and 12 iterations more.
    assert trained.tolist() == [287.0] * 3
    bill = bill_window(schedule, np.array([0]), np.zeros(3), np.full(3, 300.0), CLOUD.billing,
                       carried=np.array([False]))
    assert bill.instance_seconds.tolist() == [95.0 + 145.0] * 3      # 5..100, then 155..300
    assert bill.rounding_s.tolist() == [0.0] * 3                       # 95 s: over the minimum
    assert bill.launches.tolist() == [1] * 3                           # the replacement


def test_a_trial_over_two_instances_stops_when_either_is_reclaimed():
    market = SpotMarket(rate_per_hour=3.0)
    schedule = _schedule(market, positions=2, samples=400, start=0.0, up=0.0)
    shape = _shape(1, 8, iters=200)
    latency, startup = np.full((1, 400), 1.0), np.zeros((1, 400))
    trained, _ = run_stage(schedule, shape, 4, np.zeros(400), latency, startup)
    one = _schedule(market, positions=1, samples=400, start=0.0, up=0.0)
    alone, _ = run_stage(one, _shape(1, 4, iters=200), 4, np.zeros(400), latency, startup)
    # Twice the reclaim rate: slower on average than on one instance, never faster than no reclaims.
    assert trained.mean() > alone.mean() > 200.0
    assert trained.min() >= 200.0


def test_with_notice_the_replacement_is_ready_sooner():
    slow = CloudProfile(instance_type="t", gpus_per_instance=1, price_usd_per_hour=3.0, spot_price_usd_per_hour=1.0,
                        provision_latency_s=Constant(100.0), init_latency_s=Constant(20.0))
    shape = _shape(1, 1, iters=3600)
    out = {}
    for notice in (0.0, 120.0):
        schedule = PositionSchedule(slow, SpotMarket(notice_s=notice, rate_per_hour=2.0), 0, 0, np.zeros(500),
                                    np.zeros((1, 500)), np.zeros((1, 500)), np.array([True]), np.zeros(500))
        out[notice], _ = run_stage(schedule, shape, 1, np.zeros(500), np.ones((1, 500)), np.zeros((1, 500)))
    # Same lifetimes (common random numbers); each reclaim costs 120 s less with the notice.
    assert (out[120.0] <= out[0.0]).all() and out[120.0].mean() < out[0.0].mean() - 100


def test_round_robin_queueing_is_list_scheduling_when_a_round_s_trials_take_equally_long():
    shape = _shape(12, 4, iters=10)
    schedule = _schedule(SpotMarket(rate_per_hour=6.0), positions=1, samples=200, start=0.0, up=0.0)
    latency = np.broadcast_to(np.repeat(np.random.default_rng(0).uniform(1, 3, (3, 1)), 4, axis=0), (12, 200))
    exact, _ = run_stage(schedule, shape, 4, np.zeros(200), latency, np.zeros((12, 200)))
    rounds, _ = run_stage(schedule, shape, 4, np.zeros(200), latency, np.zeros((12, 200)), rounds=True)
    assert np.allclose(exact, rounds)


# --- counter-based draws: lazily drawn, and the same for one sample as for the whole run ----
NOISY = CloudProfile(instance_type="t", gpus_per_instance=4, price_usd_per_hour=3.0, spot_price_usd_per_hour=1.0,
                     provision_latency_s=Normal(30.0, 8.0), init_latency_s=LogNormal(60.0, 15.0))


@pytest.mark.parametrize("market", [SpotMarket(notice_s=120, rate_per_hour=20.0), SpotMarket(trace=TRACE)])
def test_one_sample_on_its_own_reads_the_numbers_it_reads_in_the_whole_run(market):
    rng = np.random.default_rng(4)
    start = rng.uniform(0, 50, (3, 40))
    up = start + rng.uniform(0, 60, (3, 40))
    offset = rng.uniform(0, 1000, 40)
    spot = np.array([False, True, True])
    whole = PositionSchedule(NOISY, market, 5, 2, np.zeros(40), start, up, spot, offset)
    for k in (17, 33):
        one = PositionSchedule(NOISY, market, 5, 2, np.zeros(1), start[:, k:k + 1], up[:, k:k + 1], spot,
                               offset[k:k + 1], sample_ids=[k], sample_count=40)
        for position in range(3):
            assert one.chain(position, 0, 5000.0) == whole.chain(position, k, 5000.0)
    assert len(whole.chain(2, 17, 5000.0)) > 3           # replacements were compared, not just first lives


def test_replacements_are_drawn_only_for_the_pairs_that_reach_them():
    schedule = _schedule(SpotMarket(rate_per_hour=2.0), positions=4, samples=1000, start=0.0, up=0.0)
    reclaimed = np.flatnonzero(schedule.down0.ravel() < 600.0)
    start, _, down = schedule.incarnation(1, reclaimed)
    drawn = schedule._later[0][0]
    assert drawn.sum() == reclaimed.size < 0.5 * drawn.size
    assert (start >= schedule.down0.ravel()[reclaimed]).all() and (down > start).all()


def test_counter_draws_follow_their_distributions_and_differ_by_key():
    from scipy import stats

    from rubberband.simulator.spot import _Counter, _key, counter, counter_uniform

    rows, samples = np.divmod(np.arange(200_000), 1000)
    count = counter(rows, samples)
    u, other = counter_uniform(np.array([_key(0, 0, 10, 1), _key(0, 0, 11, 1)]), count)
    assert 0.0 < u.min() and u.max() < 1.0
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    assert abs(np.corrcoef(u, other)[0, 1]) < 0.01
    assert np.array_equal(counter_uniform(np.array([_key(0, 0, 11, 1)]), count[5:9])[0], other[5:9])
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01                 # neighbouring samples
    x = Normal(30.0, 8.0).sample(_Counter(u), u.size)
    assert x.mean() == pytest.approx(30.0, abs=0.1) and x.std() == pytest.approx(8.0, abs=0.1)
    life = _Counter(u).standard_exponential(u.size)
    assert stats.kstest(life, "expon").pvalue > 1e-3


def test_a_stage_holding_more_spot_instances_than_a_gang_trace_has_is_named():
    gangs = SpotTrace("g", 4, np.array([0.0, 100.0]), np.array([4, 2]), 1000.0)
    with pytest.raises(SpecError, match=r"zone g's 4-instance trace caps spot instances at 4, and stage 3 holds 6"):
        PositionSchedule(CLOUD, SpotMarket(trace=gangs), seed=0, stage=3, t0=np.zeros(2), start=np.zeros((6, 2)),
                         up=np.zeros((6, 2)), spot=np.ones(6, dtype=bool), offset=np.zeros(2))
