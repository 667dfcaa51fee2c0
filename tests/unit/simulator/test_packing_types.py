"""Packing (trials_per_gpu) and an instance type per stage in the simulator, its timeline and DAG."""

from __future__ import annotations

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
from rubberband.profiles import Constant, Normal
from rubberband.profiles.cloud import CloudCatalog
from rubberband.profiles.spot import SpotMarket
from rubberband.simulator import build_dag, simulate
from rubberband.simulator.trace import sample_timeline
from rubberband.testing.builders import cloud_profile
from rubberband.testing.reference_sim import reference_simulate

ROOT = Path(__file__).resolve().parents[3]
AWS = ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml"

L1 = 3.0
CONST_MODEL = ModelProfile({1: Constant(L1), 2: Constant(2.0)}, Constant(7.0), Constant(1.0), name="const",
                           packed_iter_latency_s={2: Constant(1.6 * L1), 4: Constant(2.2 * L1)},
                           gpu_memory_gb_per_trial=4.0)
RANDOM_MODEL = ModelProfile({1: Normal(4.0, 0.4), 2: Normal(2.2, 0.2), 4: Normal(1.3, 0.1), 8: Normal(0.8, 0.08)},
                            Normal(8.0, 1.0), Constant(1.0), name="m",
                            packed_iter_latency_s={2: Normal(6.4, 0.6), 4: Normal(8.8, 0.9)})


# Deterministic types (name, G, price): SCALE 10 s and INIT 5 s unless told, 16 GB GPUs, 1 GB of data a launch.
const_cloud = partial(cloud_profile, provision_s=10.0, init_s=5.0, dataset_gb=1.0, gpu_memory_gb=16.0)


def random_cloud(name: str, G: int, price: float, **changes) -> CloudProfile:
    """A type with drawn SCALE and INIT, spot at a third of ``price``."""
    return cloud_profile(name, G, price, spot_price_usd_per_hour=price / 3, provision_s=Normal(30.0, 8.0),
                         init_s=Normal(20.0, 6.0), dataset_gb=1.0, usd_per_gb=0.09, **changes)


SHA16 = ExperimentSpec.sha(16, 2, 40, 2)     # 16x2 8x4 4x8 2x16 1x10
TYPES = {"big": random_cloud("big", 4, 12.24), "small": random_cloud("small", 1, 3.06)}


# --- packing: exact answers ---------------------------------------------------------------

def test_the_issues_example_runs_all_sixteen_trials_at_once_at_the_packed_latency():
    spec = ExperimentSpec().add_stage(16, 10)
    result = simulate(spec, [4], CONST_MODEL, const_cloud("t.4gpu"), samples=3, trials_per_gpu=[4])
    # SCALE 10 + INIT 5, then start-up 7 + 10 iterations at 2.2 L1, then SYNC 1.
    assert result.jct_s.tolist() == [10 + 5 + 7 + 10 * 2.2 * L1 + 1] * 3
    # One 4-GPU instance, billed from its SCALE end to the end.
    assert result.cost_usd == pytest.approx([(result.jct_s[0] - 10) * 12.24 / 3600] * 3, rel=1e-12)
    assert result.instances == (1,) and result.trials_per_gpu == (4,)
    assert result.to_dict()["trials_per_gpu"] == [4]


def test_packed_trials_beyond_the_slots_queue_for_the_next_free_one():
    spec = ExperimentSpec().add_stage(16, 10)
    # 2 GPUs at 4 per GPU: 8 slots, two rounds of packed trials.
    result = simulate(spec, [2], CONST_MODEL, const_cloud("t.4gpu"), samples=2, trials_per_gpu=[4])
    assert result.jct_s.tolist() == [10 + 5 + 2 * (7 + 10 * 2.2 * L1) + 1] * 2


def test_packed_instances_hold_k_times_g_trials():
    spec = ExperimentSpec().add_stage(16, 10)
    # 1-GPU instances at 2 per GPU: 8 GPUs, 16 trials at once on 8 instances.
    result = simulate(spec, [8], CONST_MODEL, const_cloud("t.1gpu", 1, 3.06), samples=2, trials_per_gpu=[2])
    assert result.instances == (8,)
    assert result.jct_s.tolist() == [10 + 5 + 7 + 10 * 1.6 * L1 + 1] * 2


def test_per_function_billing_charges_a_packed_trial_a_kth_of_its_gpu():
    cloud = const_cloud("t.4gpu", per_function=True)
    spec = ExperimentSpec().add_stage(16, 10)
    result = simulate(spec, [4], CONST_MODEL, cloud, samples=2, trials_per_gpu=[4])
    train = 7 + 10 * 2.2 * L1
    assert result.cost_usd == pytest.approx([16 * train * 12.24 / 3600 / (4 * 4)] * 2, rel=1e-12)


@pytest.mark.parametrize("cloud", [const_cloud("t.4gpu"), random_cloud("big", 4, 12.24),
                                   random_cloud("big", 4, 12.24, market=Market.SPOT,
                                                spot=SpotMarket(notice_s=120, rate_per_hour=20.0))])
def test_one_trial_per_gpu_is_the_unpacked_model_bit_for_bit(cloud):
    model = CONST_MODEL if cloud.instance_type == "t.4gpu" else RANDOM_MODEL
    allocation = [5, 8, 4, 2, 1]
    plain = simulate(SHA16, allocation, model, cloud, samples=200, seed=4)
    ones = simulate(SHA16, allocation, model, cloud, samples=200, seed=4, trials_per_gpu=[1] * 5)
    assert np.array_equal(plain.jct_s, ones.jct_s) and np.array_equal(plain.cost_usd, ones.cost_usd)
    assert plain.to_dict() == ones.to_dict()


def test_packing_agrees_with_the_reference_in_distribution():
    cloud = random_cloud("big", 4, 12.24)
    allocation, packing = [4, 4, 4, 2, 1], [4, 2, 1, 1, 1]
    ref_jct, ref_cost = reference_simulate(SHA16, allocation, RANDOM_MODEL, cloud, samples=600, seed=11,
                                           trials_per_gpu=packing)
    sim = simulate(SHA16, allocation, RANDOM_MODEL, cloud, samples=3000, seed=12, trials_per_gpu=packing)
    for ref, got in ((ref_jct, sim.jct_s), (ref_cost, sim.cost_usd)):
        assert got.mean() == pytest.approx(ref.mean(), rel=0.01)


# --- packing: bad input -------------------------------------------------------------------

@pytest.mark.parametrize(("allocation", "packing", "pattern"), [
    ([32], [2], r"trials_per_gpu\[0\]: only 1-GPU trials are packed, and stage 0's allocation gives each trial 2 GPUs"),
    ([4], [3], r"trials_per_gpu\[0\]: 3 trials per GPU has no packed_iter_latency_s .*profiled: 1, 2, 4"),
    ([4], [0], r"trials_per_gpu\[0\]: expected a whole number of trials per GPU"),
    ([4], [2.5], r"trials_per_gpu\[0\]: expected a whole number"),
    ([4], [2, 2], r"trials_per_gpu: expected 1 trials per GPU, one per stage"),
    ([16], [4], r"allocation\[0\]: 16 GPUs do not fit on the 1 t.4gpu instances .* at 4 per GPU; give 4 GPUs"),
])
def test_bad_packing_is_one_error_naming_the_field(allocation, packing, pattern):
    spec = ExperimentSpec().add_stage(16, 10)
    with pytest.raises(SpecError, match=pattern):
        simulate(spec, allocation, CONST_MODEL, const_cloud("t.4gpu"), samples=2, trials_per_gpu=packing)


def test_packing_above_the_gpus_memory_is_refused():
    spec = ExperimentSpec().add_stage(16, 10)
    with pytest.raises(SpecError, match=r"trials_per_gpu\[0\]: 4 trials of 4 GB do not fit the 12 GB of one t.4gpu "
                                        r"GPU; pack at most 2"):
        simulate(spec, [4], CONST_MODEL, const_cloud("t.4gpu", gpu_memory_gb=12.0), samples=2, trials_per_gpu=[4])


# --- instance types per stage -------------------------------------------------------------

def test_a_change_of_type_releases_the_old_instances_and_launches_the_new_type():
    spec = ExperimentSpec().add_stage(4, 10).add_stage(1, 20)
    big = const_cloud("big", 4, 12.24, provision_s=10.0, init_s=5.0, usd_per_gb=0.5)
    small = const_cloud("small", 1, 3.06, provision_s=20.0, init_s=8.0, usd_per_gb=0.25)
    result = simulate(spec, [4, 1], CONST_MODEL, {"big": big, "small": small}, samples=2,
                      instance_types=["big", "small"])
    stage0 = 10 + 5 + 7 + 10 * L1 + 1                 # on big
    stage1 = 20 + 8 + 7 + 20 * L1 + 1                 # a fresh SCALE + INIT on small
    assert result.jct_s.tolist() == [stage0 + stage1] * 2
    big_usd = max(stage0 - 10, 60.0) * 12.24 / 3600 + 0.5          # released at stage 0's SYNC, minimum 60 s
    small_usd = (stage1 - 20) * 3.06 / 3600 + 0.25
    assert result.cost_usd == pytest.approx([big_usd + small_usd] * 2, rel=1e-12)
    assert [s.new_instances for s in result.stages] == [1, 1]
    assert result.to_dict()["instance_types"] == ["big", "small"]
    assert [s["instance_type"] for s in result.to_dict()["stages"]] == ["big", "small"]


def test_a_return_to_a_type_launches_afresh():
    spec = ExperimentSpec().add_stage(4, 10).add_stage(2, 10).add_stage(1, 10)
    types = {"big": const_cloud("big"), "small": const_cloud("small", 1, 3.06)}
    result = simulate(spec, [4, 2, 1], CONST_MODEL, types, samples=2, instance_types=["big", "small", "big"])
    assert [s.new_instances for s in result.stages] == [1, 2, 1]
    assert result.jct_s[0] == 3 * (10 + 5 + 7 + 1) + 30 * L1


def test_one_type_from_a_catalog_is_the_one_type_model_bit_for_bit():
    catalog = CloudCatalog.load(AWS)
    cloud = catalog.get("p3.8xlarge")
    allocation = [16, 8, 4, 2, 1]
    plain = simulate(SHA16, allocation, RANDOM_MODEL, cloud, samples=300, seed=5)
    typed = simulate(SHA16, allocation, RANDOM_MODEL, catalog, samples=300, seed=5, instance_types=["p3.8xlarge"] * 5)
    assert np.array_equal(plain.jct_s, typed.jct_s) and np.array_equal(plain.cost_usd, typed.cost_usd)


def test_types_agree_with_the_reference_in_distribution():
    allocation, types = [4, 8, 4, 2, 1], ["small", "big", "big", "small", "small"]
    clouds = [TYPES[t] for t in types]
    ref_jct, ref_cost = reference_simulate(SHA16, allocation, RANDOM_MODEL, clouds, samples=600, seed=11,
                                           trials_per_gpu=[4, 1, 1, 1, 1])
    sim = simulate(SHA16, allocation, RANDOM_MODEL, TYPES, samples=3000, seed=12, instance_types=types,
                   trials_per_gpu=[4, 1, 1, 1, 1])
    for ref, got in ((ref_jct, sim.jct_s), (ref_cost, sim.cost_usd)):
        assert got.mean() == pytest.approx(ref.mean(), rel=0.01)


@pytest.mark.parametrize(("cloud", "types", "pattern"), [
    (TYPES, ["big", "smal", "big", "big", "big"], r"instance_types\[1\]: 'smal' is not a known instance type "
                                                   r"\(did you mean `small`\?\); known: big, small"),
    (TYPES, None, r"instance_types: a catalog of instance types needs the type of each stage"),
    (TYPES, ["big"], r"instance_types: expected 5 instance type names, one per stage"),
    (TYPES["big"], ["big", "small", "big", "big", "big"], r"instance_types\[1\]: 'small' is not a known instance"),
    ({"big": TYPES["small"]}, ["big"] * 5, r"instance_types\[0\]: 'big' maps to a profile of small"),
])
def test_bad_instance_types_are_one_error(cloud, types, pattern):
    with pytest.raises(SpecError, match=pattern):
        simulate(SHA16, [4, 4, 4, 2, 1], RANDOM_MODEL, cloud, samples=2, instance_types=types)


def test_instances_are_counted_in_each_stages_type():
    with pytest.raises(SpecError, match=r"instances\[0\]: 1 cannot hold stage 0; it needs at least 4 small instances"):
        simulate(SHA16, [4, 4, 4, 2, 1], RANDOM_MODEL, TYPES, samples=2, instances=[1, 1, 1, 2, 1],
                 instance_types=["small", "big", "big", "small", "small"])


# --- the sampled timeline and the DAG -----------------------------------------------------

SPOT_TYPES = {name: c.replace(spot=SpotMarket(rate_per_hour=20.0)) for name, c in TYPES.items()}
PLANS = {
    "packed": ([4, 4, 4, 2, 1], [4, 2, 1, 1, 1], None, TYPES, None),
    "types": ([8, 8, 4, 2, 1], [1, 1, 1, 1, 1], ["small", "big", "big", "small", "big"], TYPES, None),
    "packed-types-static": ([2, 4, 4, 2, 1], [4, 2, 1, 1, 1], ["small", "small", "big", "big", "big"], TYPES,
                            [2, 4, 2, 1, 1]),
    "spot-packed-types": ([4, 4, 4, 2, 1], [4, 2, 1, 1, 1], ["small", "small", "big", "big", "small"], SPOT_TYPES,
                          None),
}


@pytest.mark.parametrize("name", PLANS)
def test_every_sample_of_a_packed_or_typed_plan_replays_the_simulation(name):
    allocation, packing, types, clouds, instances = PLANS[name]
    cloud = clouds if types else clouds["big"]
    spot = [1, 1, 0, 1, 1] if name.startswith("spot") else None
    result = simulate(SHA16, allocation, RANDOM_MODEL, cloud, samples=20, seed=3, trials_per_gpu=packing,
                      instance_types=types, instances=instances, spot_instances=spot)
    timelines = [sample_timeline(SHA16, allocation, RANDOM_MODEL, cloud, seed=3, samples=20, sample=k,
                                 trials_per_gpu=packing, instance_types=types, instances=instances,
                                 spot_instances=spot) for k in range(20)]
    # To the last bits: queues add up their TRAINs from the stage's start there, from 0 here.
    assert [t.jct_s for t in timelines] == pytest.approx(result.jct_s.tolist(), rel=1e-12)
    assert [t.cost_usd for t in timelines] == pytest.approx(result.cost_usd.tolist(), rel=1e-12)
    if spot:
        assert np.mean([t.reclaims for t in timelines]) == pytest.approx(sum(s.mean_reclaims for s in result.stages))
    for t in timelines:
        spans = {s.instance: s for s in t.instances}
        for trial in t.trials:
            stage_type = (types or ["big"] * 5)[trial.stage]
            assert all(spans[i].instance_type == stage_type for i in trial.instances)
            assert trial.trials_per_gpu == packing[trial.stage]
        # No GPU of an instance runs more than k trials at once.
        for (_, _, stage), bars in _by_gpu(t).items():
            events = sorted([(b.start_s, 1) for b in bars] + [(b.end_s, -1) for b in bars])
            assert max(np.cumsum([e for _, e in events])) <= packing[stage]


def _by_gpu(timeline):
    out: dict = {}
    for trial in timeline.trials:
        for instance in trial.instances:
            out.setdefault((instance, trial.gpu, trial.stage), []).append(trial)
    return out


def test_a_reclaim_interrupts_every_trial_packed_on_the_instance():
    cloud = SPOT_TYPES["small"].replace(market=Market.SPOT)
    spec = ExperimentSpec().add_stage(4, 200)
    for k in range(40):
        t = sample_timeline(spec, [1], RANDOM_MODEL, cloud, seed=1, samples=40, sample=k, trials_per_gpu=[4])
        cut = [trial for trial in t.trials if trial.lost_from_s is not None]
        if cut:
            # The four trials share the one GPU: the first reclaim cuts all four at that moment.
            first = min(c.end_s for c in cut)
            assert sorted(c.trial for c in cut if c.end_s == first) == [0, 1, 2, 3]
            return
    pytest.fail("no sample had a reclaim")


def node_latency(data: dict) -> float:
    if data["type"] == "TRAIN":
        return data["startup"].mean + data["iters"] * data["iter_latency"].mean
    return data["latency"].mean


def test_the_dag_of_a_packed_typed_plan_is_the_jct_on_a_deterministic_profile():
    spec = ExperimentSpec().add_stage(16, 10).add_stage(4, 10).add_stage(1, 20)
    types = {"big": const_cloud("big"), "small": const_cloud("small", 1, 3.06, provision_s=20.0, init_s=8.0)}
    kwargs = dict(trials_per_gpu=[4, 1, 1], instance_types=["small", "big", "small"])
    g = build_dag(spec, [4, 4, 1], CONST_MODEL, types, **kwargs)
    path = nx.dag_longest_path(g, weight=None)
    longest = max(sum(node_latency(g.nodes[n]) for n in p) for p in nx.all_simple_paths(
        g, ("SCALE", 0), ("SYNC", 2)))
    assert path
    assert longest == pytest.approx(simulate(spec, [4, 4, 1], CONST_MODEL, types, samples=2, **kwargs).jct_s[0])
    assert g.graph["instance_types"] == ("small", "big", "small") and g.graph["trials_per_gpu"] == (4, 1, 1)
    inits = [d for _, d in g.nodes(data=True) if d["type"] == "INIT_INSTANCE"]
    assert [d["instance_type"] for d in inits] == ["small"] * 4 + ["big"] + ["small"]
    trains = [d for _, d in g.nodes(data=True) if d["type"] == "TRAIN" and d["stage"] == 0]
    assert {d["gpu"] for d in trains} == {0, 1, 2, 3} and all(d["trials_per_gpu"] == 4 for d in trains)


# --- packed trials on one spot instance against an independent event-by-event oracle ------

PACKED_ONE = ModelProfile({1: Normal(2.0, 0.3)}, trial_startup_s=Normal(5.0, 1.0), sync_s=Constant(2.0), name="one",
                          packed_iter_latency_s={2: Normal(3.2, 0.4), 4: Normal(4.4, 0.5)})


@pytest.mark.parametrize("notice", [0.0, 120.0])
def test_packed_trials_on_one_spot_instance_agree_with_the_oracle(notice):
    from rubberband.testing.spot_oracle import one_instance_job

    spec = ExperimentSpec.sha(num_trials=8, min_iters=40, max_iters=640, eta=2)     # 8, 4, 2, 1 trials
    packing = [4, 4, 2, 1]                       # 8 trials in two packed rounds, 4 in one, 2 in one
    cloud = CloudProfile(instance_type="p3.2xlarge", gpus_per_instance=1, price_usd_per_hour=3.06,
                         spot_price_usd_per_hour=0.92, market=Market.SPOT,
                         spot=SpotMarket(notice_s=notice, rate_per_hour=3.0),
                         provision_latency_s=Normal(60.0, 10.0), init_latency_s=Normal(90.0, 15.0),
                         billing=Billing(BillingModel.PER_INSTANCE, 1.0, 60.0), data=DataCost(1.0, 0.02))
    sim = simulate(spec, [1] * 4, PACKED_ONE, cloud, samples=4000, seed=0, trials_per_gpu=packing)
    latencies = [PACKED_ONE.packed_latency(k) for k in packing]
    jct, cost = one_instance_job([(s.num_trials, s.iters) for s in spec.stages], latencies,
                                 PACKED_ONE.trial_startup_s, PACKED_ONE.sync_s, cloud.provision_latency_s,
                                 cloud.init_latency_s, 3.0, notice, 0.92, 1.0, 60.0, 0.02, samples=4000, seed=1,
                                 trials_per_gpu=packing)
    assert sim.mean_jct_s == pytest.approx(jct.mean(), rel=0.015)
    assert sim.mean_cost_usd == pytest.approx(cost.mean(), rel=0.02)
    assert sum(s.mean_reclaims for s in sim.stages) > 1.0      # the check has reclaims to check


def test_the_reference_gives_the_exact_answer_of_a_packed_typed_plan_on_deterministic_profiles():
    from rubberband.testing.reference_sim import run_once

    spec = ExperimentSpec().add_stage(16, 10).add_stage(4, 10).add_stage(2, 20).add_stage(1, 20)
    types = {"big": const_cloud("big", usd_per_gb=0.5), "small": const_cloud("small", 1, 3.06, provision_s=20.0,
                                                                           init_s=8.0, usd_per_gb=0.25)}
    names, packing, allocation = ["small", "small", "big", "small"], [4, 2, 1, 1], [3, 2, 2, 1]
    sim = simulate(spec, allocation, CONST_MODEL, types, samples=2, trials_per_gpu=packing, instance_types=names)
    ref = run_once(spec, allocation, CONST_MODEL, [types[n] for n in names], np.random.default_rng(0),
                   trials_per_gpu=packing)
    assert sim.jct_s[0] == pytest.approx(ref.jct_s, rel=1e-12)
    assert sim.cost_usd[0] == pytest.approx(ref.cost_usd, rel=1e-12)
    assert ref.launches == 3 + 1 + 1


def test_a_change_from_per_function_to_per_instance_billing_bills_each_stage_by_its_type():
    spec = ExperimentSpec().add_stage(8, 10).add_stage(1, 20)
    lambdas = const_cloud("fn", 1, 2.0, usd_per_gb=0.5, per_function=True)
    big = const_cloud("big", usd_per_gb=0.25)
    types, names = {"fn": lambdas, "big": big}, ["fn", "big"]
    result = simulate(spec, [4, 1], CONST_MODEL, types, samples=2, trials_per_gpu=[2, 1], instance_types=names)
    train0 = 7 + 10 * 1.6 * L1                         # 8 trials, 2 to a GPU on 4 GPUs: one round
    stage1 = 10 + 5 + 7 + 20 * L1 + 1
    assert result.jct_s[0] == 10 + 5 + train0 + 1 + stage1
    fn_usd = 8 * train0 * 2.0 / 3600 / 2 + 4 * 0.5      # a half GPU each, and 4 launches' data
    big_usd = max(stage1 - 10, 60.0) * 12.24 / 3600 + 0.25
    assert result.cost_usd[0] == pytest.approx(fn_usd + big_usd, rel=1e-12)
    timeline = sample_timeline(spec, [4, 1], CONST_MODEL, types, samples=2, trials_per_gpu=[2, 1], instance_types=names)
    assert timeline.cost_usd == pytest.approx(result.cost_usd[0], rel=1e-12)
