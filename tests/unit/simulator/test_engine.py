"""The simulator (DESIGN §4): exact answers, a reference implementation, the DAG, CRN, errors, trends."""

from __future__ import annotations

from collections import Counter
from functools import partial
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from rubberband import (
    Billing,
    BillingModel,
    CloudProfile,
    DataCost,
    ExperimentSpec,
    Market,
    ModelProfile,
    SpecError,
)
from rubberband.profiles import Constant, Distribution, Empirical, LogNormal, Normal
from rubberband.simulator import SimResult, StageDraws, build_dag, layout, simulate
from rubberband.simulator.model import redone_iters
from rubberband.simulator.trace import sample_timeline
from rubberband.testing.builders import cloud_profile, model_profile
from rubberband.testing.reference_sim import reference_simulate, run_once

ROOT = Path(__file__).resolve().parents[3]
AWS = ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml"
EXACT = {"rel": 1e-12}


# --- builders -----------------------------------------------------------------------------

# Deterministic profiles: every latency a constant (numbers are constants to the builders);
# the cloud is test.type, 4 GPUs at $12.24 an hour, SCALE 10 s and INIT 5 s unless told.
const_model = partial(model_profile, name="const")
const_cloud = partial(cloud_profile, provision_s=10.0, init_s=5.0)


def stages(*pairs: tuple[int, int]) -> ExperimentSpec:
    spec = ExperimentSpec()
    for n, k in pairs:
        spec = spec.add_stage(n, k)
    return spec


def run(spec, allocation, model, cloud, **kwargs) -> SimResult:
    """Simulate a deterministic plan and check every sample came out the same."""
    result = simulate(spec, allocation, model, cloud, samples=kwargs.pop("samples", 3), **kwargs)
    assert np.ptp(result.jct_s) == 0
    assert np.ptp(result.cost_usd) == 0
    return result


def usd(seconds: float, price: float = 12.24) -> float:
    return seconds * price / 3600


# --- a. exact answers on deterministic profiles -------------------------------------------

def test_parallel_trials_one_stage():
    # SCALE 10, INIT 5, TRAIN 1 + 3 * 2, SYNC 0.5.
    spec, model = stages((4, 3)), const_model({1: 2.0}, startup_s=1, sync_s=0.5)
    result = run(spec, [4], model, const_cloud())
    assert result.jct_s[0] == pytest.approx(22.5, **EXACT)
    # One instance billed from the end of SCALE (t=10) to 22.5 = 12.5 s, raised to the 60 s minimum.
    assert result.cost_usd[0] == pytest.approx(usd(60), **EXACT)
    assert result.instances == (1,)
    (stage,) = result.stages
    assert (stage.gpus_per_trial, stage.instances, stage.new_instances) == (1, 1, 1)
    assert stage.mean_duration_s == pytest.approx(22.5, **EXACT)


def test_parallel_trials_without_a_minimum():
    spec, model = stages((4, 3)), const_model({1: 2.0}, startup_s=1, sync_s=0.5)
    exact = run(spec, [4], model, const_cloud(granularity_s=0.5, minimum_s=0))
    assert exact.cost_usd[0] == pytest.approx(usd(12.5), **EXACT)
    rounded = run(spec, [4], model, const_cloud(granularity_s=1, minimum_s=0))
    assert rounded.cost_usd[0] == pytest.approx(usd(13), **EXACT)


def test_serial_queue_on_one_gpu():
    # a = 1 < n = 4: m = 1 and one GPU runs the four trials one after another.
    spec, model = stages((4, 3)), const_model({1: 2.0}, startup_s=1, sync_s=0.5)
    result = run(spec, [1], model, const_cloud(granularity_s=0.5, minimum_s=0))
    assert result.jct_s[0] == pytest.approx(10 + 5 + 4 * 7 + 0.5, **EXACT)
    assert result.cost_usd[0] == pytest.approx(usd(5 + 4 * 7 + 0.5), **EXACT)
    assert result.stages[0].gpus_per_trial == 1
    assert result.instances == (1,)


@pytest.mark.parametrize(("allocation", "rounds"), [(2, 3), (3, 2), (4, 2), (5, 1)])
def test_queue_makespan_in_rounds(allocation, rounds):
    # n = 5 trials on a GPUs take ceil(5 / a) rounds of 7 s each.
    spec, model = stages((5, 3)), const_model({1: 2.0}, startup_s=1, sync_s=0.5)
    result = run(spec, [allocation], model, const_cloud())
    assert result.jct_s[0] == pytest.approx(15 + rounds * 7 + 0.5, **EXACT)


def test_scale_up_in_a_later_stage():
    # Stage 0: 4 trials x 1 GPU on one instance. Stage 1: 2 trials x 4 GPUs need 2 instances:
    # a second SCALE + INIT while the first instance keeps being billed.
    spec = stages((4, 3), (2, 8))
    model = const_model({1: 2.0, 4: 0.75}, startup_s=1, sync_s=0.5)
    result = run(spec, [4, 8], model, const_cloud(granularity_s=0.5, minimum_s=0))
    # Stage 0 ends at 10 + 5 + 7 + 0.5 = 22.5; stage 1 at 22.5 + 10 + 5 + (1 + 8 * 0.75) + 0.5 = 45.
    assert result.jct_s[0] == pytest.approx(45, **EXACT)
    assert result.instances == (1, 2)
    assert [s.new_instances for s in result.stages] == [1, 1]
    assert [s.mean_duration_s for s in result.stages] == pytest.approx([22.5, 22.5], **EXACT)
    # Instance 0 lives 10 -> 45 (35 s), instance 1 from 32.5 to 45 (12.5 s).
    assert result.cost_usd[0] == pytest.approx(usd(35 + 12.5), **EXACT)
    # Stage 1 pays for instance 0 during the new instance's SCALE and INIT too.
    assert result.stages[1].mean_cost_usd == pytest.approx(usd(22.5 + 12.5), **EXACT)


def test_instances_launched_together_initialise_slower_by_the_contention():
    # init_contention_s (DESIGN §4, optional): each INIT of a scale-up of n new instances is
    # c * (n - 1) longer (instances sharing one machine's CPUs). Stage 0: 8 trials x 1 GPU on
    # two 4-GPU instances launched together; stage 1: 16 GPUs, two more launched together.
    spec = stages((8, 3), (4, 8))
    model = const_model({1: 2.0, 4: 0.75}, startup_s=1, sync_s=0.5)
    alone = run(spec, [8, 16], model, const_cloud(granularity_s=0.5, minimum_s=0))
    result = run(spec, [8, 16], model, const_cloud(granularity_s=0.5, minimum_s=0, init_contention_s=1.5))
    assert [s.new_instances for s in result.stages] == [2, 2]
    assert result.jct_s[0] == pytest.approx(alone.jct_s[0] + 2 * 1.5, **EXACT)
    assert [s.mean_duration_s for s in result.stages] == pytest.approx([10 + 6.5 + 7 + 0.5, 10 + 6.5 + 7 + 0.5], **EXACT)
    # billed from the end of SCALE, so the longer INITs are paid: 2 x 1.5 s more in stage 0,
    # and in stage 1 four instances' 1.5 s
    assert result.cost_usd[0] == pytest.approx(alone.cost_usd[0] + usd(2 * 1.5 + 4 * 1.5), **EXACT)
    # one instance alone: no contention
    one = run(stages((4, 3)), [4], model, const_cloud(init_contention_s=1.5))
    assert one.jct_s[0] == run(stages((4, 3)), [4], model, const_cloud()).jct_s[0]
    ref_jct, _ = reference_simulate(spec, [8, 16], model, const_cloud(granularity_s=0.5, minimum_s=0, init_contention_s=1.5),
                                    samples=2, seed=0)
    assert ref_jct[0] == pytest.approx(result.jct_s[0], **EXACT)
    graph = build_dag(spec, [8, 16], model, const_cloud(init_contention_s=1.5))
    assert longest_path(graph) == pytest.approx(result.jct_s[0], **EXACT)


def test_scale_down_releases_at_the_sync():
    # G = 1: stage 0 holds 3 instances, stage 1 one; two are released at stage 0's SYNC.
    spec = stages((3, 4), (1, 6))
    model = const_model({1: 2.0}, startup_s=1, sync_s=0.5)
    result = run(spec, [3, 1], model, const_cloud(gpus_per_instance=1, granularity_s=0.5, minimum_s=0))
    # Stage 0: 10 + 5 + 9 + 0.5 = 24.5. Stage 1: 13 + 0.5 -> 38.
    assert result.jct_s[0] == pytest.approx(38, **EXACT)
    assert result.instances == (3, 1)
    assert [s.new_instances for s in result.stages] == [3, 0]
    # Two instances live 10 -> 24.5, one 10 -> 38.
    assert result.cost_usd[0] == pytest.approx(usd(2 * 14.5 + 28), **EXACT)
    assert result.stages[0].mean_cost_usd == pytest.approx(usd(3 * 14.5), **EXACT)


def lifo_plan():
    # G = 1, $1 per second. Instances held: 1, then 3, then 2.
    #   stage 0: SCALE 0-10, INIT -15, 4 queued trials of 10 s -> 55
    #   stage 1: SCALE 55-65 (2 new), INIT -70, trials of 30 s -> 100
    #   stage 2: release one at 100, trials of 20 s -> 120
    spec = stages((4, 10), (3, 30), (2, 20))
    return spec, [1, 3, 2], const_model({1: 1.0})


def test_scale_down_is_last_in_first_out():
    spec, allocation, model = lifo_plan()
    cloud = const_cloud(gpus_per_instance=1, price_usd_per_hour=3600, granularity_s=100, minimum_s=0)
    result = run(spec, allocation, model, cloud)
    assert result.jct_s[0] == pytest.approx(120, **EXACT)
    # LIFO releases one of the two instances launched at 65: lifetimes 110, 55 and 35, billed in
    # units of 100 s: 200 + 100 + 100. Releasing the oldest instead would bill 90, 55, 55 -> 300.
    assert result.cost_usd[0] == pytest.approx(400, **EXACT)
    timeline = sample_timeline(spec, allocation, model, cloud)
    assert [(s.launched_s, s.released_s) for s in timeline.instances] == [(10, 120), (65, 120), (65, 100)]


def test_lifo_and_fifo_bill_the_same_unrounded_seconds():
    spec, allocation, model = lifo_plan()
    cloud = const_cloud(gpus_per_instance=1, price_usd_per_hour=3600, granularity_s=1, minimum_s=0)
    result = run(spec, allocation, model, cloud)
    assert result.cost_usd[0] == pytest.approx(110 + 55 + 35, **EXACT)


@pytest.mark.parametrize(
    ("granularity", "minimum", "init", "billed"),
    [
        (60, 0, 5, 120),     # lifetime 61 s -> two 60 s units
        (60, 0, 4, 60),      # exactly 60 s -> one unit, no float-induced extra
        (60, 90, 5, 120),    # the minimum is below the rounded time
        (1, 90, 5, 90),      # the minimum wins
        (1, 0, 5, 61),
    ],
)
def test_billing_granularity_and_minimum(granularity, minimum, init, billed):
    # One trial of 28 iterations x 2 s: the instance lives init + 56 s.
    result = run(stages((1, 28)), [1], const_model({1: 2.0}),
                 const_cloud(gpus_per_instance=1, price_usd_per_hour=3600, init_s=init, granularity_s=granularity,
                             minimum_s=minimum))
    assert result.jct_s[0] == pytest.approx(10 + init + 56, **EXACT)
    assert result.cost_usd[0] == pytest.approx(billed, **EXACT)


def test_data_cost_per_launch_including_a_relaunch():
    # G = 1: 2 instances, then 1 (one released), then 2 (one launched again): 3 launches.
    # The data cost is what a dataset adds to the same plan without one.
    spec = stages((2, 1), (1, 1), (1, 1))
    model = const_model({1: 2.0, 2: 1.0})
    cloud = const_cloud(gpus_per_instance=1, dataset_gb=150, usd_per_gb=0.02)
    no_data = const_cloud(gpus_per_instance=1)
    result, base = run(spec, [2, 1, 2], model, cloud), run(spec, [2, 1, 2], model, no_data)
    assert result.instances == (2, 1, 2)
    assert [s.new_instances for s in result.stages] == [2, 0, 1]
    assert result.cost_usd[0] - base.cost_usd[0] == pytest.approx(3 * 150 * 0.02, **EXACT)
    assert [s.mean_cost_usd - b.mean_cost_usd for s, b in zip(result.stages, base.stages)] == \
        pytest.approx([2 * 3.0, 0.0, 3.0], **EXACT)
    # Data is charged under per-function billing too.
    per_function = Billing(BillingModel.PER_FUNCTION)
    with_data = run(spec, [2, 1, 2], model, cloud.replace(billing=per_function)).cost_usd[0]
    assert with_data - run(spec, [2, 1, 2], model, no_data.replace(billing=per_function)).cost_usd[0] == \
        pytest.approx(9.0, **EXACT)


def test_per_function_billing_charges_only_train_work():
    # Stage 0: 4 trials queue on 2 GPUs (m = 1), each TRAIN 1 + 3 * 2 = 7 s.
    # Stage 1: 2 trials x 4 GPUs, each TRAIN 1 + 8 * 0.75 = 7 s.
    spec = stages((4, 3), (2, 8))
    model = const_model({1: 2.0, 4: 0.75}, startup_s=1, sync_s=0.5)
    gpu_seconds = 4 * 1 * 7 + 2 * 4 * 7
    cost = usd(gpu_seconds) / 4
    slow = const_cloud(per_function=True)
    result = run(spec, [2, 8], model, slow)
    assert result.cost_usd[0] == pytest.approx(cost, **EXACT)
    assert [s.mean_cost_usd for s in result.stages] == pytest.approx([usd(28) / 4, usd(56) / 4], **EXACT)
    # SCALE, INIT, SYNC and idle GPUs cost nothing: slower provisioning changes JCT, not cost.
    slower = const_cloud(per_function=True, provision_s=500, init_s=300)
    other = run(spec, [2, 8], const_model({1: 2.0, 4: 0.75}, startup_s=1, sync_s=50), slower)
    assert other.jct_s[0] > result.jct_s[0] + 1000
    assert other.cost_usd[0] == pytest.approx(cost, **EXACT)


def test_explicit_instances_static_cluster():
    # Needs (2, 1, 1) instances of G = 4; a static cluster holds 3 in every stage.
    spec = stages((8, 2), (4, 2), (2, 2))
    model = const_model({1: 2.0}, startup_s=1, sync_s=0.5)
    cloud = const_cloud(granularity_s=0.5, minimum_s=0)
    static = run(spec, [8, 4, 2], model, cloud, instances=[3, 3, 3])
    # One SCALE only: 10 + 5 + 5 + 0.5, then 5.5 twice.
    assert static.jct_s[0] == pytest.approx(31.5, **EXACT)
    assert static.instances == (3, 3, 3)
    assert [s.new_instances for s in static.stages] == [3, 0, 0]
    assert static.cost_usd[0] == pytest.approx(usd(3 * 21.5), **EXACT)
    elastic = run(spec, [8, 4, 2], model, cloud)
    assert elastic.instances == (2, 1, 1)
    assert elastic.jct_s[0] == pytest.approx(31.5, **EXACT)
    assert elastic.cost_usd[0] == pytest.approx(usd(10.5 + 21.5), **EXACT)


@pytest.mark.parametrize(("instances", "stage"), [([1, 1, 1], 0), ([3, 0, 3], 1), ([2, 2, -1], 2)])
def test_explicit_instances_below_need(instances, stage):
    spec = stages((8, 2), (4, 2), (2, 2))
    with pytest.raises(SpecError, match=rf"instances\[{stage}\]: .* cannot hold stage {stage}; it needs at least"):
        simulate(spec, [8, 4, 2], const_model({1: 2.0}), const_cloud(), samples=2, instances=instances)


@pytest.mark.parametrize(
    ("num_trials", "allocation", "gpus", "instances"),
    [
        (1, 8, 8, 2),      # 8 GPUs on G = 4: two whole instances
        (2, 16, 8, 4),
        (1, 12, 12, 3),
        (3, 9, 3, 3),      # m = 3 <= G: floor(4 / 3) = 1 trial per instance
        (3, 6, 2, 2),      # m = 2: two trials per instance
    ],
)
def test_trial_workers_stay_together(num_trials, allocation, gpus, instances):
    model = const_model({1: 4.0, 2: 2.5, 3: 2.0, 8: 1.0, 12: 0.75, 16: 0.5}, startup_s=1, sync_s=0.5)
    result = run(stages((num_trials, 4)), [allocation], model, const_cloud(granularity_s=0.5, minimum_s=0))
    assert result.stages[0].gpus_per_trial == gpus
    assert result.instances == (instances,)
    train = 1 + 4 * model.latency(gpus).mean
    assert result.jct_s[0] == pytest.approx(15 + train + 0.5, **EXACT)
    assert result.cost_usd[0] == pytest.approx(usd(instances * (5 + train + 0.5)), **EXACT)


def test_stage_breakdown_adds_up():
    spec, allocation, model = lifo_plan()
    result = run(spec, allocation, model, const_cloud(gpus_per_instance=1, granularity_s=100, minimum_s=0))
    assert sum(s.mean_duration_s for s in result.stages) == pytest.approx(result.mean_jct_s, **EXACT)
    assert sum(s.mean_cost_usd for s in result.stages) == pytest.approx(result.mean_cost_usd, **EXACT)


# --- b. against the per-sample reference implementation -----------------------------------

RANDOM_MODEL = ModelProfile(
    {1: Normal(4.0, 1.0), 2: Normal(2.2, 0.5), 4: LogNormal(1.3, 0.4), 8: Empirical((0.5, 0.7, 0.8, 1.4))},
    trial_startup_s=Normal(3.0, 1.0), sync_s=Normal(1.0, 0.3), name="random",
)


random_cloud = partial(cloud_profile, spot_price_usd_per_hour=3.0, granularity_s=60.0, minimum_s=60.0,
                       provision_s=Normal(30.0, 8.0), init_s=Normal(20.0, 6.0), dataset_gb=1.0, usd_per_gb=0.09)


SHA16 = ExperimentSpec.sha(16, 2, 40, 2)     # 16x2 8x4 4x8 2x16 1x10

def std_rel_se(x: np.ndarray) -> float:
    """Relative standard error of the sample std (delta method on the sample variance)."""
    s = x.std()
    m4 = np.mean((x - x.mean()) ** 4)
    return float(np.sqrt(max(m4 - s**4, 0.0) / x.size) / (2 * s * s)) if s > 0 else 0.0


def assert_same_distribution(ref: np.ndarray, got: np.ndarray) -> None:
    """Means within 3 standard errors of their difference; stds within 10%.

    A coarsely rounded cost takes only a handful of values and its sample std is noisier;
    the std tolerance widens to 4 standard errors of the ratio when that is more than 10%.
    """
    se = np.sqrt(ref.var(ddof=1) / ref.size + got.var(ddof=1) / got.size)
    assert abs(ref.mean() - got.mean()) <= 3 * se + 1e-9
    rel = max(0.10, 4 * float(np.hypot(std_rel_se(ref), std_rel_se(got))))
    assert got.std() == pytest.approx(ref.std(), rel=rel, abs=1e-9)


SCENARIOS = {
    # every trial runs at once; instances 4, 2, 2, 2, 2
    "parallel": ((16, 8, 8, 4, 8), None, random_cloud()),
    # queues in stages 0-3 (16 on 5 GPUs, ...), then a scale-up for 8 GPUs in stage 4
    "queues-and-scale-up": ((5, 3, 2, 1, 8), None, random_cloud()),
    # instances 1, 4, 1, 2, 1: up, down, up, down, with coarse rounding and a high minimum
    "up-down-up": ((3, 16, 4, 8, 2), None, random_cloud(granularity_s=300.0, minimum_s=120.0)),
    # a static cluster of 4 instances, billed to the second
    "static": ((8, 8, 8, 8, 8), [4, 4, 4, 4, 4], random_cloud(granularity_s=1.0, minimum_s=0.0)),
    "per-function": ((16, 8, 8, 4, 8), None, random_cloud(per_function=True)),
    "spot-empirical-init": (
        (6, 16, 4, 4, 4), None,
        random_cloud(market=Market.SPOT, init_s=Empirical((5.0, 9.0, 40.0)), provision_s=LogNormal(30.0, 20.0)),
    ),
}


@pytest.mark.parametrize(("allocation", "instances", "cloud"), SCENARIOS.values(), ids=SCENARIOS.keys())
def test_simulate_agrees_with_the_reference_in_distribution(allocation, instances, cloud):
    ref_jct, ref_cost = reference_simulate(SHA16, allocation, RANDOM_MODEL, cloud, samples=600, seed=11,
                                           instances=instances)
    sim = simulate(SHA16, allocation, RANDOM_MODEL, cloud, samples=3000, seed=12, instances=instances)
    for ref, got in ((ref_jct, sim.jct_s), (ref_cost, sim.cost_usd)):
        assert_same_distribution(ref, got)


def test_reference_matches_exact_answers_on_deterministic_profiles():
    spec, allocation, model = lifo_plan()
    cloud = const_cloud(gpus_per_instance=1, price_usd_per_hour=3600, granularity_s=100, minimum_s=0)
    ref = run_once(spec, allocation, model, cloud, np.random.default_rng(0))
    assert (ref.jct_s, ref.cost_usd) == (pytest.approx(120), pytest.approx(400))
    sim = run(spec, allocation, model, cloud)
    assert sim.jct_s[0] == pytest.approx(ref.jct_s, **EXACT)
    assert sim.cost_usd[0] == pytest.approx(ref.cost_usd, **EXACT)


# --- a2. redone iterations: a function trainable that checkpoints every c reports ------------

HB = ExperimentSpec.chain(ExperimentSpec.hyperband(1, 9, 3))     # 9x1 3x3 1x5 | 5x3 1x6 | 3x9


@pytest.mark.parametrize(("spec", "every", "redone"), [
    (SHA16, 1, (0, 0, 0, 0, 0)),                      # D = 0 2 6 14 30
    (SHA16, 3, (0, 2, 0, 2, 0)),
    (SHA16, 4, (0, 2, 2, 2, 2)),
    (SHA16, None, (0, 2, 6, 14, 30)),                 # never: all of D, from scratch
    (HB, 2, (0, 1, 0, 0, 1, 0)),                      # D restarts at each bracket: 0 1 4 | 0 3 | 0
    (HB, None, (0, 1, 4, 0, 3, 0)),
])
def test_redone_iters_are_d_mod_c_within_a_bracket(spec, every, redone):
    model = RANDOM_MODEL.replace(checkpoint_every=every)
    assert redone_iters(spec, model) == redone
    shapes, _ = layout(spec, [s.num_trials for s in spec.stages], model, random_cloud(gpus_per_instance=8))
    assert [s.iters for s in shapes] == [s.iters + r for s, r in zip(spec.stages, redone)]
    assert [s.own_iters for s in shapes] == list(spec.iters)


def test_a_resumed_stage_trains_its_redone_iterations_exactly():
    # 2 trials x 4, then 1 x 4; TRAIN = 1 + iters * 2, SYNC 0.5; SCALE 10 + INIT 5 once.
    spec = stages((2, 4), (1, 4))
    cloud = const_cloud(granularity_s=0.5, minimum_s=0)
    for every, redo in ((1, 0), (3, 1), (2, 0), (None, 4)):
        model = const_model({1: 2.0}, startup_s=1, sync_s=0.5).replace(checkpoint_every=every)
        result = run(spec, [2, 1], model, cloud)
        assert result.jct_s[0] == pytest.approx(15 + 9.5 + 1 + (4 + redo) * 2 + 0.5, **EXACT), every
        assert [(s.iters, s.redone) for s in result.stages] == [(4, 0), (4, redo)]
        ref = run_once(spec, [2, 1], model, cloud, np.random.default_rng(0))
        assert (ref.jct_s, ref.cost_usd) == (pytest.approx(result.jct_s[0], **EXACT),
                                             pytest.approx(result.cost_usd[0], **EXACT))


@pytest.mark.parametrize("every", [3, None], ids=["every-3", "never"])
@pytest.mark.parametrize(("allocation", "instances", "cloud"), [SCENARIOS["queues-and-scale-up"],
                                                                SCENARIOS["per-function"]],
                         ids=["queues-and-scale-up", "per-function"])
def test_simulate_with_redone_iterations_agrees_with_the_reference(allocation, instances, cloud, every):
    model = RANDOM_MODEL.replace(checkpoint_every=every)
    ref_jct, ref_cost = reference_simulate(SHA16, allocation, model, cloud, samples=600, seed=11, instances=instances)
    sim = simulate(SHA16, allocation, model, cloud, samples=3000, seed=12, instances=instances)
    for ref, got in ((ref_jct, sim.jct_s), (ref_cost, sim.cost_usd)):
        assert_same_distribution(ref, got)
    # ... and it is a different answer from checkpointing at every report.
    plain = simulate(SHA16, allocation, RANDOM_MODEL, cloud, samples=3000, seed=12, instances=instances)
    assert sim.mean_jct_s > plain.mean_jct_s


def test_redone_iterations_in_the_dag_and_an_explicit_override():
    model = const_model({1: 4.0, 2: 2.2, 4: 1.3, 8: 0.8}, startup_s=3, sync_s=1).replace(checkpoint_every=3)
    cloud = const_cloud(provision_s=30, init_s=20)
    graph = build_dag(SHA16, (5, 3, 2, 1, 8), model, cloud)
    result = run(SHA16, (5, 3, 2, 1, 8), model, cloud)
    assert longest_path(graph) == pytest.approx(result.jct_s[0], **EXACT)
    # A re-plan's remaining stages pass the job's redone counts (its own spec starts a bracket).
    tail = ExperimentSpec(SHA16.stages[1:])
    assert redone_iters(tail, model) == (0, 1, 0, 1)
    given = run(tail, (3, 2, 1, 8), model, cloud, redone=(2, 0, 2, 0))
    assert [s.redone for s in given.stages] == [2, 0, 2, 0]
    with pytest.raises(SpecError, match="redone: expected 4 counts"):
        simulate(tail, (3, 2, 1, 8), model, cloud, samples=2, redone=(2, 0))


# --- b. the task graph --------------------------------------------------------------------

DAG_PLANS = {
    "queues-and-scale-up": (SHA16, (5, 3, 2, 1, 8), None),
    "up-down-up": (SHA16, (3, 16, 4, 8, 2), None),
    "static": (SHA16, (8, 8, 8, 8, 8), [4, 4, 4, 4, 4]),
    "explicit-growth": (SHA16, (16, 8, 4, 2, 1), [4, 5, 5, 6, 6]),
    "hyperband": (ExperimentSpec.chain(ExperimentSpec.hyperband(1, 9, 3)), (9, 3, 1, 5, 1, 3), None),
}


def node_latency(data: dict) -> float:
    if data["type"] == "TRAIN":
        return data["startup"].mean + data["iters"] * data["iter_latency"].mean
    return data["latency"].mean + data.get("together_s", 0.0)


def longest_path(graph: nx.DiGraph) -> float:
    finish: dict = {}
    for node in nx.topological_sort(graph):
        start = max((finish[p] for p in graph.predecessors(node)), default=0.0)
        finish[node] = start + node_latency(graph.nodes[node])
    return max(finish.values())


@pytest.mark.parametrize(("spec", "allocation", "instances"), DAG_PLANS.values(), ids=DAG_PLANS.keys())
def test_dag_nodes_and_edges(spec, allocation, instances):
    cloud = random_cloud()
    graph = build_dag(spec, allocation, RANDOM_MODEL, cloud, instances=instances)
    shapes, held = layout(spec, allocation, RANDOM_MODEL, cloud, instances)
    ref = run_once(spec, allocation, RANDOM_MODEL, cloud, np.random.default_rng(0), instances)

    assert nx.is_directed_acyclic_graph(graph)
    by_type = Counter(d["type"] for _, d in graph.nodes(data=True))
    assert dict(by_type) == {k: v for k, v in ref.nodes.items() if v}
    assert by_type["INIT_INSTANCE"] == ref.launches
    assert tuple(held) == ref.instances
    assert graph.graph["allocation"] == tuple(allocation)
    assert graph.graph["instances"] == tuple(held)
    # Only the last SYNC has no successor.
    assert [n for n in graph if graph.out_degree(n) == 0] == [("SYNC", len(shapes) - 1)]
    launch_numbers = sorted(d["instance"] for _, d in graph.nodes(data=True) if d["type"] == "INIT_INSTANCE")
    assert launch_numbers == list(range(ref.launches))

    previous_sync = None
    for shape in shapes:
        i = shape.index
        sync = ("SYNC", i)
        assert graph.nodes[sync]["type"] == "SYNC"
        assert graph.nodes[sync]["stage"] == i
        assert isinstance(graph.nodes[sync]["latency"], Distribution)
        scale = ("SCALE", i)
        inits = [n for n in graph if n[0] == "INIT_INSTANCE" and n[1] == i]
        if scale in graph:
            assert graph.nodes[scale]["new_instances"] == len(inits) > 0
            assert set(graph.predecessors(scale)) == ({previous_sync} if previous_sync else set())
            for node in inits:                                   # SCALE before every INIT
                assert set(graph.predecessors(node)) == {scale}
            first_parents = set(inits)
        else:
            assert not inits
            first_parents = {previous_sync}
        trains = [("TRAIN", i, t) for t in range(shape.num_trials)]
        for t, node in enumerate(trains):
            data = graph.nodes[node]
            assert (data["type"], data["stage"], data["trial"]) == ("TRAIN", i, t)
            assert (data["gpus"], data["iters"]) == (shape.gpus_per_trial, shape.iters)
            assert data["gpu_slot"] == t % shape.running
            assert data["iter_latency"] == RANDOM_MODEL.latency(shape.gpus_per_trial)
            assert data["startup"] == RANDOM_MODEL.trial_startup_s
            if t < shape.running:                                # every new instance ready first
                assert set(graph.predecessors(node)) == first_parents
            else:                                                # queued: chained per GPU slot
                assert set(graph.predecessors(node)) == {("TRAIN", i, t - shape.running)}
            assert graph.has_edge(node, sync)                    # all TRAIN -> SYNC
        assert set(graph.predecessors(sync)) == set(trains)
        previous_sync = sync


@pytest.mark.parametrize(("spec", "allocation", "instances"), DAG_PLANS.values(), ids=DAG_PLANS.keys())
def test_dag_longest_path_is_the_jct_on_a_deterministic_profile(spec, allocation, instances):
    model = const_model({1: 4.0, 2: 2.2, 4: 1.3, 8: 0.8}, startup_s=3, sync_s=1)
    cloud = const_cloud(provision_s=30, init_s=20)
    graph = build_dag(spec, allocation, model, cloud, instances=instances)
    result = run(spec, allocation, model, cloud, instances=instances)
    assert longest_path(graph) == pytest.approx(result.jct_s[0], **EXACT)


# --- c. seeds and common random numbers ---------------------------------------------------

def test_same_seed_same_arrays_different_seed_different():
    cloud = random_cloud()
    a = simulate(SHA16, (5, 3, 2, 1, 8), RANDOM_MODEL, cloud, samples=200, seed=3)
    b = simulate(SHA16, (5, 3, 2, 1, 8), RANDOM_MODEL, cloud, samples=200, seed=3)
    c = simulate(SHA16, (5, 3, 2, 1, 8), RANDOM_MODEL, cloud, samples=200, seed=4)
    np.testing.assert_array_equal(a.jct_s, b.jct_s)
    np.testing.assert_array_equal(a.cost_usd, b.cost_usd)
    assert a.seed == 3
    assert not np.array_equal(a.jct_s, c.jct_s)
    assert not np.array_equal(a.cost_usd, c.cost_usd)


def test_common_random_numbers_across_allocations():
    # The plans differ only in stage 2 (4 -> 8 GPUs for 4 trials); instances 4,2,1,1,1 vs
    # 4,2,2,1,1, so no other stage changes its SCALE/INIT.
    cloud = random_cloud()
    alloc_a, alloc_b = (16, 8, 4, 2, 1), (16, 8, 8, 2, 1)
    a = simulate(SHA16, alloc_a, RANDOM_MODEL, cloud, samples=500, seed=7)
    b = simulate(SHA16, alloc_b, RANDOM_MODEL, cloud, samples=500, seed=7)
    for i in (0, 1, 3, 4):
        assert a.stages[i].mean_duration_s == b.stages[i].mean_duration_s
    assert a.stages[2].mean_duration_s != b.stages[2].mean_duration_s

    # Per sample: the JCTs differ by exactly the difference of stage 2's makespans.
    shapes_a, _ = layout(SHA16, alloc_a, RANDOM_MODEL, cloud)
    shapes_b, _ = layout(SHA16, alloc_b, RANDOM_MODEL, cloud)
    draws = StageDraws(7, 2, 500)
    makespan_a, _ = draws.train(RANDOM_MODEL, shapes_a[2])
    makespan_b, _ = draws.train(RANDOM_MODEL, shapes_b[2])
    np.testing.assert_allclose(b.jct_s - a.jct_s, makespan_b - makespan_a, rtol=0, atol=1e-9)


def test_passing_draws_reuses_them():
    cloud = random_cloud()
    draws = [StageDraws(5, i, 300) for i in range(SHA16.num_stages())]
    a = simulate(SHA16, (16, 8, 8, 4, 8), RANDOM_MODEL, cloud, samples=300, draws=draws)
    b = simulate(SHA16, (16, 8, 8, 4, 8), RANDOM_MODEL, cloud, samples=300, seed=5)
    np.testing.assert_array_equal(a.jct_s, b.jct_s)


def test_reused_draws_follow_the_model():
    # A what-if sweep reuses one set of draws across model profiles built one after another;
    # CPython hands a new profile the id of the one just freed. Retry until that happens.
    spec = stages((4, 10))
    cloud = const_cloud(provision_s=1, init_s=1)
    for _ in range(100):
        draws = [StageDraws(0, 0, 200)]
        first = ModelProfile({1: Normal(1.0, 0.01)})
        simulate(spec, [4], first, cloud, samples=200, draws=draws)
        old_id = id(first)
        latency = {1: Normal(5.0, 0.01)}
        del first
        second = ModelProfile(latency)
        if id(second) == old_id:
            break
    else:
        pytest.skip("the interpreter did not reuse a freed profile's id")
    result = simulate(spec, [4], second, cloud, samples=200, draws=draws)
    assert result.mean_jct_s == pytest.approx(2 + 10 * 5.0, abs=0.5)


# --- d. one sampled timeline --------------------------------------------------------------

@pytest.mark.parametrize("name", ["parallel", "queues-and-scale-up", "up-down-up", "static"])
@pytest.mark.parametrize("seed", [0, 1, 17])
def test_sample_timeline_jct_equals_simulate(name, seed):
    allocation, instances, cloud = SCENARIOS[name]
    timeline = sample_timeline(SHA16, allocation, RANDOM_MODEL, cloud, seed=seed, instances=instances)
    single = simulate(SHA16, allocation, RANDOM_MODEL, cloud, samples=1, seed=seed, instances=instances)
    assert timeline.jct_s == pytest.approx(single.jct_s[0], **EXACT)
    assert timeline.cost_usd == pytest.approx(single.cost_usd[0], **EXACT)
    assert len(timeline.trials) == sum(SHA16.trials)
    assert len(timeline.stages) == SHA16.num_stages()
    assert timeline.stages[-1][2] == timeline.jct_s
    for span in timeline.instances:
        assert span.requested_s <= span.launched_s <= span.ready_s <= span.released_s <= timeline.jct_s
    for trial in timeline.trials:
        start, trials_start, end = timeline.stages[trial.stage]
        assert trials_start <= trial.start_s <= trial.end_s <= end


# --- e. bad allocation vectors ------------------------------------------------------------

@pytest.fixture(scope="module")
def paper_job():
    spec = ExperimentSpec.sha(32, 1, 50, 3)                 # 32x1 10x3 3x9 1x37
    model = ModelProfile.load(ROOT / "profiles" / "resnet101_cifar10_p3.yaml")   # 1..32 GPUs
    cloud = CloudProfile.load(AWS, "p3.8xlarge")
    return spec, model, cloud


@pytest.mark.parametrize(
    ("allocation", "pattern"),
    [
        ((32, 20, 12), r"^allocation: has 3 entries but the experiment has 4 stages"),
        ((32, 20, 12, 8, 4), r"^allocation: has 5 entries but the experiment has 4 stages"),
        ((0, 20, 12, 8), r"^allocation\[0\]: 0 GPUs for 32 trials is outside the valid range 1\.\.1024 "),
        ((32, -1, 12, 8), r"^allocation\[1\]: -1 GPUs for 10 trials is outside the valid range 1\.\.320 "),
        ((32, 20, 12, 33), r"^allocation\[3\]: 33 GPUs for 1 trials is outside the valid range 1\.\.32 "),
        ((32, 20, 99, 8), r"^allocation\[2\]: 99 GPUs for 3 trials is outside the valid range 1\.\.96 .*covers 1\.\.32 GPUs per trial"),
        ((2.5, 20, 12, 8), r"^allocation\[0\]: expected a whole number of GPUs in 1\.\.\d+ for 32 trials, got 2\.5"),
        (("4", 20, 12, 8), r"^allocation\[0\]: expected a whole number of GPUs in 1\.\.\d+ for 32 trials, got '4'"),
        ((32, True, 12, 8), r"^allocation\[1\]: expected a whole number of GPUs"),
        ("32,20,12,8", r"^allocation: expected one GPU count per stage"),
        (32, r"^allocation: expected one GPU count per stage"),
    ],
)
def test_bad_allocations(paper_job, allocation, pattern):
    spec, model, cloud = paper_job
    with pytest.raises(SpecError, match=pattern):
        simulate(spec, allocation, model, cloud, samples=2)


@pytest.mark.parametrize("bad", [2.5, "4"])
def test_non_integer_allocation_names_the_valid_range(paper_job, bad):
    spec, model, cloud = paper_job
    with pytest.raises(SpecError, match=r"allocation\[0\].*1\.\.1024"):
        simulate(spec, (bad, 20, 12, 8), model, cloud, samples=2)


def test_allocation_below_the_smallest_profiled_count(paper_job):
    spec, _, cloud = paper_job
    model = ModelProfile({2: Constant(2.0), 8: Constant(0.7)}, name="from-2")
    with pytest.raises(SpecError, match=r"^allocation\[0\]: 32 GPUs for 32 trials is outside the valid range 64\.\.256"):
        simulate(spec, (32, 20, 12, 8), model, cloud, samples=2)


def test_integral_allocations_of_other_types_are_accepted(paper_job):
    spec, model, cloud = paper_job
    result = simulate(spec, np.array([32, 20, 12, 8]), model, cloud, samples=2)
    assert result.allocation == (32, 20, 12, 8)
    assert simulate(spec, (np.int64(32), 20, 12.0, 8), model, cloud, samples=2).allocation == (32, 20, 12, 8)


@pytest.mark.parametrize(
    ("allocation", "instances", "pattern"),
    [
        # 32 trials of floor(33/32) = 1 GPU fill eight 4-GPU instances: the 33rd GPU is on none.
        ((33, 20, 12, 8), None, r"^allocation\[0\]: 33 GPUs do not fit on the 8 p3\.8xlarge instances \(32 GPUs\).*give 32 GPUs"),
        ((32, 23, 12, 8), None, r"^allocation\[1\]: 23 GPUs do not fit on the 5 p3\.8xlarge instances \(20 GPUs\)"),
        ((32, 20, 13, 8), (8, 5, 3, 2), r"^allocation\[2\]: 13 GPUs do not fit on the 3 p3\.8xlarge instances \(12 GPUs\)"),
    ],
)
def test_allocations_the_instances_cannot_hold(paper_job, allocation, instances, pattern):
    spec, model, cloud = paper_job
    with pytest.raises(SpecError, match=pattern):
        simulate(spec, allocation, model, cloud, samples=2, instances=instances)


def test_spare_gpus_on_the_instances_held_are_a_valid_allocation(paper_job):
    spec, model, cloud = paper_job
    # 33 one-GPU trials' worth on nine instances, and a 9-GPU trial on three 4-GPU instances.
    result = simulate(spec, (33, 20, 12, 9), model, cloud, samples=2, instances=(9, 5, 3, 3))
    assert result.instances == (9, 5, 3, 3)
    assert [s.gpus_per_trial for s in result.stages] == [1, 2, 4, 9]


@pytest.mark.parametrize(
    ("instances", "pattern"),
    [
        ((8, 5, 3), r"^instances: expected 4 instance counts, one per stage"),
        ("8532", r"^instances: expected 4 instance counts"),
        ((8, 5, 3, 1), r"^instances\[3\]: 1 cannot hold stage 3; it needs at least 2 p3\.8xlarge instances for 8 GPUs"),
        ((7, 5, 3, 2), r"^instances\[0\]: 7 cannot hold stage 0; it needs at least 8"),
        ((8, 5, "3", 2), r"^instances\[2\]: '3' cannot hold stage 2"),
    ],
)
def test_bad_instance_vectors(paper_job, instances, pattern):
    spec, model, cloud = paper_job
    with pytest.raises(SpecError, match=pattern):
        simulate(spec, (32, 20, 12, 8), model, cloud, samples=2, instances=instances)


def test_scalar_instances_is_a_spec_error(paper_job):
    spec, model, cloud = paper_job
    with pytest.raises(SpecError, match="instances"):
        simulate(spec, (32, 20, 12, 8), model, cloud, samples=2, instances=8)


def test_integral_float_instances_are_accepted_like_allocations(paper_job):
    spec, model, cloud = paper_job
    assert simulate(spec, (32, 20, 12, 8), model, cloud, samples=2, instances=(8, 5, 3, 2.0)).instances == (8, 5, 3, 2)


@pytest.mark.parametrize("samples", [0, -5, 2.5, True])
def test_bad_sample_counts(paper_job, samples):
    spec, model, cloud = paper_job
    with pytest.raises(SpecError, match=r"^samples: expected a positive integer"):
        simulate(spec, (32, 20, 12, 8), model, cloud, samples=samples)


# --- f. the paper's §6.1 trends -----------------------------------------------------------

SHA64 = ExperimentSpec.sha(64, 4, 508, 2)
SHA64_ALLOCATION = (64, 32, 16, 8, 4, 2, 1)     # one GPU per trial throughout


def test_per_instance_premium_grows_with_stragglers():
    """Fig. 9: per-instance billing pays for GPUs idling behind stragglers; per-function does not."""
    per_instance = CloudProfile.load(AWS, "p3.8xlarge")
    per_function = per_instance.replace(billing=Billing(BillingModel.PER_FUNCTION))
    gaps = []
    for std in (1.0, 2.5, 5.0, 10.0):
        model = ModelProfile({1: Normal(4.0, std)}, Constant(5.0), Constant(1.0))
        a = simulate(SHA64, SHA64_ALLOCATION, model, per_instance, samples=300, seed=0)
        b = simulate(SHA64, SHA64_ALLOCATION, model, per_function, samples=300, seed=0)
        assert a.mean_cost_usd > b.mean_cost_usd
        gaps.append(a.mean_cost_usd - b.mean_cost_usd)
    assert all(x < y for x, y in zip(gaps, gaps[1:])), gaps
    assert gaps[-1] > 2 * gaps[0]


def test_data_price_dominates_for_imagenet_sized_data():
    """Fig. 10: downloading 150 GB per launch outweighs compute; 0.15 GB (CIFAR) does not."""
    model = ModelProfile.load(ROOT / "profiles" / "resnet50_cifar10_p3.yaml")
    cloud = CloudProfile.load(AWS, "p3.8xlarge")

    def data_share(gb: float, usd_per_gb: float) -> float:
        total = simulate(SHA64, SHA64_ALLOCATION, model, cloud.replace(data=DataCost(gb, usd_per_gb)),
                         samples=200, seed=0).mean_cost_usd
        compute = simulate(SHA64, SHA64_ALLOCATION, model, cloud.replace(data=DataCost(gb, 0.0)),
                           samples=200, seed=0).mean_cost_usd
        return 1 - compute / total

    prices = (0.01, 0.02, 0.04, 0.08, 0.16)
    imagenet = [data_share(150, p) for p in prices]
    cifar = [data_share(0.15, p) for p in prices]
    assert all(x < y for x, y in zip(imagenet, imagenet[1:]))
    assert all(share > 0.5 for p, share in zip(prices, imagenet) if p >= 0.04)
    assert all(share < 0.05 for share in cifar)


# --- g. SimResult -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def result() -> SimResult:
    return simulate(SHA16, (5, 3, 2, 1, 8), RANDOM_MODEL, random_cloud(), samples=500, seed=1)


def test_result_shape(result):
    assert result.samples == 500
    assert result.jct_s.shape == result.cost_usd.shape == (500,)
    assert result.allocation == (5, 3, 2, 1, 8)
    assert result.instances == (2, 1, 1, 1, 2)
    assert len(result.stages) == 5
    assert (result.jct_s > 0).all()
    assert (result.cost_usd > 0).all()


def test_p_meet_is_monotone_in_the_deadline(result):
    deadlines = np.concatenate([np.linspace(result.jct_s.min() - 10, result.jct_s.max() + 10, 50), result.jct_s[:20]])
    deadlines.sort()
    p = [result.p_meet(d) for d in deadlines]
    assert all(x <= y for x, y in zip(p, p[1:]))
    assert result.p_meet(result.jct_s.min() - 1e-3) == 0.0
    assert result.p_meet(result.jct_s.max()) == 1.0
    median = float(np.median(result.jct_s))
    assert result.p_meet(median) == pytest.approx(np.mean(result.jct_s <= median))


def test_summaries_match_numpy(result):
    assert result.mean_jct_s == pytest.approx(result.jct_s.mean(), **EXACT)
    assert result.mean_cost_usd == pytest.approx(result.cost_usd.mean(), **EXACT)
    assert result.p50_jct_s == pytest.approx(np.percentile(result.jct_s, 50), **EXACT)
    assert result.p90_jct_s == pytest.approx(np.percentile(result.jct_s, 90), **EXACT)
    assert result.p50_cost_usd == pytest.approx(np.percentile(result.cost_usd, 50), **EXACT)
    assert result.p90_cost_usd == pytest.approx(np.percentile(result.cost_usd, 90), **EXACT)
    assert result.p50_jct_s <= result.p90_jct_s
    assert result.summary() == {
        "jct_s_mean": result.mean_jct_s, "jct_s_p50": result.p50_jct_s, "jct_s_p90": result.p90_jct_s,
        "cost_usd_mean": result.mean_cost_usd, "cost_usd_p50": result.p50_cost_usd,
        "cost_usd_p90": result.p90_cost_usd,
    }


def test_to_dict(result):
    data = result.to_dict()
    assert set(data) == {
        "allocation", "instances", "samples", "seed", "jct_s_mean", "jct_s_p50", "jct_s_p90",
        "cost_usd_mean", "cost_usd_p50", "cost_usd_p90", "stages",
    }
    assert data["allocation"] == [5, 3, 2, 1, 8]
    assert data["samples"] == 500
    assert set(data["stages"][0]) == {
        "index", "num_trials", "iters", "allocation", "gpus_per_trial", "instances", "new_instances",
        "mean_duration_s", "mean_cost_usd", "spot_instances", "mean_reclaims", "trials_per_gpu", "instance_type",
    }
    full = result.to_dict(include_samples=True)
    assert full["jct_s"] == result.jct_s.tolist()
    assert len(full["cost_usd"]) == 500
