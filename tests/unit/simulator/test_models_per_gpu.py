"""A model profile per GPU model in the simulator and its timeline: each stage runs by the
profile of its own type's GPU model (issue #14's profiles, as the planner weighs them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rubberband import ExperimentSpec, ModelProfile, SpecError
from rubberband.profiles import Constant, Normal
from rubberband.profiles.cloud import CloudCatalog
from rubberband.simulator import simulate
from rubberband.simulator.trace import sample_timeline

ROOT = Path(__file__).resolve().parents[3]
CATALOG = CloudCatalog.load(ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml")
SPEC = ExperimentSpec.sha(16, 2, 16, 2)
V100 = ModelProfile({1: Normal(12.0, 1.2), 2: Normal(6.3, 0.6), 4: Normal(3.45, 0.3)}, Constant(5.0), Constant(1.0),
                    name="v100")
# Three times slower per iteration, with a longer SYNC: a stage run by the wrong one shows it.
A10G = ModelProfile({1: Normal(36.0, 3.6), 2: Normal(19.0, 1.9), 4: Normal(10.4, 1.0)}, Constant(5.0), Constant(4.0),
                    name="a10g")
MODELS = {"V100": V100, "A10G": A10G}
TYPES = ["p3.8xlarge", "p3.8xlarge", "g5.12xlarge", "g5.12xlarge"]
ALLOCATION = [8, 4, 4, 4]


def test_each_stage_runs_by_its_types_gpu_model():
    mixed = simulate(SPEC, ALLOCATION, MODELS, CATALOG, samples=200, seed=3, instance_types=TYPES)
    v100_only = simulate(SPEC, ALLOCATION, V100, CATALOG, samples=200, seed=3, instance_types=TYPES)
    a10g_only = simulate(SPEC, ALLOCATION, A10G, CATALOG, samples=200, seed=3, instance_types=TYPES)
    # The V100 stages are the V100 profile's exactly, the A10G ones the A10G profile's.
    for i in (0, 1):
        assert mixed.stages[i].mean_duration_s == v100_only.stages[i].mean_duration_s
    for i in (2, 3):
        assert mixed.stages[i].mean_duration_s == pytest.approx(a10g_only.stages[i].mean_duration_s, rel=1e-12)
        assert mixed.stages[i].mean_duration_s > 1.5 * v100_only.stages[i].mean_duration_s


def test_one_type_takes_its_gpu_models_profile():
    g5 = CATALOG.get("g5.12xlarge")
    by_mapping = simulate(SPEC, ALLOCATION, MODELS, g5, samples=100, seed=1)
    direct = simulate(SPEC, ALLOCATION, A10G, g5, samples=100, seed=1)
    assert np.array_equal(by_mapping.jct_s, direct.jct_s) and np.array_equal(by_mapping.cost_usd, direct.cost_usd)


def test_the_timeline_runs_each_stage_by_its_profile():
    result = simulate(SPEC, ALLOCATION, MODELS, CATALOG, samples=20, seed=5, instance_types=TYPES)
    timeline = sample_timeline(SPEC, ALLOCATION, MODELS, CATALOG, seed=5, samples=20, sample=7, instance_types=TYPES)
    assert timeline.jct_s == pytest.approx(result.jct_s[7], rel=1e-9)


def test_a_type_without_a_profile_is_named_per_stage():
    with pytest.raises(SpecError, match=r"^instance_types\[2\]: g5\.12xlarge has A10G GPUs but the model profiles "
                                        r"cover V100 only; add a A10G profile"):
        simulate(SPEC, ALLOCATION, {"V100": V100}, CATALOG, samples=10, instance_types=TYPES)


def test_one_type_without_a_profile_is_named():
    with pytest.raises(SpecError, match=r"^instance_type: g6\.12xlarge has L4 GPUs but the model profiles cover "
                                        r"V100, A10G only"):
        simulate(SPEC, ALLOCATION, MODELS, CATALOG.get("g6.12xlarge"), samples=10)


def test_simulate_plan_takes_the_profiles_per_gpu_model():
    from rubberband.plan import plan_allocation, simulate_plan

    plan = plan_allocation(SPEC, ALLOCATION, A10G, CATALOG.get("g5.12xlarge"), 3600.0, samples=30, seed=2)
    assert np.array_equal(simulate_plan(plan, MODELS).jct_s, simulate_plan(plan, A10G).jct_s)


@pytest.mark.parametrize("model", [{}, [V100], "v100.yaml"])
def test_a_model_that_is_no_profile_is_one_line(model):
    with pytest.raises(SpecError, match=r"^model: expected a ModelProfile or a mapping of GPU model to ModelProfile"):
        simulate(SPEC, ALLOCATION, model, CATALOG.get("p3.8xlarge"), samples=10)
