"""Surrogate tuning's target stage in the simulator (DESIGN §4.6): each stage runs by its own profile."""

from __future__ import annotations

import numpy as np
import pytest

from rubberband import ExperimentSpec, ModelProfile, SpecError
from rubberband.profiles import Constant, Normal
from rubberband.simulator import simulate
from rubberband.simulator.trace import sample_timeline
from rubberband.testing.builders import cloud_profile
from rubberband.testing.reference_sim import reference_simulate, run_once

SURROGATE = ModelProfile({1: Constant(0.5), 2: Constant(0.3)}, Constant(2.0), Constant(1.0), name="w/8")
TARGET = ModelProfile({1: Constant(8.0), 2: Constant(4.5), 4: Constant(2.5)}, Constant(20.0), Constant(3.0),
                      name="full")
CLOUD = cloud_profile("t.4gpu", 4, 12.0, provision_s=10.0, init_s=5.0, minimum_s=0.0)
JOB = ExperimentSpec.sha(8, 2, 8, 2).with_target(100)      # 8x2 4x4 2x2 then 1x100 (target)


def test_the_target_stage_runs_by_the_target_profile_exactly():
    # Stage 0: 8 trials on 8 GPUs (2 instances): SCALE 10 + INIT 5, TRAIN 2 + 2 * 0.5, SYNC 1.
    # Stages 1, 2: held instances, TRAIN 2 + 4 * 0.5 (+ SYNC 1) and 2 + 2 * 0.5 (+ 1).
    # Target on 4 GPUs of one instance (the other released): TRAIN 20 + 100 * 2.5, SYNC 3.
    sim = simulate(JOB, [8, 4, 2, 4], SURROGATE, CLOUD, samples=2, target_model=TARGET)
    jct = 15 + 4 + 5 + 4 + 273
    assert sim.jct_s[0] == pytest.approx(jct)
    ref = run_once(JOB, [8, 4, 2, 4], SURROGATE, CLOUD, np.random.default_rng(0), target_model=TARGET)
    assert ref.jct_s == pytest.approx(jct) and sim.cost_usd[0] == pytest.approx(ref.cost_usd)
    line = sample_timeline(JOB, [8, 4, 2, 4], SURROGATE, CLOUD, target_model=TARGET)
    assert line.jct_s == pytest.approx(jct)


def test_with_the_same_profile_the_target_stage_is_an_ordinary_stage_bit_for_bit():
    plain = ExperimentSpec.from_stages([(s.num_trials, s.iters) for s in JOB.stages])
    cloud = cloud_profile("t.4gpu", 4, 12.0, provision_s=Normal(30.0, 8.0), init_s=Normal(20.0, 6.0))
    model = ModelProfile({1: Normal(4.0, 0.4), 2: Normal(2.2, 0.2), 4: Normal(1.3, 0.1)}, Normal(8.0, 1.0),
                         Constant(1.0), name="m")
    a = simulate(JOB, [8, 4, 2, 2], model, cloud, samples=200, seed=3, target_model=model)
    b = simulate(plain, [8, 4, 2, 2], model, cloud, samples=200, seed=3)
    assert np.array_equal(a.jct_s, b.jct_s) and np.array_equal(a.cost_usd, b.cost_usd)


# Random profiles of a surrogate and its target, and two types to run them on (a target of its own type).
NOISY_S = ModelProfile({1: Normal(0.6, 0.1), 2: Normal(0.35, 0.05)}, Normal(3.0, 0.5), Constant(1.0), name="s")
NOISY_T = ModelProfile({1: Normal(6.0, 0.6), 2: Normal(3.3, 0.3), 4: Normal(1.9, 0.2)}, Normal(15.0, 2.0),
                       Constant(2.0), name="t")
SMALL = cloud_profile("small", 1, 3.06, provision_s=Normal(30.0, 8.0), init_s=Normal(20.0, 6.0), dataset_gb=1.0,
                      usd_per_gb=0.09)
BIG = cloud_profile("big", 4, 12.24, provision_s=Normal(40.0, 8.0), init_s=Normal(25.0, 6.0), dataset_gb=1.0,
                    usd_per_gb=0.09)


def test_a_target_stage_on_its_own_type_agrees_with_the_reference_in_distribution():
    surrogate, target, small, big = NOISY_S, NOISY_T, SMALL, BIG
    clouds = [small, small, small, big]
    ref_jct, ref_cost = reference_simulate(JOB, [4, 4, 2, 4], surrogate, clouds, samples=600, seed=11,
                                           target_model=target)
    sim = simulate(JOB, [4, 4, 2, 4], surrogate, {"small": small, "big": big}, samples=3000, seed=12,
                   instance_types=["small", "small", "small", "big"], target_model=target)
    for ref, got in ((ref_jct, sim.jct_s), (ref_cost, sim.cost_usd)):
        assert got.mean() == pytest.approx(ref.mean(), rel=0.01)
    assert sim.stages[-1].instance_type == "big" and sim.stages[-1].gpus_per_trial == 4


@pytest.mark.parametrize(("spec", "target", "pattern"), [
    (JOB, None, r"target_model: stage 3 is the target stage"),
    (ExperimentSpec.sha(8, 2, 8, 2), TARGET, r"target_model: the job has no target stage"),
])
def test_a_missing_or_stray_target_model_is_one_error(spec, target, pattern):
    allocation = [8, 4, 2, 4][:spec.num_stages()]
    with pytest.raises(SpecError, match=pattern):
        simulate(spec, allocation, SURROGATE, CLOUD, samples=2, target_model=target)


def test_the_target_stage_is_checked_against_the_target_profile():
    # 8 GPUs for the target: the surrogate profiles 2 GPUs per trial at most, the target 4.
    with pytest.raises(SpecError, match=r"allocation"):
        simulate(JOB, [8, 4, 2, 8], SURROGATE, CLOUD, samples=2, target_model=TARGET)
