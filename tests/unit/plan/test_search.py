"""The optimal policy's search (plan/search.py, plan/queue.py): bounds that hold, pruning that
changes nothing, round-at-a-time list scheduling that is the simulator's, and progress."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from rubberband import Billing, BillingModel, ExperimentSpec, ModelProfile, load_experiment
from rubberband.plan import compile_plan, whatif
from rubberband.plan.policies import choose, optimal_policy, static_candidates
from rubberband.plan.queue import list_schedule
from rubberband.plan.search import BOUNDS, SIMULATING, PlanProgress, StageGraph, pareto_front
from rubberband.plan.table import StageTable
from rubberband.profiles.cloud import Market
from rubberband.profiles.spot import SpotMarket
from rubberband.simulator.model import list_schedule as one_at_a_time

ROOT = Path(__file__).resolve().parents[3]


@cache
def fig12():
    return load_experiment(ROOT / "experiments" / "resnet50_sha512.yaml")


@cache
def wide_model(max_gpus: int = 16) -> ModelProfile:
    """Issue #14's curve, t(g) = 12 (0.05 + 0.95 / g) s with a 10% std, up to ``max_gpus`` per trial."""
    latency = {g: {"dist": "normal", "mean": 12 * (0.05 + 0.95 / g), "std": 1.2 * (0.05 + 0.95 / g)}
               for g in (1, 2, 4, 8, 16, 32, 64) if g <= max_gpus}
    return ModelProfile.from_dict({"name": "wide", "iter_latency_s": latency,
                                   "trial_startup_s": {"dist": "constant", "value": 5.0},
                                   "sync_s": {"dist": "constant", "value": 1.0}})


# --- list scheduling a round at a time -------------------------------------------------------------

@pytest.mark.parametrize("n,gpus,cv", [(200, 50, 0.1), (200, 13, 0.1), (60, 7, 1.0), (30, 4, 0.0), (9, 4, 3.0),
                                       (100, 99, 0.2), (5, 8, 0.1)])
def test_round_at_a_time_is_the_simulators_list_schedule_to_the_bit(n, gpus, cv):
    rng = np.random.default_rng(n * gpus)
    durations = np.maximum(rng.normal(10.0, 10.0 * cv, (n, 300)), 0.0) + 5.0
    if cv == 0.0:      # ties everywhere: which GPU takes a trial may differ, the makespan may not
        durations = np.round(durations)
    assert np.array_equal(list_schedule(durations, gpus), one_at_a_time(durations, gpus))


# --- bounds ---------------------------------------------------------------------------------------------

def test_stage_bounds_are_below_the_simulated_means_for_queues_and_spot_stages():
    exp = fig12()
    spec = ExperimentSpec.sha(64, 4, 64, 2)
    cloud = exp.cloud.replace(spot_price_usd_per_hour=3.0, spot=SpotMarket(notice_s=120, rate_per_hour=2.0))
    base = StageTable(spec, exp.model, cloud, samples=50, seed=1)
    for table in (base, base.for_markets((Market.SPOT,) * spec.num_stages())):
        for i in range(spec.num_stages()):
            for a in table.candidates(i):
                t, c = table.stage_bounds(i, a)
                e = table.entry(i, a)
                duration, cost = table.stage(i, a, table.need(i, a), 0)
                assert t <= e.train_s + table.sync_s[i] + 1e-9 and t <= duration + 1e-9, (i, a)
                assert c <= cost + 1e-9, (i, a)


# --- pruning changes nothing --------------------------------------------------------------------------

def uncapped_choice(table: StageTable, deadline_s: float, confidence: float | None):
    """The plan the search would choose without incumbents, caps or bounds: the whole front."""
    graph = StageGraph(table, deadline_s)
    from rubberband.plan.policies import _candidate
    cands = [_candidate(table, a, h) for a, h in pareto_front(table, deadline_s, graph=graph)]
    return choose(table, cands + static_candidates(table, deadline_s), deadline_s, confidence)


def exact_billing(cloud):
    """Billing whose rounding is negligible: the surrogate cost is the billed cost."""
    return cloud.replace(billing=Billing(BillingModel.PER_INSTANCE, 1e-6, 0.0))


@pytest.mark.parametrize("exact", [True, False], ids=["exact-billing", "default-billing"])
@pytest.mark.parametrize("deadline_min,confidence", [(15, None), (25, None), (60, None), (25, 0.9), (200, 0.95)])
def test_the_cut_search_chooses_what_the_whole_front_does(deadline_min, confidence, exact):
    """Same plan as choosing over the whole front when the surrogate is the billed cost; with
    rounded billing never dearer (the incumbent it keeps may be off the surrogate front)."""
    exp = fig12()
    spec = ExperimentSpec.sha(64, 4, 512, 2)
    cloud = exact_billing(exp.cloud) if exact else exp.cloud
    deadline = deadline_min * 60.0
    whole = uncapped_choice(StageTable(spec, wide_model(), cloud, samples=30, seed=3), deadline, confidence)
    table = StageTable(spec, wide_model(), cloud, samples=30, seed=3)     # fresh: nothing simulated yet
    cut = choose(table, optimal_policy(table, deadline, confidence), deadline, confidence)
    assert (whole is None) == (cut is None)
    if whole is None:
        return
    if exact:
        assert cut[1].mean_cost_usd == pytest.approx(whole[1].mean_cost_usd, rel=1e-9)
    else:
        assert cut[1].mean_cost_usd <= whole[1].mean_cost_usd + 1e-9


@pytest.mark.parametrize("exact", [True, False], ids=["exact-billing", "default-billing"])
def test_hyperband_plans_are_those_of_the_whole_front(exact):
    exp = fig12()
    spec = ExperimentSpec.chain(ExperimentSpec.hyperband(1, 9, 3))
    cloud = exact_billing(exp.cloud) if exact else exp.cloud
    for deadline in (180.0, 300.0, 1500.0):
        whole = uncapped_choice(StageTable(spec, wide_model(4), cloud, samples=30, seed=0), deadline, None)
        plan = compile_plan(spec, wide_model(4), cloud, deadline, samples=30, seed=0)
        if exact:
            assert plan.predicted.mean_cost_usd == pytest.approx(whole[1].mean_cost_usd, rel=1e-9)
        else:
            assert plan.predicted.mean_cost_usd <= whole[1].mean_cost_usd + 1e-9


# --- progress -----------------------------------------------------------------------------------------------

def test_progress_reports_every_stage_of_the_search():
    exp = fig12()
    events: list[PlanProgress] = []
    compile_plan(exp.spec, exp.model, exp.cloud, 5400.0, samples=30, progress=events.append)
    n = exp.spec.num_stages()
    # Full simulations are announced too (issue #22: the line names where the time goes).
    stages = [e for e in events if e.phase != SIMULATING]
    assert stages and all(e.stages == n and 1 <= e.stage <= n and e.scenarios == 0 for e in stages)
    assert all(e.kept >= 1 for e in stages if e.phase != BOUNDS)      # no costly allocation may survive a stage
    assert {e.stage for e in stages} == set(range(1, n + 1))


def test_progress_of_a_sweep_names_each_scenario():
    exp = fig12()
    events: list[PlanProgress] = []
    whatif(exp.spec, exp.model, exp.cloud, 5400.0, {"deadline_s": [4800.0, 6000.0]}, ["optimal"], samples=30,
           progress=events.append)
    assert {(e.scenario, e.scenarios) for e in events} == {(1, 2), (2, 2)}


def test_no_progress_callback_is_fine_and_prints_nothing(capsys):
    exp = fig12()
    compile_plan(exp.spec, exp.model, exp.cloud, 5400.0, samples=30)
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_no_state_of_the_search_holds_more_than_max_instances_not_even_the_instances_held_at_the_start():
    """9 instances held at the start, room for 3: every stage may keep up to 3 of them for a
    later stage, never all 9 (the cluster could not hold them)."""
    exp = load_experiment(ROOT / "experiments" / "resnet101_cifar10.yaml")
    table = StageTable(exp.spec, exp.model, exp.cloud, samples=20, held_at_start=9, max_instances=3)
    graph = StageGraph(table)
    assert all(int(h) <= 3 for held in graph.held for h in held)
    assert all(int(h) <= 3 for later in graph.later for h in later)
    free = StageGraph(StageTable(exp.spec, exp.model, exp.cloud, samples=20, held_at_start=9))
    assert 9 in free.later[0]       # uncapped, keeping all 9 is an option
