"""Per-stage instance types and trials per GPU (plan/variants.py, issue #14 items 3-4, #16 item 3):
the search agrees with brute force, a type change is the simulator's, packing where it pays,
profiles per GPU model, and the plan's new fields in JSON and check_plan."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from rubberband import (
    ExperimentSpec,
    InfeasibleDeadlineError,
    ModelProfile,
    SpecError,
    load_experiment,
)
from rubberband.plan import Plan, check_plan, compile_plan, simulate_plan, whatif
from rubberband.plan.compile import usable_profile, variant_tables
from rubberband.plan.search import pareto_front
from rubberband.plan.variants import VariantTable
from rubberband.profiles.cloud import Market
from rubberband.testing.builders import scaling_model

ROOT = Path(__file__).resolve().parents[3]
P3 = ("p3.2xlarge", "p3.8xlarge", "p3.16xlarge")


@cache
def fig12():
    return load_experiment(ROOT / "experiments" / "resnet50_sha512.yaml")


def p3_catalog(dataset_gb: float = 20.0):
    """The three p3 sizes (1, 4, 8 V100s), with a data cost per launch."""
    exp = fig12()
    cat = exp.catalog.with_overrides({**exp.cloud_overrides, "data": {"dataset_gb": dataset_gb, "price_usd_per_gb": 0.02}})
    return replace(cat, types={k: v for k, v in cat.types.items() if k in P3})


def brute_force_cheapest(table: VariantTable, deadline_s: float, cap: dict[str, int] | None = None) -> float:
    """The least surrogate cost of any plan meeting ``deadline_s``: every key per stage, holding
    what it needs or what a later stage's key of the same type needs (the search space); with
    ``cap``, only the plans that never hold more instances of a type than it allows."""
    n, T = table.num_stages, table.state_types
    keys = [table.candidates(i) for i in range(n)]
    needs = [{k: table.need(i, k) for k in keys[i]} for i in range(n)]
    options = []
    for i in range(n):
        later = {h for j in range(i + 1, n) for h in needs[j].values()}
        options.append([(k, h) for k in keys[i] for h in {needs[i][k]} | {h for h in later
                        if h > needs[i][k] and h % T == needs[i][k] % T}])
    combos = list(itertools.product(*options))
    if cap is not None:
        combos = [c for c in combos if all(h // T <= cap[table.type_names[h % T]] for _, h in c)]
    alloc = np.array([[k for k, _ in c] for c in combos], dtype=np.int64)
    held = np.array([[h for _, h in c] for c in combos], dtype=np.int64)
    jct, cost = table.evaluate_many(alloc, held)
    ok = jct <= deadline_s * (1 + 1e-9)
    return float(cost[ok].min()) if ok.any() else float("inf")


def small_variants(samples: int = 20, caps: dict[str, int] | None = None) -> VariantTable:
    spec = ExperimentSpec.sha(8, 2, 8, 2)           # 8x2, 4x2, 2x4 (, 1x...) iterations
    m = scaling_model(packed={2: 1.3, 4: 2.2}, gpus=(1, 2, 4))
    cat = p3_catalog()
    tables, draws = [], None
    for name, G in (("p3.2xlarge", 1), ("p3.8xlarge", 4)):
        own = variant_tables(spec, usable_profile(m, 4, G), cat.get(name), samples, 7, draws, caps=caps)
        draws = own[0].draws
        tables += own
    return VariantTable(tables, m)


@pytest.mark.parametrize("deadline_s", [120.0, 200.0, 400.0, 5000.0])
def test_the_per_stage_search_within_max_instances_agrees_with_brute_force(deadline_s):
    """Each type's ``max_instances`` cuts every variant of it (packed ones too): the search is
    the brute force's cheapest over the plans of the uncapped table that keep within it."""
    caps = {"p3.2xlarge": 3, "p3.8xlarge": 1}
    table = small_variants(caps=caps)
    front = pareto_front(table, deadline_s)
    assert all(table.holds(h) for _, held in front for h in held)
    best = min((table.evaluate(a, h)[1] for a, h in front), default=float("inf"))
    oracle = brute_force_cheapest(small_variants(), deadline_s, cap=caps)
    assert best == pytest.approx(oracle, rel=1e-9)
    if deadline_s == 120.0:      # tight: the cheapest plan holds more than the cap allows
        assert oracle > brute_force_cheapest(small_variants(), deadline_s)


@pytest.mark.parametrize("deadline_s", [120.0, 200.0, 400.0, 5000.0])
def test_the_per_stage_search_agrees_with_brute_force(deadline_s):
    table = small_variants()
    assert table.state_types == 2 and len(table.tables) == 6     # 2 types x k in (1, 2, 4)
    front = pareto_front(table, deadline_s)
    best = min((table.evaluate(a, h)[1] for a, h in front), default=float("inf"))
    assert best == pytest.approx(brute_force_cheapest(table, deadline_s), rel=1e-9)


def test_a_change_of_type_is_what_the_simulator_does():
    """Mean JCT adds up exactly over stages, also across a change of type (the new type launches
    everything); the surrogate cost bounds the billed one from below."""
    table = small_variants(samples=50)
    V, T = len(table.tables), table.state_types
    narrow, wide = 0, 3                 # variants: p3.2xlarge k=1, p3.8xlarge k=1
    alloc = (8 * V + narrow, 4 * V + wide, 8 * V + wide, 4 * V + wide)[:table.num_stages]
    held = tuple(table.need(i, k) for i, k in enumerate(alloc))
    jct, cost = table.evaluate(alloc, held)
    result = table.simulate(alloc, held)
    assert result.instance_types[:2] == ("p3.2xlarge", "p3.8xlarge")
    assert result.stages[1].new_instances == held[1] // T        # nothing carried over from the 1-GPU instances
    assert result.mean_jct_s == pytest.approx(jct, rel=1e-9)
    assert cost <= result.mean_cost_usd + 1e-9


@cache
def shapes_plan(deadline_s: float = 3000.0):
    """27 1-GPU trials first, one 8-GPU trial last: stages that want different instance shapes."""
    spec = ExperimentSpec.sha(27, 4, 108, 3)
    return compile_plan(spec, scaling_model(), p3_catalog(), deadline_s, instance_type="auto", samples=60)


def test_auto_chooses_a_type_per_stage_when_stages_want_different_shapes():
    plan = shapes_plan()
    assert len(set(plan.instance_types)) > 1
    singles = [c for c in plan.considered if c["policy"] == "optimal" and "infeasible" not in c]
    assert {c["instance_type"] for c in singles} >= {"p3.8xlarge", "p3.16xlarge"}
    assert plan.predicted.mean_cost_usd < min(c["cost_usd_mean"] for c in singles)
    assert any(c["policy"] == "optimal, type per stage" for c in plan.considered)
    again = simulate_plan(plan, scaling_model())
    assert again.mean_cost_usd == pytest.approx(plan.predicted.mean_cost_usd, rel=1e-12)
    assert again.instance_types == plan.instance_types


@pytest.mark.parametrize("deadline_s", [2400.0, 6000.0])
def test_a_per_stage_plan_is_never_dearer_than_the_best_single_type(deadline_s):
    plan = shapes_plan(deadline_s)
    singles = [c["cost_usd_mean"] for c in plan.considered if c["policy"] == "optimal" and "infeasible" not in c]
    assert plan.predicted.mean_cost_usd <= min(singles) + 1e-9


def test_the_plan_json_keeps_types_and_packing_and_check_plan_simulates_them():
    plan = shapes_plan()
    back = Plan.from_json(plan.to_json())
    assert back.instance_types == plan.instance_types and set(back.type_clouds) == set(plan.instance_types)
    checked = check_plan(back, plan.spec, scaling_model(), p3_catalog(), samples=60)
    assert checked.predicted.mean_cost_usd == pytest.approx(plan.predicted.mean_cost_usd, rel=1e-9)
    data = json.loads(plan.to_json())
    data["instance_types"][0] = "p3.24xlarge"
    with pytest.raises(SpecError, match=r"plan.instance_types\[0\]: 'p3.24xlarge' has no profile"):
        Plan.from_json(json.dumps(data))
    data["type_clouds"]["p3.24xlarge"] = data["type_clouds"][plan.instance_types[1]]
    data["type_clouds"]["p3.24xlarge"]["instance_type"] = "p3.24xlarge"
    edited = Plan.from_json(json.dumps(data))
    with pytest.raises(SpecError, match=r"plan.instance_types\[0\]: 'p3.24xlarge' is not in"):
        check_plan(edited, plan.spec, scaling_model(), p3_catalog())


# --- packing --------------------------------------------------------------------------------------

SHA256 = ExperimentSpec.sha(256, 1, 64, 4)


def packing_plans(packed, startup=5.0, memory_gb=3.0, deadline_s=3600.0):
    cloud = p3_catalog().get("p3.2xlarge")
    with_packing = compile_plan(SHA256, scaling_model(packed=packed, startup_s=startup, gpu_memory_gb_per_trial=memory_gb),
                                cloud, deadline_s, samples=60)
    without = compile_plan(SHA256, scaling_model(startup_s=startup, gpu_memory_gb_per_trial=memory_gb), cloud,
                           deadline_s, samples=60)
    return with_packing, without


def test_the_optimal_plan_packs_where_four_trials_cost_2_2x_and_is_far_cheaper():
    packed, alone = packing_plans({2: 1.3, 4: 2.2})
    assert 4 in packed.trials_per_gpu and alone.trials_per_gpu == ()
    assert alone.predicted.mean_cost_usd >= 1.3 * packed.predicted.mean_cost_usd
    assert packed.predicted.mean_jct_s <= 3600.0
    again = simulate_plan(packed, scaling_model(packed={2: 1.3, 4: 2.2}))
    assert again.trials_per_gpu == packed.trials_per_gpu
    assert again.mean_cost_usd == pytest.approx(packed.predicted.mean_cost_usd, rel=1e-12)


def test_no_packing_where_it_gives_no_throughput():
    packed, alone = packing_plans({2: 2.0, 4: 4.0}, startup=0.0)
    assert packed.trials_per_gpu == ()
    assert packed.predicted.mean_cost_usd == pytest.approx(alone.predicted.mean_cost_usd, rel=1e-12)


def test_packing_stays_within_the_gpu_memory():
    packed, _ = packing_plans({2: 1.3, 4: 2.2}, memory_gb=6.0)     # 16 GB V100s hold two 6 GB trials
    assert max(packed.packing) == 2


# --- profiles per GPU model -------------------------------------------------------------------------

def test_profiles_per_gpu_model_plan_each_type_by_its_own_and_list_the_skipped_types():
    exp = fig12()
    cat = exp.catalog.with_overrides(exp.cloud_overrides)
    cat = replace(cat, types={k: v for k, v in cat.types.items() if k in ("p3.2xlarge", "g4dn.xlarge", "g5.xlarge")})
    spec = ExperimentSpec.sha(8, 2, 8, 2)
    fast = scaling_model(measured_on="p3.2xlarge", gpus=(1,))
    slow = ModelProfile.from_dict({**fast.to_dict(), "measured_on": {}, "iter_latency_s": {1: {"dist": "normal", "mean": 30.0,
                                                                                              "std": 3.0}}})
    plan = compile_plan(spec, {"V100": fast, "T4": slow}, cat, 3600.0, instance_type="auto", samples=30)
    assert plan.info["skipped"] == {"g5.xlarge": "no A10G model profile"}
    rows = {c["instance_type"]: c for c in plan.considered if c["policy"] == "optimal"}
    assert set(rows) == {"p3.2xlarge", "g4dn.xlarge"}
    # The T4 type is planned by the T4 profile: 30 s per iteration, not 12.
    t4 = compile_plan(spec, slow.replace(measured_on={"gpu_model": "T4"}), cat.get("g4dn.xlarge"), 3600.0, samples=30)
    assert rows["g4dn.xlarge"]["cost_usd_mean"] == pytest.approx(t4.predicted.mean_cost_usd, rel=1e-9)


def test_whatif_plans_each_swept_type_by_its_gpu_models_profile():
    exp = fig12()
    cat = exp.catalog.with_overrides(exp.cloud_overrides)
    spec = ExperimentSpec.sha(8, 2, 8, 2)
    fast = scaling_model(measured_on="p3.2xlarge", gpus=(1,))
    slow = fast.replace(iter_latency_s={1: ModelProfile.from_dict({"name": "s", "iter_latency_s": {
        1: {"dist": "normal", "mean": 30.0, "std": 3.0}}}).latency(1)}, measured_on={"gpu_model": "T4"})
    rows = whatif(spec, {"V100": fast, "T4": slow}, cat.get("p3.2xlarge"), 3600.0,
                  {"instance_type": ["p3.2xlarge", "g4dn.xlarge"]}, ["optimal"], samples=30, cloud_for_type=cat.get)
    for row, profile in zip(rows, (fast, slow)):
        alone = compile_plan(spec, profile, cat.get(row.values["instance_type"]), 3600.0, samples=30)
        assert row.costs["optimal"] == pytest.approx(alone.predicted.mean_cost_usd, rel=1e-9)


@pytest.mark.parametrize("models,message", [
    ({"K80": "fast"}, r"model\['K80'\]: expected a GPU model name mapped to a ModelProfile"),
    ({"K80": None}, r"model\['K80'\]: expected a GPU model name mapped to a ModelProfile, got NoneType"),
    ({"K80": "ok"}, r"model\['K80'\]: no type of .* has K80 GPUs"),
    ({"V100": "ok", "v100": "ok"}, r"model\['v100'\]: 'V100' and 'v100' name one GPU model"),
    ({"T4": "ok"}, r"model\['T4'\]: profile 'm' was measured on V100, not T4; key it by V100"),
    ({}, r"model: expected a model profile, or a mapping of GPU model to profile"),
])
def test_bad_profiles_per_gpu_model_are_one_line(models, message):
    ok = scaling_model(measured_on="p3.2xlarge")
    models = {k: (ok if v == "ok" else v) for k, v in models.items()}
    with pytest.raises(SpecError, match=message):
        compile_plan(ExperimentSpec.sha(8, 2, 8, 2), models, fig12().catalog, 3600.0, instance_type="auto", samples=10)


# --- market ----------------------------------------------------------------------------------------

def test_a_market_given_with_a_profile_applies_to_it():
    cloud = p3_catalog().get("p3.8xlarge")         # on-demand, with a spot price
    spec = ExperimentSpec.sha(8, 2, 8, 2)
    plan = compile_plan(spec, scaling_model(), cloud, 3600.0, samples=20, market="spot")
    assert plan.cloud.market is Market.SPOT and all(plan.spot_counts)
    assert compile_plan(spec, scaling_model(), cloud, 3600.0, samples=20).spot_counts == (0,) * spec.num_stages()
    with pytest.raises(SpecError, match="market: p3.8xlarge has no spot_price_usd_per_hour"):
        compile_plan(spec, scaling_model(), cloud.replace(spot_price_usd_per_hour=None), 3600.0, samples=20, market="spot")


def test_a_market_vector_with_no_allocation_left_in_a_stage_is_infeasible_not_a_crash():
    """1-GPU trials on p3.2xlarge, spot at 30% with reclaims: once the incumbent's cost cuts every
    costly allocation of a stage, the search has nothing to lay out there (was a ValueError)."""
    c = p3_catalog().with_overrides({"spot": {"notice_s": 120, "preemption": {"rate_per_hour": 0.3}}}).get("p3.2xlarge")
    c = c.replace(spot_price_usd_per_hour=0.3 * c.price_usd_per_hour)
    with pytest.raises(InfeasibleDeadlineError, match="no plan meets the deadline of 5400s with probability 0.95"):
        compile_plan(ExperimentSpec.sha(128, 4, 4096, 2), usable_profile(fig12().model, 4, 1), c, 5400.0,
                     market="auto", confidence=0.95, samples=50)


def test_stage_floors_bound_every_plans_jct_sample_by_sample():
    """``jct_floor`` screens out types that cannot meet a deadline: every sample's JCT of any plan
    is at least the sum of its stages' floors (queues, INIT and reclaims only add)."""
    table = small_variants(samples=40)
    floor = sum(np.min([t.stage_floor(i) for t in table.tables], axis=0) for i in range(table.num_stages))
    rng = np.random.default_rng(5)
    for _ in range(12):
        alloc = [int(rng.choice(table.candidates(i))) for i in range(table.num_stages)]
        held = [table.need(i, k) for i, k in enumerate(alloc)]
        assert np.all(table.simulate(alloc, held).jct_s >= floor - 1e-9)


def test_when_every_type_misses_the_error_is_the_closest_types_own():
    with pytest.raises(InfeasibleDeadlineError, match=r"no plan meets the deadline of 60s; the shortest achievable JCT"):
        compile_plan(ExperimentSpec.sha(27, 4, 108, 3), scaling_model(), p3_catalog(), 60.0, instance_type="auto", samples=20)
