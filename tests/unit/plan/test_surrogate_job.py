"""Planning a surrogate job (DESIGN §4.6): SHA on the surrogate, then the target stage on its own
profile; the optimal plan agrees with brute force over the whole job, target stage included."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest

from rubberband import ExperimentSpec, ModelProfile, SpecError, load_experiment
from rubberband.plan import Plan, check_plan, compile_plan, simulate_plan
from rubberband.plan.compile import usable_profile, variant_tables
from rubberband.plan.search import pareto_front
from rubberband.plan.table import StageTable, valid_allocations
from rubberband.plan.variants import VariantTable
from rubberband.profiles import Constant, Normal
from rubberband.simulator import simulate
from rubberband.simulator.model import instances_needed
from rubberband.testing.builders import cloud_profile, model_profile, scaling_model

from .test_variants import brute_force_cheapest, p3_catalog

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = 30


def _models(seed: int) -> tuple[ModelProfile, ModelProfile]:
    """A surrogate (1-2 GPUs per trial, fast) and a target 8-20x slower per iteration (1-4 GPUs)."""
    rng = random.Random(f"surjob/{seed}")
    base = rng.uniform(20.0, 60.0)
    target = {g: Normal(base / g ** rng.uniform(0.6, 0.95), base * 0.05) for g in (1, 2, 4)}
    ratio = rng.uniform(8.0, 20.0)
    surrogate = {g: Normal(target[g].mean / ratio, target[g].mean / ratio * 0.1) for g in (1, 2)}
    return (model_profile(surrogate, startup_s=Normal(3.0, 0.5), sync_s=1.0, name="w/8"),
            model_profile(target, startup_s=Normal(12.0, 2.0), sync_s=2.0, name="full"))


def brute_force(spec: ExperimentSpec, surrogate: ModelProfile, target: ModelProfile, cloud, seed: int):
    """Every valid allocation per stage (the target stage's by the target's profile) with every
    held vector holding each stage's fewest instances or what a later stage's allocation needs,
    plus the static clusters (K instances in every stage); each simulated in full."""
    G = cloud.gpus_per_instance
    models = [target if s.target else surrogate for s in spec.stages]
    valid = [valid_allocations(s.num_trials, m, G) for s, m in zip(spec.stages, models)]
    needs = [{instances_needed(s.num_trials, a, G) for a in v} for s, v in zip(spec.stages, valid)]
    later = [set().union(*needs[i + 1:]) for i in range(len(needs))]
    out = []
    held_vectors = set()
    for alloc in itertools.product(*valid):
        fewest = [instances_needed(s.num_trials, a, G) for s, a in zip(spec.stages, alloc)]
        holds = [[n] + sorted(v for v in later[i] if v > n) for i, n in enumerate(fewest)]
        for held in itertools.product(*holds):
            held_vectors.add((alloc, held))
    k_max = max(max(n) for n in needs)
    for k in range(1, k_max + 1):      # static clusters: K * G GPUs shared fairly in every stage
        alloc = []
        for s, m in zip(spec.stages, models):
            fits = [a for a in valid_allocations(s.num_trials, m, G) if instances_needed(s.num_trials, a, G) <= k]
            alloc.append(max(fits) if fits else 0)
        if all(alloc):
            held_vectors.add((tuple(alloc), (k,) * len(alloc)))
    for alloc, held in sorted(held_vectors):
        r = simulate(spec, alloc, surrogate, cloud, samples=SAMPLES, seed=seed, instances=held, target_model=target)
        out.append((alloc, tuple(r.instances), r.mean_jct_s, r.mean_cost_usd))
    return out


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("billing", [{"granularity_s": 1e-6, "minimum_s": 0}, {"per_function": True}],
                         ids=["per-instance-exact", "per-function"])
def test_the_optimal_plan_of_a_surrogate_job_equals_brute_force(seed, billing):
    surrogate, target = _models(seed)
    cloud = cloud_profile("test.large", 4, 12.0, provision_s=Normal(20.0, 5.0), init_s=Normal(40.0, 10.0),
                          dataset_gb=1.0, usd_per_gb=0.05, **billing)
    spec = ExperimentSpec.sha(8, 1, 8, 2).with_target(60)
    points = brute_force(spec, surrogate, target, cloud, seed)
    jcts = sorted(p[2] for p in points)
    for q in (0.02, 0.25, 0.8):
        d = jcts[0] + q * (jcts[-1] - jcts[0]) + 1e-3
        feasible = [p for p in points if p[2] <= d]
        best = min(p[3] for p in feasible)
        plan = compile_plan(spec, surrogate, cloud, d, samples=SAMPLES, seed=seed, target_model=target)
        assert plan.predicted.mean_cost_usd == pytest.approx(best, rel=1e-9), q
        assert plan.predicted.mean_jct_s <= d
        assert plan.gpus_per_trial[-1] in target.gpu_counts


def test_the_target_stage_gets_its_own_gpus_per_trial():
    # Surrogate profiled at 1 GPU only; the target scales to 4 at a loss of GPU-seconds (1600
    # on 1 GPU, 1760 on 4): per-function billing gives it 1 GPU, a tight deadline 4.
    surrogate = model_profile({1: Constant(0.2)}, startup_s=1.0, sync_s=0.5, name="w/8")
    target = model_profile({1: Constant(8.0), 2: Constant(4.2), 4: Constant(2.2)}, startup_s=10.0, sync_s=1.0,
                           name="full")
    cloud = cloud_profile("t.4gpu", 4, 12.0, provision_s=10.0, init_s=5.0, per_function=True)
    spec = ExperimentSpec.sha(8, 2, 8, 2).with_target(200)
    loose = compile_plan(spec, surrogate, cloud, 10_000, target_model=target, samples=20)
    tight = compile_plan(spec, surrogate, cloud, 600, target_model=target, samples=20)
    assert loose.gpus_per_trial[-1] == 1 and tight.gpus_per_trial[-1] == 4
    assert tight.gpus_per_trial[:-1] == (1, 1, 1)


@pytest.mark.parametrize("deadline_s", [300.0, 600.0, 5000.0])
def test_types_per_stage_with_a_target_stage_agree_with_brute_force(deadline_s):
    """The target stage chooses its own instance type among the variants (its one trial never packs)."""
    spec = ExperimentSpec.sha(8, 2, 8, 2).with_target(40)
    surrogate = scaling_model(2.0, 0.2, packed={2: 1.3, 4: 2.2}, gpus=(1, 2))
    target = scaling_model(30.0, 3.0, gpus=(1, 2, 4))
    cat = p3_catalog()
    tables, draws = [], None
    for name, G in (("p3.2xlarge", 1), ("p3.8xlarge", 4)):
        own = variant_tables(spec, usable_profile(surrogate, 4, G), cat.get(name), 20, 7, draws,
                             target_model=usable_profile(target, 4, G))
        draws = own[0].draws
        tables += own
    table = VariantTable(tables, surrogate, target)
    front = pareto_front(table, deadline_s)
    best = min((table.evaluate(a, h)[1] for a, h in front), default=float("inf"))
    assert best == pytest.approx(brute_force_cheapest(table, deadline_s), rel=1e-9)


def test_market_auto_weighs_the_target_stage_on_its_own_market():
    surrogate, target = _models(3)
    cloud = cloud_profile("test.large", 4, 12.0, spot_price_usd_per_hour=4.0, provision_s=20.0, init_s=30.0)
    spec = ExperimentSpec.sha(8, 1, 8, 2).with_target(60)
    plan = compile_plan(spec, surrogate, cloud, 5000, market="auto", samples=20, target_model=target)
    assert len(plan.spot_counts) == spec.num_stages()
    again = simulate_plan(plan, surrogate, target_model=target)
    assert again.mean_cost_usd == pytest.approx(plan.predicted.mean_cost_usd, rel=1e-9)


def test_a_plan_file_keeps_the_target_stage():
    surrogate, target = _models(0)
    cloud = cloud_profile("test.large", 4, 12.0)
    spec = ExperimentSpec.sha(8, 1, 8, 2).with_target(60)
    plan = compile_plan(spec, surrogate, cloud, 5000, samples=20, target_model=target)
    data = json.loads(plan.to_json())
    assert data["target_stage"] == spec.num_stages() - 1
    back = Plan.from_json(plan.to_json())
    assert back.spec.target_stage == spec.num_stages() - 1
    checked = check_plan(back, spec, surrogate, cloud, target_model=target)
    assert checked.predicted.mean_cost_usd == pytest.approx(plan.predicted.mean_cost_usd, rel=1e-6)
    data["target_stage"] = 0
    with pytest.raises(SpecError, match=r"plan.target_stage: expected the last stage's index"):
        Plan.from_dict(data)


def test_a_surrogate_job_without_its_target_profile_is_one_error():
    surrogate, _ = _models(0)
    with pytest.raises(SpecError, match=r"target_model: stage 4 is the target stage"):
        compile_plan(ExperimentSpec.sha(8, 1, 8, 2).with_target(60), surrogate, cloud_profile(), 5000)


def test_the_demo_surrogate_experiment_plans_the_whole_job():
    exp = load_experiment(ROOT / "experiments" / "demo_surrogate.yaml")
    assert exp.spec.target_stage == exp.spec.num_stages() - 1
    model, target = exp.job_models()
    plan = compile_plan(exp.spec, model, exp.catalog, exp.deadline_s, instance_type=exp.instance_type,
                        samples=50, seed=exp.seed, target_model=target)
    assert plan.predicted.stages[-1].num_trials == 1
    assert isinstance(StageTable(exp.spec, model, exp.cloud, samples=5, target_model=target).models[-1], ModelProfile)
    assert np.isfinite(plan.predicted.mean_cost_usd)


def test_instance_type_auto_plans_the_target_stage_on_a_type_of_its_own():
    """With `auto`, the tuning stages and the target stage choose among the p3 sizes apart; the
    plan's prediction is the simulation of what it says, target stage by the target's profile."""
    spec = ExperimentSpec.sha(8, 2, 8, 2).with_target(40)
    surrogate = scaling_model(1.0, 0.1, gpus=(1, 2))
    target = scaling_model(30.0, 3.0, gpus=(1, 2, 4, 8))
    plan = compile_plan(spec, surrogate, p3_catalog(), 900, instance_type="auto", samples=20, seed=3,
                        target_model=target)
    assert plan.gpus_per_trial[-1] in target.gpu_counts
    again = simulate_plan(plan, surrogate, target_model=target)
    assert again.mean_cost_usd == pytest.approx(plan.predicted.mean_cost_usd, rel=1e-9)
    assert again.mean_jct_s <= 900 * 1.05


def test_the_approximate_surrogate_scales_the_compute_part_by_one_over_s_squared():
    from rubberband.plan.whatif import approximate_surrogate

    target = scaling_model(40.0, 4.0, gpus=(1, 2, 4), gpu_memory_gb_per_trial=8.0)
    sur = approximate_surrogate(target, 8, compute_fraction=0.9)
    factor = 0.9 / 64 + 0.1
    for g in (1, 2, 4):
        assert sur.latency(g).mean == pytest.approx(target.latency(g).mean * factor)
        assert sur.latency(g).std == pytest.approx(target.latency(g).std * factor)
    assert sur.trial_startup_s == target.trial_startup_s and sur.sync_s == target.sync_s
    assert sur.gpu_memory_gb_per_trial == pytest.approx(1.0) and not sur.packed_iter_latency_s
    assert "approximation" in sur.name
    assert approximate_surrogate(target, 1, 1.0).latency(1).mean == pytest.approx(target.latency(1).mean)
    with pytest.raises(SpecError, match=r"compute_fraction: expected a fraction in \[0, 1\]"):
        approximate_surrogate(target, 8, 1.5)


def test_the_sweep_at_ratio_one_is_the_tuning_at_full_width_and_measured_profiles_win():
    from rubberband.plan.whatif import surrogate_sweep

    surrogate, target = _models(0)
    cloud = cloud_profile("test.large", 4, 12.0)
    tuning = ExperimentSpec.sha(8, 1, 8, 2)
    one, eight = surrogate_sweep(tuning, target, cloud, 5000, [1, 8], 60, {8: surrogate}, samples=20, seed=1)
    alone = compile_plan(tuning, target, cloud, 5000, samples=20, seed=1)
    assert (one.profile, one.cost_usd, one.target_s) == ("full width", alone.predicted.mean_cost_usd, None)
    whole = compile_plan(tuning.with_target(60), surrogate, cloud, 5000, samples=20, seed=1, target_model=target)
    assert (eight.profile, eight.cost_usd) == ("measured", whole.predicted.mean_cost_usd)
    assert eight.tuning_usd + eight.target_usd == pytest.approx(eight.cost_usd)
