"""Fused trials in the planner (DESIGN §4.5, issue #23 item 3): each stage is unfused, packed
(``k``) or fused (``F``), chosen exactly (brute force agrees), fusion offered only where the
profile's fused throughput clears the packing rule's 1.05x and the group fits the GPU, and the
plan says what it left out and why."""

from __future__ import annotations

import json

import pytest

from rubberband import ExperimentSpec, SpecError
from rubberband.plan import Plan, check_plan, compile_plan, simulate_plan
from rubberband.plan.compile import fusion_counts, plan_allocation, usable_profile, variant_tables
from rubberband.plan.search import pareto_front
from rubberband.plan.variants import VariantTable, fusion_gain, fusion_pays
from rubberband.testing.builders import scaling_model

from .test_variants import SHA256, brute_force_cheapest, p3_catalog

# 3x the throughput at F = 8 (8 trials' iteration in 8/3 of one's), 2x at 4, 1.4x at 2.
PAYS = {2: 2 / 1.4, 4: 2.0, 8: 8 / 3}


def small_variants(samples: int = 20, fused=None, packed=None) -> VariantTable:
    """Two p3 types x (unfused, packed k, fused F): one search over every variant."""
    spec = ExperimentSpec.sha(8, 2, 8, 2)           # 8x2, 4x2, 2x4 iterations
    m = scaling_model(packed=packed if packed is not None else {2: 1.3, 4: 2.2},
                      fused=fused if fused is not None else PAYS, gpus=(1, 2, 4))
    cat = p3_catalog()
    tables, draws = [], None
    for name, G in (("p3.2xlarge", 1), ("p3.8xlarge", 4)):
        own = variant_tables(spec, usable_profile(m, 4, G), cat.get(name), samples, 7, draws)
        draws = own[0].draws
        tables += own
    return VariantTable(tables, m)


@pytest.mark.parametrize("deadline_s", [120.0, 200.0, 300.0, 400.0, 5000.0])
def test_the_search_with_fusion_in_the_choice_set_agrees_with_brute_force(deadline_s):
    table = small_variants()
    # 2 types x (unfused, k = 2, 4, F = 2, 4, 8)
    assert len(table.tables) == 12 and sorted(t.fused for t in table.tables) == [1] * 6 + [2, 2, 4, 4, 8, 8]
    front = pareto_front(table, deadline_s)
    best = min((table.evaluate(a, h)[1] for a, h in front), default=float("inf"))
    assert best == pytest.approx(brute_force_cheapest(table, deadline_s), rel=1e-9)


def test_the_brute_force_optimum_fuses_some_stage_and_is_cheaper_than_without_fusion():
    """The agreement above is not vacuous: the cheapest plan of the union fuses, and fusion saves."""
    table, plain = small_variants(), small_variants(fused={})
    assert len(plain.tables) == 6
    deadline_s = 400.0
    with_fusion, without = brute_force_cheapest(table, deadline_s), brute_force_cheapest(plain, deadline_s)
    assert with_fusion < 0.95 * without
    front = pareto_front(table, deadline_s)
    a, h = min(front, key=lambda p: table.evaluate(*p)[1])
    assert any(f > 1 for f in table.plan_fields(a, h)["fused_per_gpu"])


def test_a_stage_is_fused_or_packed_never_both():
    plan = compile_plan(SHA256, scaling_model(packed={2: 1.3, 4: 2.2}, fused=PAYS), p3_catalog().get("p3.2xlarge"),
                        3600.0, samples=40)
    assert all(k == 1 or f == 1 for k, f in zip(plan.packing, plan.fusion))
    assert any(f > 1 for f in plan.fusion)


def fusion_plans(fused, startup=5.0, deadline_s=3600.0, **kwargs):
    cloud = p3_catalog().get("p3.2xlarge")
    with_fusion = compile_plan(SHA256, scaling_model(fused=fused, startup_s=startup, **kwargs), cloud, deadline_s,
                               samples=60)
    without = compile_plan(SHA256, scaling_model(startup_s=startup), cloud, deadline_s, samples=60)
    return with_fusion, without


def test_the_planner_fuses_where_3x_at_8_pays_and_is_at_least_1_5x_cheaper():
    """Issue #23's bar: a profile with 3x the throughput at F = 8."""
    fused, alone = fusion_plans({8: 8 / 3})
    assert fusion_gain(fused_model := scaling_model(fused={8: 8 / 3}), 8) == pytest.approx(3.0)
    assert 8 in fused.fused_per_gpu and alone.fused_per_gpu == ()
    assert alone.predicted.mean_cost_usd >= 1.5 * fused.predicted.mean_cost_usd
    assert fused.predicted.mean_jct_s <= 3600.0
    again = simulate_plan(fused, fused_model)
    assert again.fused_per_gpu == fused.fused_per_gpu
    assert again.mean_cost_usd == pytest.approx(fused.predicted.mean_cost_usd, rel=1e-12)


@pytest.mark.parametrize("startup", [0.0, 5.0, 60.0])
def test_never_fused_where_f_trials_take_f_times_as_long(startup):
    """``L_F = F * L_1``: no throughput, however many start-ups a group would save, and the plan
    says why the profiled sizes were left out."""
    fused, alone = fusion_plans({2: 2.0, 4: 4.0, 8: 8.0}, startup=startup)
    assert fused.fused_per_gpu == ()
    assert fused.predicted.mean_cost_usd == pytest.approx(alone.predicted.mean_cost_usd, rel=1e-12)
    assert any(w.startswith("fusion: profile") and "1.00x at 8 fused" in w and "1.05x" in w for w in fused.warnings)


def test_only_the_sizes_that_pay_and_fit_are_offered():
    """1.5x at 2, 1.04x at 4 (under 5%), 3x at 8 and 16; 16 needs 2 + 15 * 1.0 = 17 GB, over a
    V100's 16 GB (Hydro's rule: F_max = floor((16 - 2) / 1) + 1 = 15)."""
    m = scaling_model(fused={2: 2 / 1.5, 4: 4 / 1.04, 8: 8 / 3, 16: 16 / 3}, fused_memory_gb={1: 2.0, 8: 9.0})
    cloud = p3_catalog().get("p3.2xlarge")
    assert m.max_fused(cloud.gpu_memory_gb) == 15
    assert fusion_pays(m, 2) and not fusion_pays(m, 4) and fusion_pays(m, 1)
    assert fusion_counts(m, cloud) == [2, 8]
    plan = compile_plan(SHA256, m, cloud, 3600.0, samples=30)
    assert set(plan.fusion) <= {1, 2, 8}
    assert any("1.04x at 4 fused" in w for w in plan.warnings)
    assert any(w.startswith("fusion: 16 (17 GB) fused per GPU do not fit the 16 GB of one p3.2xlarge GPU")
               for w in plan.warnings)


def test_fusion_needs_1_gpu_trials():
    """A profile of 2-GPU trials fuses nothing (the profile itself refuses fused latencies then)."""
    with pytest.raises(SpecError, match=r"fused_iter_latency_s: only 1-GPU trials are fused"):
        scaling_model(gpus=(2, 4), fused={8: 8 / 3})


def test_the_plan_json_keeps_fusion_and_a_plan_without_it_loads_as_all_one():
    plan, _ = fusion_plans({8: 8 / 3})
    model = scaling_model(fused={8: 8 / 3})
    data = json.loads(plan.to_json())
    assert data["fused_per_gpu"] == list(plan.fusion) and len(data["fused_per_gpu"]) == len(plan.allocation)
    back = Plan.from_json(plan.to_json())
    assert back.fused_per_gpu == plan.fused_per_gpu and back.predicted.fused_per_gpu == plan.predicted.fused_per_gpu
    checked = check_plan(back, plan.spec, model, p3_catalog(), samples=60)
    assert checked.predicted.mean_cost_usd == pytest.approx(plan.predicted.mean_cost_usd, rel=1e-9)
    # A plan file written before fusion existed: no fused_per_gpu anywhere.
    del data["fused_per_gpu"]
    for stage in data["predicted"]["stages"]:
        stage.pop("fused_per_gpu", None)
    old = Plan.from_json(json.dumps(data))
    assert old.fused_per_gpu == () and old.fusion == (1,) * len(plan.allocation)
    # Fused and packed in one stage of a file: one line naming the field.
    data["fused_per_gpu"], data["trials_per_gpu"] = [8] + [1] * (len(plan.allocation) - 1), [2] + [1] * (
        len(plan.allocation) - 1)
    with pytest.raises(SpecError, match=r"plan.fused_per_gpu\[0\]: stage 0 also packs 2 trials per GPU"):
        Plan.from_json(json.dumps(data))


def test_a_manual_allocation_can_be_fused():
    spec = ExperimentSpec.sha(16, 2, 8, 2)
    model = scaling_model(fused={4: 2.0})
    plan = plan_allocation(spec, [4, 2, 4], model, p3_catalog().get("p3.8xlarge"), 3600.0, samples=20,
                           fused_per_gpu=[4, 4, 1])
    assert plan.fused_per_gpu == (4, 4, 1) and plan.predicted.fused_per_gpu == (4, 4, 1)
