"""Fused trials (fused_per_gpu, DESIGN §4.5) in the simulator, its reference, timeline and DAG:
``F`` 1-GPU trials trained as one program on one GPU, one TRAIN of ``startup + iters * L_F`` per
group of ``F``, a group billed one GPU."""

from __future__ import annotations

from functools import partial

import networkx as nx
import numpy as np
import pytest

from rubberband import ExperimentSpec, Market, ModelProfile, SpecError
from rubberband.profiles import Constant, Normal
from rubberband.profiles.spot import SpotMarket
from rubberband.simulator import build_dag, simulate
from rubberband.simulator.trace import sample_timeline
from rubberband.testing.builders import cloud_profile
from rubberband.testing.reference_sim import reference_simulate

L1 = 3.0
# A group of 4 takes 1.5 L1 an iteration (2.7x the throughput), of 8 2.5 L1 (3.2x).
CONST_MODEL = ModelProfile({1: Constant(L1), 2: Constant(2.0)}, Constant(7.0), Constant(1.0), name="const",
                           packed_iter_latency_s={2: Constant(1.6 * L1)},
                           fused_iter_latency_s={1: Constant(1.2 * L1), 4: Constant(1.5 * L1), 8: Constant(2.5 * L1)},
                           fused_memory_gb={1: 2.0, 4: 3.5, 8: 5.5})
RANDOM_MODEL = ModelProfile({1: Normal(4.0, 0.4), 2: Normal(2.2, 0.2), 4: Normal(1.3, 0.1)},
                            Normal(8.0, 1.0), Constant(1.0), name="m",
                            fused_iter_latency_s={2: Normal(5.0, 0.5), 4: Normal(6.4, 0.6), 8: Normal(11.0, 1.0)})
const_cloud = partial(cloud_profile, provision_s=10.0, init_s=5.0, dataset_gb=1.0, gpu_memory_gb=16.0)
SHA16 = ExperimentSpec.sha(16, 2, 40, 2)     # 16x2 8x4 4x8 2x16 1x10


def random_cloud(**changes):
    return cloud_profile("big", 4, 12.24, spot_price_usd_per_hour=4.08, provision_s=Normal(30.0, 8.0),
                         init_s=Normal(20.0, 6.0), dataset_gb=1.0, usd_per_gb=0.09, **changes)


# --- exact answers ---------------------------------------------------------------------------

def test_sixteen_trials_fused_four_to_a_gpu_are_four_groups_at_the_groups_latency():
    spec = ExperimentSpec().add_stage(16, 10)
    result = simulate(spec, [4], CONST_MODEL, const_cloud("t.4gpu"), samples=3, fused_per_gpu=[4])
    # SCALE 10 + INIT 5, then one start-up 7 + 10 iterations of the group at 1.5 L1, then SYNC 1.
    assert result.jct_s.tolist() == [10 + 5 + 7 + 10 * 1.5 * L1 + 1] * 3
    # One 4-GPU instance, billed from its SCALE end to the end: 58 s, so the 60 s minimum.
    assert result.cost_usd == pytest.approx([60 * 12.24 / 3600] * 3, rel=1e-12)
    assert result.instances == (1,) and result.fused_per_gpu == (4,) and result.stages[0].fused_per_gpu == 4
    assert result.to_dict()["fused_per_gpu"] == [4]


def test_groups_beyond_the_gpus_queue_and_the_smaller_last_group_runs_at_l_f():
    spec = ExperimentSpec().add_stage(18, 10)
    # 18 trials in groups of 4: 5 groups (the last of 2) on 2 GPUs: three rounds, every one at L_4.
    result = simulate(spec, [2], CONST_MODEL, const_cloud("t.4gpu"), samples=2, fused_per_gpu=[4])
    assert result.jct_s.tolist() == [10 + 5 + 3 * (7 + 10 * 1.5 * L1) + 1] * 2
    assert result.instances == (1,)


def test_per_function_billing_charges_a_group_its_gpu_a_fth_per_member():
    cloud = const_cloud("t.4gpu", per_function=True)
    spec = ExperimentSpec().add_stage(16, 10)
    result = simulate(spec, [4], CONST_MODEL, cloud, samples=2, fused_per_gpu=[4])
    train = 7 + 10 * 1.5 * L1
    assert result.cost_usd == pytest.approx([4 * train * 12.24 / 3600 / 4] * 2, rel=1e-12)


def test_a_fused_group_holds_one_gpu_so_a_four_gpu_type_holds_four_groups():
    spec = ExperimentSpec().add_stage(64, 10)
    result = simulate(spec, [8], CONST_MODEL, const_cloud("t.4gpu"), samples=2, fused_per_gpu=[8])
    assert result.instances == (2,)              # 8 groups of 8, one per GPU, on two 4-GPU instances
    assert result.jct_s[0] == 10 + 5 + 7 + 10 * 2.5 * L1 + 1


@pytest.mark.parametrize("cloud", [const_cloud("t.4gpu"), random_cloud(),
                                   random_cloud(market=Market.SPOT, spot=SpotMarket(notice_s=120, rate_per_hour=20.0))])
def test_one_trial_per_group_is_the_unfused_model_bit_for_bit(cloud):
    """``F = 1`` is the plain program (``iter_latency_s[1]``), not the one-member fused program."""
    model = CONST_MODEL if cloud.instance_type == "t.4gpu" else RANDOM_MODEL
    allocation = [5, 8, 4, 2, 1]
    plain = simulate(SHA16, allocation, model, cloud, samples=200, seed=4)
    ones = simulate(SHA16, allocation, model, cloud, samples=200, seed=4, fused_per_gpu=[1] * 5)
    assert np.array_equal(plain.jct_s, ones.jct_s) and np.array_equal(plain.cost_usd, ones.cost_usd)
    assert plain.to_dict() == ones.to_dict()


@pytest.mark.parametrize("per_function", [False, True])
def test_fusion_agrees_with_the_reference_in_distribution(per_function):
    cloud = random_cloud(per_function=per_function)
    allocation, fusion = [2, 2, 1, 2, 1], [8, 2, 4, 1, 1]
    ref_jct, ref_cost = reference_simulate(SHA16, allocation, RANDOM_MODEL, cloud, samples=800, seed=11,
                                           fused_per_gpu=fusion)
    sim = simulate(SHA16, allocation, RANDOM_MODEL, cloud, samples=3000, seed=12, fused_per_gpu=fusion)
    for ref, got in ((ref_jct, sim.jct_s), (ref_cost, sim.cost_usd)):
        assert got.mean() == pytest.approx(ref.mean(), rel=0.01)


def test_the_reference_gives_the_exact_answer_on_a_deterministic_profile():
    spec = ExperimentSpec().add_stage(18, 10).add_stage(8, 10).add_stage(2, 20)
    cloud = const_cloud("t.4gpu")
    kwargs = dict(fused_per_gpu=[4, 8, 1])
    sim = simulate(spec, [2, 1, 2], CONST_MODEL, cloud, samples=2, **kwargs)
    jct, cost = reference_simulate(spec, [2, 1, 2], CONST_MODEL, cloud, samples=2, **kwargs)
    assert jct.tolist() == pytest.approx(sim.jct_s.tolist(), rel=1e-12)
    assert cost.tolist() == pytest.approx(sim.cost_usd.tolist(), rel=1e-12)


# --- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("allocation", "kwargs", "pattern"), [
    ([32], dict(fused_per_gpu=[4]), r"fused_per_gpu\[0\]: only 1-GPU trials are fused, and stage 0's allocation gives "
                                    r"each trial 2 GPUs"),
    ([4], dict(fused_per_gpu=[2]), r"fused_per_gpu\[0\]: 2 trials fused per GPU has no fused_iter_latency_s .*"
                                   r"profiled: 1, 4, 8"),
    ([4], dict(fused_per_gpu=[0]), r"fused_per_gpu\[0\]: expected a whole number of trials fused per GPU"),
    ([4], dict(fused_per_gpu=[2.5]), r"fused_per_gpu\[0\]: expected a whole number"),
    ([4], dict(fused_per_gpu=[4, 4]), r"fused_per_gpu: expected 1 trials fused per GPU, one per stage"),
    ([4], dict(fused_per_gpu=[4], trials_per_gpu=[2]), r"fused_per_gpu\[0\]: stage 0 also packs 2 trials per GPU; "
                                                       r"fused and packed are exclusive per stage"),
    ([16], dict(fused_per_gpu=[4]), r"allocation\[0\]: 16 GPUs do not fit on the 1 t.4gpu instances .* in groups of 4 "
                                    r"fused; give 4 GPUs"),
])
def test_bad_fusion_is_one_error_naming_the_field(allocation, kwargs, pattern):
    spec = ExperimentSpec().add_stage(16, 10)
    with pytest.raises(SpecError, match=pattern):
        simulate(spec, allocation, CONST_MODEL, const_cloud("t.4gpu"), samples=2, **kwargs)


def test_a_group_above_the_gpus_memory_is_refused_by_hydros_rule():
    """m(F) = 2 + (F - 1) * 0.5 (the fit of 2.0, 3.5, 5.5 GB): a 5 GB GPU holds F <= 7."""
    spec = ExperimentSpec().add_stage(16, 10)
    assert CONST_MODEL.max_fused(5.0) == 7
    with pytest.raises(SpecError, match=r"fused_per_gpu\[0\]: a fused group of 8 needs 5.5 GB, more than the 5 GB of "
                                        r"one t.4gpu GPU \(fused_memory_gb\); fuse at most 4"):
        simulate(spec, [2], CONST_MODEL, const_cloud("t.4gpu", gpu_memory_gb=5.0), samples=2, fused_per_gpu=[8])


# --- the timeline and the DAG --------------------------------------------------------------------

@pytest.mark.parametrize("spot", [None, [1, 1, 0, 1, 1]])
def test_every_sample_of_a_fused_plan_replays_the_simulation(spot):
    cloud = random_cloud(spot=SpotMarket(notice_s=60, rate_per_hour=6.0))
    allocation, fusion = [2, 2, 1, 2, 1], [8, 2, 4, 1, 1]
    result = simulate(SHA16, allocation, RANDOM_MODEL, cloud, samples=20, seed=3, fused_per_gpu=fusion,
                      spot_instances=spot)
    timelines = [sample_timeline(SHA16, allocation, RANDOM_MODEL, cloud, seed=3, samples=20, sample=k,
                                 fused_per_gpu=fusion, spot_instances=spot) for k in range(20)]
    assert [t.jct_s for t in timelines] == pytest.approx(result.jct_s.tolist(), rel=1e-12)
    assert [t.cost_usd for t in timelines] == pytest.approx(result.cost_usd.tolist(), rel=1e-12)
    for t in timelines:
        first = {s.trial: s.fused for s in t.trials if s.stage == 0}
        assert first == {0: 8, 1: 8}            # 16 trials in two groups of 8, each one span
        assert {s.trial: s.fused for s in t.trials if s.stage == 2} == {0: 4}


def test_the_dag_of_a_fused_plan_is_the_jct_on_a_deterministic_profile():
    spec = ExperimentSpec().add_stage(18, 10).add_stage(8, 10).add_stage(2, 20)
    cloud = const_cloud("t.4gpu")
    g = build_dag(spec, [2, 1, 2], CONST_MODEL, cloud, fused_per_gpu=[4, 8, 1])
    longest = nx.dag_longest_path_length(g, weight=None)
    assert longest > 0
    weight = {n: (d["startup"].mean + d["iters"] * d["iter_latency"].mean) if d["type"] == "TRAIN"
              else d["latency"].mean for n, d in g.nodes(data=True)}
    path = max(nx.all_simple_paths(g, ("SCALE", 0), ("SYNC", 2)), key=lambda p: sum(weight[n] for n in p))
    assert sum(weight[n] for n in path) == pytest.approx(
        simulate(spec, [2, 1, 2], CONST_MODEL, cloud, samples=2, fused_per_gpu=[4, 8, 1]).jct_s[0])
    trains = [d for _, d in g.nodes(data=True) if d["type"] == "TRAIN" and d["stage"] == 0]
    assert [d["members"] for d in trains] == [4, 4, 4, 4, 2] and g.graph["fused_per_gpu"] == (4, 8, 1)
