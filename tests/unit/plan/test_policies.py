"""The planner: optimal against brute force, policy invariants, paper trends, Plan JSON, what-if."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband import (
    Billing,
    BillingModel,
    CloudCatalog,
    CloudProfile,
    DataCost,
    ExperimentSpec,
    InfeasibleDeadlineError,
    ModelProfile,
    SpecError,
)
from rubberband import load_experiment as _load_experiment
from rubberband.plan import (
    POLICIES,
    Plan,
    StageTable,
    compile_plan,
    fastest_plan,
    saving,
    simulate_plan,
    static_allocation,
    valid_allocations,
    whatif,
)
from rubberband.plan.compile import plan_on_table
from rubberband.profiles.distributions import Constant, Normal
from rubberband.simulator import instances_needed, simulate
from rubberband.testing.builders import cloud_profile, model_profile

ROOT = Path(__file__).resolve().parents[3]
SHA512 = ROOT / "experiments" / "resnet50_sha512.yaml"
SHA64 = ROOT / "experiments" / "resnet50_sha64.yaml"
CIFAR = ROOT / "experiments" / "resnet101_cifar10.yaml"


@cache
def load_experiment(path: Path):
    """Experiments are frozen values: load each file once per test session."""
    return _load_experiment(path)


# Per-instance billing whose rounding is negligible: the planner's surrogate cost is exact.
# (cloud_profile's billing keywords.)
EXACT = {"granularity_s": 1e-6, "minimum_s": 0}
DEFAULT = {"granularity_s": 1, "minimum_s": 60}
PER_FUNCTION = {"per_function": True}


# --- small random jobs -------------------------------------------------------------------------

def normal_model(rng: random.Random, gpu_counts=(1, 2, 4)) -> ModelProfile:
    """A model profile with random normal iteration latencies, sublinear in GPUs."""
    base = rng.uniform(10.0, 80.0)
    lat = {}
    for g in gpu_counts:
        mean = base / g ** rng.uniform(0.5, 0.95)
        lat[g] = Normal(mean, mean * rng.uniform(0.0, 0.3))
    return model_profile(lat, startup_s=Normal(5.0, 1.0), sync_s=1.0, name="random")


def make_cloud(rng: random.Random, gpus_per_instance: int, billing: dict) -> CloudProfile:
    """$3 a GPU-hour, a random mean INIT and a random data price (drawn in this order)."""
    return cloud_profile("test.large", gpus_per_instance, 3.0 * gpus_per_instance, provision_s=Normal(20.0, 5.0),
                         init_s=Normal(rng.uniform(0.0, 90.0), 10.0), dataset_gb=1.0,
                         usd_per_gb=rng.choice([0.0, 0.05]), **billing)


@dataclass(frozen=True)
class Job:
    name: str
    spec: ExperimentSpec
    gpus_per_instance: int
    gpu_counts: tuple[int, ...]


JOBS = [
    Job("sha8-G4", ExperimentSpec.sha(8, 1, 8, 2), 4, (1, 2, 4)),
    Job("sha9-eta3-G2", ExperimentSpec.sha(9, 1, 9, 3), 2, (1, 2, 4)),
    Job("6-3-1-G2", ExperimentSpec.from_stages([(6, 2), (3, 4), (1, 6)]), 2, (1, 2)),
    Job("4-2-G2", ExperimentSpec.from_stages([(4, 3), (2, 6)]), 2, (1, 2, 4)),
    Job("5-2-1-G4", ExperimentSpec.from_stages([(5, 1), (2, 3), (1, 9)]), 4, (1, 2)),
    Job("2-brackets-G2", ExperimentSpec.chain([ExperimentSpec.from_stages([(2, 2), (1, 4)]),
                                               ExperimentSpec.from_stages([(3, 2)])]), 2, (1, 2, 4)),
]
SAMPLES = 30


@dataclass(frozen=True)
class Point:
    allocation: tuple[int, ...]
    instances: tuple[int, ...]
    jct_s: float
    cost_usd: float


def setup(job: Job, billing: dict, seed: int) -> tuple[ModelProfile, CloudProfile]:
    rng = random.Random(f"{job.name}/{seed}")
    return normal_model(rng, job.gpu_counts), make_cloud(rng, job.gpus_per_instance, billing)


_BRUTE: dict[tuple, list[Point]] = {}


def static_clusters(spec: ExperimentSpec, model: ModelProfile, cloud: CloudProfile) -> list[tuple[tuple[int, ...], int]]:
    """Every static cluster of K instances (the paper's fair share of K*G GPUs per stage), K = 1..K_max."""
    G = cloud.gpus_per_instance
    table = StageTable(spec, model, cloud, samples=1, seed=0)
    k_max = max(instances_needed(s.num_trials, max(valid_allocations(s.num_trials, model, G)), G) for s in spec.stages)
    out = []
    for k in range(1, k_max + 1):
        alloc = static_allocation(table, k)
        if alloc is not None:
            out.append((alloc, k))
    return out


def brute_force(spec: ExperimentSpec, model: ModelProfile, cloud: CloudProfile, seed: int,
                held_at_start: int = 0) -> list[Point]:
    """The optimal policy's documented search space, enumerated: every valid allocation vector
    (``valid_allocations`` per stage) with every held vector in which each stage holds the
    fewest instances its allocation needs or as many as some later stage's valid allocation
    needs (or, before the last stage, the ``held_at_start`` instances the job starts with),
    plus every static cluster (K instances in every stage); each plan simulated in full with
    the same seed (common random numbers), from the instances held at the start.

    Cached by job, so tests over the same job and seed share one enumeration.
    """
    key = (spec, repr(model.to_dict()), repr(cloud.to_dict()), seed, held_at_start)
    if key in _BRUTE:
        return _BRUTE[key]
    out = []
    G = cloud.gpus_per_instance
    valid = [valid_allocations(s.num_trials, model, G) for s in spec.stages]
    needs = [{instances_needed(s.num_trials, a, G) for a in v} for s, v in zip(spec.stages, valid)]
    later = [set().union(*needs[i + 1:]) for i in range(len(needs))]
    if held_at_start:
        later = [v | {held_at_start} if i < len(later) - 1 else v for i, v in enumerate(later)]
    for alloc in itertools.product(*valid):
        fewest = [instances_needed(s.num_trials, a, G) for s, a in zip(spec.stages, alloc)]
        holds = [[n] + sorted(v for v in later[i] if v > n) for i, n in enumerate(fewest)]
        for held in itertools.product(*holds):
            r = simulate(spec, alloc, model, cloud, samples=SAMPLES, seed=seed, instances=held,
                         held_at_start=held_at_start)
            out.append(Point(tuple(alloc), tuple(r.instances), r.mean_jct_s, r.mean_cost_usd))
    for alloc, k in static_clusters(spec, model, cloud):
        r = simulate(spec, alloc, model, cloud, samples=SAMPLES, seed=seed, instances=(k,) * spec.num_stages(),
                     held_at_start=held_at_start)
        out.append(Point(tuple(alloc), tuple(r.instances), r.mean_jct_s, r.mean_cost_usd))
    _BRUTE[key] = out
    return out


def deadlines(points: list[Point]) -> dict[str, float]:
    """Tight, medium and loose deadlines, kept away from every plan's mean JCT."""
    jcts = sorted(p.jct_s for p in points)
    lo, hi = jcts[0], jcts[-1]
    out = {}
    for name, q in (("tight", 0.02), ("medium", 0.25), ("loose", 0.8)):
        d = lo + q * (hi - lo) + 1e-3
        while any(abs(j - d) < 1e-6 * d for j in jcts):
            d += 1e-3
        out[name] = d
    return out


def cheapest(points: list[Point], deadline_s: float) -> Point:
    return min((p for p in points if p.jct_s <= deadline_s), key=lambda p: p.cost_usd)


def launches(instances) -> int:
    """Instance launches of a plan: every increase of the held count."""
    total = previous = 0
    for h in instances:
        total += max(0, h - previous)
        previous = h
    return total


# --- optimal equals brute force ----------------------------------------------------------------

# The largest job (840 allocation vectors) runs with one seed, the others with two.
JOB_SEEDS = [pytest.param(job, seed, id=f"{job.name}-seed{seed}")
             for job in JOBS for seed in ((0,) if job is JOBS[0] else (0, 7))]


@pytest.mark.parametrize("billing", [EXACT, PER_FUNCTION], ids=["per-instance-exact", "per-function"])
@pytest.mark.parametrize("job,seed", JOB_SEEDS)
def test_optimal_equals_brute_force(job, seed, billing):
    model, cloud = setup(job, billing, seed)
    points = brute_force(job.spec, model, cloud, seed)
    for label, d in deadlines(points).items():
        best = cheapest(points, d)
        plan = compile_plan(job.spec, model, cloud, d, policy="optimal", samples=SAMPLES, seed=seed)
        ties = {(p.allocation, p.instances) for p in points
                if p.jct_s <= d and abs(p.cost_usd - best.cost_usd) <= 1e-9 * best.cost_usd}
        assert (plan.allocation, plan.instances) in ties, (label, d, plan.allocation, plan.instances, best)
        assert plan.predicted.mean_cost_usd == pytest.approx(best.cost_usd, rel=1e-9), label
        assert plan.predicted.mean_jct_s <= d


# A function trainable that checkpoints every 3 reports: each resumed stage trains its D mod 3
# redone iterations too. The table builds its stage work from the simulator's own rule
# (``redone_iters``), so the search is still exactly the brute force's cheapest.
REDO_JOBS = [pytest.param(job, id=job.name) for job in (JOBS[2], JOBS[4], JOBS[5])]


@pytest.mark.parametrize("billing", [EXACT, PER_FUNCTION], ids=["per-instance-exact", "per-function"])
@pytest.mark.parametrize("job", REDO_JOBS)
def test_optimal_equals_brute_force_with_a_checkpoint_every_3_reports(job, billing):
    seed = 7
    model, cloud = setup(job, billing, seed)
    model = model.replace(checkpoint_every=3)
    table = StageTable(job.spec, model, cloud, samples=SAMPLES, seed=seed)
    assert any(table.redone), table.redone          # some stage of the job redoes iterations
    points = brute_force(job.spec, model, cloud, seed)
    for label, d in deadlines(points).items():
        best = cheapest(points, d)
        plan = compile_plan(job.spec, model, cloud, d, policy="optimal", samples=SAMPLES, seed=seed)
        ties = {(p.allocation, p.instances) for p in points
                if p.jct_s <= d and abs(p.cost_usd - best.cost_usd) <= 1e-9 * best.cost_usd}
        assert (plan.allocation, plan.instances) in ties, (label, d, plan.allocation, plan.instances, best)
        assert plan.predicted.mean_cost_usd == pytest.approx(best.cost_usd, rel=1e-9), label
        assert [s.redone for s in plan.predicted.stages] == list(table.redone)
        assert np.array_equal(simulate_plan(plan, model).cost_usd, plan.predicted.cost_usd)


# A short bracket, then one that needs more instances: keeping the 5 held through stage 0 (it
# needs fewer) and launching one more at stage 1 is the cheapest plan at the tight deadline.
CHAIN = Job("2-then-6-G1", ExperimentSpec.chain([ExperimentSpec.from_stages([(2, 2)]),
                                                 ExperimentSpec.from_stages([(6, 2), (2, 4)])]), 1, (1, 2))
HELD_CASES = [pytest.param(job, held, 7, id=f"{job.name}-held{held}") for job in JOBS[1:] for held in (1, 3)] \
    + [pytest.param(CHAIN, 5, 0, id=f"{CHAIN.name}-held5")]


@pytest.mark.parametrize("billing", [EXACT, PER_FUNCTION], ids=["per-instance-exact", "per-function"])
@pytest.mark.parametrize("job,held,seed", HELD_CASES)
def test_optimal_equals_brute_force_from_instances_held_at_the_start(job, held, seed, billing):
    """A re-plan starts from the instances held now: the search, started from them, is still
    the brute force's cheapest (holding the held count through a stage that needs fewer is in
    its space), and the plan's prediction is its simulation from them."""
    model, cloud = setup(job, billing, seed)
    points = brute_force(job.spec, model, cloud, seed, held_at_start=held)
    for label, d in deadlines(points).items():
        best = cheapest(points, d)
        plan = compile_plan(job.spec, model, cloud, d, policy="optimal", samples=SAMPLES, seed=seed,
                            held_at_start=held)
        ties = {(p.allocation, p.instances) for p in points
                if p.jct_s <= d and abs(p.cost_usd - best.cost_usd) <= 1e-9 * best.cost_usd}
        assert (plan.allocation, plan.instances) in ties, (label, d, plan.allocation, plan.instances, best)
        assert plan.predicted.mean_cost_usd == pytest.approx(best.cost_usd, rel=1e-9), label
        assert plan.held_at_start.count == held
        assert np.array_equal(simulate_plan(plan, model).cost_usd, plan.predicted.cost_usd)


CAP_CASES = [pytest.param(job, held, id=f"{job.name}-held{held}") for job in JOBS[1:] for held in (0, 9)]


@pytest.mark.parametrize("billing", [EXACT, PER_FUNCTION], ids=["per-instance-exact", "per-function"])
@pytest.mark.parametrize("job,held", CAP_CASES)
def test_optimal_equals_brute_force_within_max_instances(job, held, billing):
    """With ``max_instances`` (a cluster's room) the search is exact over the plans that never
    hold more: the brute force's cheapest among them. 9 held at the start is above every cap
    here: no stage may keep them all."""
    seed = 7
    model, cloud = setup(job, billing, seed)
    points = brute_force(job.spec, model, cloud, seed, held_at_start=held)
    # The largest cap under which the cheapest plan at one of the deadlines would hold more
    # than it allows (the cap changes the answer), else half the most any plan holds.
    most = max(max(p.instances) for p in points)
    cap = next((c for c in range(most - 1, 0, -1)
                if any(max(cheapest(points, d).instances) > c
                       for d in deadlines([p for p in points if max(p.instances) <= c]).values())), most // 2)
    fits = [p for p in points if max(p.instances) <= cap]
    for label, d in deadlines(fits).items():
        best = cheapest(fits, d)
        plan = compile_plan(job.spec, model, cloud, d, policy="optimal", samples=SAMPLES, seed=seed,
                            held_at_start=held or None, max_instances=cap)
        assert max(plan.instances) <= cap, (label, plan.instances)
        ties = {(p.allocation, p.instances) for p in fits
                if p.jct_s <= d and abs(p.cost_usd - best.cost_usd) <= 1e-9 * best.cost_usd}
        assert (plan.allocation, plan.instances) in ties, (label, d, plan.allocation, plan.instances, best)
        assert plan.predicted.mean_cost_usd == pytest.approx(best.cost_usd, rel=1e-9), label
        for name in POLICIES:       # the baselines keep within it too
            try:
                other = compile_plan(job.spec, model, cloud, d, policy=name, samples=SAMPLES, seed=seed,
                                     held_at_start=held or None, max_instances={cloud.instance_type: cap})
            except InfeasibleDeadlineError:
                continue
            assert max(other.instances) <= cap, (name, other.instances)


def test_fastest_plan_named_by_an_infeasible_deadline_keeps_within_max_instances():
    job = JOBS[1]
    model, cloud = setup(job, EXACT, 0)
    points = brute_force(job.spec, model, cloud, 0)
    cap = max(min(points, key=lambda p: p.jct_s).instances) - 1
    fastest = min((p for p in points if max(p.instances) <= cap), key=lambda p: p.jct_s)
    assert fastest.jct_s > min(p.jct_s for p in points)      # the cap slows the fastest plan
    with pytest.raises(InfeasibleDeadlineError, match="shortest achievable JCT") as info:
        compile_plan(job.spec, model, cloud, 0.9 * fastest.jct_s, samples=SAMPLES, seed=0, max_instances=cap)
    assert info.value.min_jct_s == pytest.approx(fastest.jct_s, rel=1e-9)
    # The re-planner's fallback runs the allocation named on the fewest instances: within the cap too.
    assert max(instances_needed(s.num_trials, a, cloud.gpus_per_instance)
               for s, a in zip(job.spec.stages, info.value.allocation)) <= cap


@pytest.mark.parametrize("billing", [DEFAULT, PER_FUNCTION], ids=["per-instance", "per-function"])
@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.name)
def test_stage_grid_equals_stage_one_plan_at_a_time(job, billing):
    model, cloud = setup(job, billing, 5)
    cloud = CloudProfile.from_dict({**cloud.to_dict(), "data": {"dataset_gb": 1.0, "price_usd_per_gb": 0.05}})
    table = StageTable(job.spec, model, cloud, samples=SAMPLES, seed=5)
    most = max(table.need(i, a) for i in range(table.num_stages) for a in table.candidates(i))
    previous = np.arange(0, most + 2)
    for i in range(table.num_stages):
        allocs = np.array([a for a in table.candidates(i) for _ in range(3)])
        held = np.array([table.need(i, a) + extra for a in table.candidates(i) for extra in (0, 1, 3)])
        dur, cost = table.stage_grid(i, allocs, held, previous)
        for r, hp in enumerate(previous):
            for c, (a, h) in enumerate(zip(allocs, held)):
                assert (dur[r, c], cost[r, c]) == table.stage(i, int(a), int(h), int(hp))


@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.name)
def test_optimal_within_rounding_tolerance_of_brute_force_with_default_billing(job):
    """Rounding billed time (1 s, at least 60 s) is outside the surrogate; the documented
    tolerance is max(granularity, minimum) per launch of the brute-force plan."""
    seed = 3
    model, cloud = setup(job, DEFAULT, seed)
    points = brute_force(job.spec, model, cloud, seed)
    slack = max(cloud.billing.granularity_s, cloud.billing.minimum_s) * cloud.usd_per_second
    for label, d in deadlines(points).items():
        best = cheapest(points, d)
        plan = compile_plan(job.spec, model, cloud, d, samples=SAMPLES, seed=seed)
        assert plan.predicted.mean_jct_s <= d
        assert plan.predicted.mean_cost_usd <= best.cost_usd + launches(best.instances) * slack + 1e-9, label
        assert plan.predicted.mean_cost_usd >= best.cost_usd - 1e-9 * best.cost_usd, label


# --- infeasible deadlines ----------------------------------------------------------------------

@pytest.mark.parametrize("job", JOBS[:5], ids=lambda j: j.name)
def test_infeasible_deadline_names_the_shortest_achievable_jct(job):
    seed = 0
    model, cloud = setup(job, EXACT, seed)
    min_jct = min(p.jct_s for p in brute_force(job.spec, model, cloud, seed))
    with pytest.raises(InfeasibleDeadlineError, match="shortest achievable JCT") as info:
        compile_plan(job.spec, model, cloud, 0.9 * min_jct, samples=SAMPLES, seed=seed)
    err = info.value
    assert err.min_jct_s == pytest.approx(min_jct, rel=1e-9)
    assert f"{min_jct:.0f}s" in str(err)
    plan = compile_plan(job.spec, model, cloud, min_jct * (1 + 1e-7), samples=SAMPLES, seed=seed)
    assert plan.predicted.mean_jct_s == pytest.approx(min_jct, rel=1e-9)


def test_infeasible_deadline_for_a_baseline_policy_raises_too():
    exp = load_experiment(CIFAR)
    for name in POLICIES:
        with pytest.raises(InfeasibleDeadlineError, match="shortest achievable JCT"):
            compile_plan(exp.spec, exp.model, exp.cloud, 60.0, policy=name, samples=50)


# --- policy invariants on many random small jobs -----------------------------------------------

@st.composite
def small_jobs(draw):
    n = draw(st.integers(2, 16))
    eta = draw(st.sampled_from([2, 3]))
    min_iters = draw(st.integers(1, 3))
    spec = ExperimentSpec.sha(n, min_iters, min_iters * draw(st.integers(2, 12)), eta)
    seed = draw(st.integers(0, 2**16))
    rng = random.Random(seed)
    counts = draw(st.sampled_from([(1,), (1, 2), (1, 2, 4), (2, 4), (1, 4, 8)]))
    billing = draw(st.sampled_from([EXACT, DEFAULT, PER_FUNCTION]))
    G = draw(st.sampled_from([1, 2, 4, 8]))
    return spec, normal_model(rng, counts), make_cloud(rng, G, billing), seed, draw(st.floats(1.0, 3.0))


def plans_by_policy(spec, model, cloud, deadline_s, seed, confidence=None) -> dict[str, Plan | None]:
    out = {}
    for name in POLICIES:
        try:
            out[name] = compile_plan(spec, model, cloud, deadline_s, policy=name, samples=SAMPLES, seed=seed,
                                     confidence=confidence)
        except InfeasibleDeadlineError:
            out[name] = None
    return out


@settings(max_examples=40, deadline=None)
@given(small_jobs())
def test_every_policy_meets_the_deadline_and_greedy_never_loses_to_static(job):
    spec, model, cloud, seed, slack = job
    fastest = fastest_plan(StageTable(spec, model, cloud, samples=SAMPLES, seed=seed))
    deadline = fastest.jct_s * slack
    plans = plans_by_policy(spec, model, cloud, deadline, seed)
    assert plans["optimal"] is not None        # the fastest plan meets it
    for name, plan in plans.items():
        if plan is not None:
            assert plan.policy == name
            assert plan.predicted.mean_jct_s <= deadline * (1 + 1e-9)
            assert plan.allocation == plan.predicted.allocation and plan.instances == plan.predicted.instances
    if plans["static"] is not None:
        assert plans["greedy"] is not None
        assert plans["greedy"].predicted.mean_cost_usd <= plans["static"].predicted.mean_cost_usd + 1e-9


def in_optimal_space(plan: Plan, model: ModelProfile) -> bool:
    """Whether a plan is one the optimal policy searches: valid allocations with the fewest
    instances, or a static cluster."""
    G = plan.cloud.gpus_per_instance
    if plan.policy == "static":
        return True
    return all(a in valid_allocations(s.num_trials, model, G) and h == instances_needed(s.num_trials, a, G)
               for s, a, h in zip(plan.spec.stages, plan.allocation, plan.instances))


@settings(max_examples=40, deadline=None)
@given(small_jobs())
def test_optimal_never_costlier_than_any_baseline_it_could_have_chosen(job):
    """Optimal <= greedy/static/naive-elastic whenever their plan lies in optimal's search space
    (see the xfail tests below for plans outside it). With rounded billing the documented
    tolerance is max(granularity, minimum) per launch."""
    spec, model, cloud, seed, slack = job
    deadline = fastest_plan(StageTable(spec, model, cloud, samples=SAMPLES, seed=seed)).jct_s * slack
    plans = plans_by_policy(spec, model, cloud, deadline, seed)
    best = plans["optimal"].predicted.mean_cost_usd
    rounding = 0.0
    if cloud.billing.model is BillingModel.PER_INSTANCE:
        rounding = max(cloud.billing.granularity_s, cloud.billing.minimum_s) * cloud.usd_per_second
    for name in ("greedy", "static", "naive-elastic"):
        plan = plans[name]
        if plan is None or not in_optimal_space(plan, model):
            continue
        launched = max(launches(plan.instances), launches(plans["optimal"].instances))
        assert best <= plan.predicted.mean_cost_usd + launched * rounding + 1e-9, name
    assert plans["naive-elastic"] is None or in_optimal_space(plans["naive-elastic"], model)


@pytest.mark.parametrize("path,deadline_s", [(CIFAR, 1200.0), (SHA64, 1200.0), (SHA512, 5400.0)],
                         ids=["resnet101", "sha64", "sha512"])
def test_optimal_beats_every_baseline_on_the_examples(path, deadline_s):
    exp = load_experiment(path)
    plan = compile_plan(exp.spec, exp.model, exp.cloud, deadline_s, samples=100, compare=True)
    costs = {c["policy"]: c["cost_usd_mean"] for c in plan.considered if "infeasible" not in c}
    assert set(costs) == set(POLICIES)
    assert all(costs["optimal"] <= c + 1e-9 for c in costs.values()), costs


@pytest.mark.parametrize("job", JOBS[:4], ids=lambda j: j.name)
def test_confidence_plans_meet_the_deadline_with_that_probability(job):
    seed = 2
    model, cloud = setup(job, DEFAULT, seed)
    fastest = fastest_plan(StageTable(job.spec, model, cloud, samples=SAMPLES, seed=seed))
    for slack in (1.1, 1.5):
        deadline = fastest.jct_s * slack
        plans = plans_by_policy(job.spec, model, cloud, deadline, seed, confidence=0.9)
        if slack == 1.5:
            assert plans["optimal"] is not None
        for name, plan in plans.items():
            if plan is not None:
                assert plan.confidence == 0.9
                assert plan.predicted.p_meet(deadline) >= 0.9, name
        mean_plan = compile_plan(job.spec, model, cloud, deadline, samples=SAMPLES, seed=seed)
        if plans["optimal"] is not None:
            # Asking for more certainty never makes the plan cheaper (up to billing rounding).
            rounding = launches(plans["optimal"].instances) * cloud.billing.minimum_s * cloud.usd_per_second
            assert plans["optimal"].predicted.mean_cost_usd >= mean_plan.predicted.mean_cost_usd - rounding - 1e-9


def test_confidence_on_the_paper_job():
    exp = load_experiment(SHA512)
    plan = compile_plan(exp.spec, exp.model, exp.cloud, 5400.0, samples=100, confidence=0.9)
    assert plan.predicted.p_meet(5400.0) >= 0.9


# --- plans that hold instances or queue on whole instances --------------------------------------

ONE_GPU = model_profile({1: 100.0}, name="one-gpu")
LINEAR = model_profile({1: 100.0, 2: 50.0}, name="linear")
# Deterministic: no SCALE, a constant INIT (``init_s=``), 2 GPUs at $6 an hour unless told.
_const_cloud = partial(cloud_profile, instance_type="t", gpus_per_instance=2, price_usd_per_hour=6.0, provision_s=0.0,
                       **DEFAULT)


def test_optimal_not_costlier_than_static_when_static_queues_on_a_non_divisor():
    """Regression: 3 trials of 100 s on G=2, 60 s init. Static: 1 instance, 2 GPUs, JCT 260 s,
    $0.433; with only divisors (1 or 3 GPUs) optimal paid $0.533 for 2 instances."""
    spec = ExperimentSpec.from_stages([(3, 1)])
    cloud = _const_cloud(init_s=60.0)
    static = compile_plan(spec, ONE_GPU, cloud, 300.0, policy="static", samples=10)
    optimal = compile_plan(spec, ONE_GPU, cloud, 300.0, policy="optimal", samples=10)
    assert static.allocation == (2,) and static.predicted.mean_cost_usd == pytest.approx(260 / 600)
    assert optimal.predicted.mean_cost_usd <= static.predicted.mean_cost_usd + 1e-9


HB = ExperimentSpec.chain([ExperimentSpec.from_stages([(1, 1)]), ExperimentSpec.from_stages([(8, 1)])])


def test_optimal_not_costlier_than_static_across_hyperband_brackets():
    """Regression: a static cluster keeps its instances across the bracket boundary and skips a
    200 s re-initialisation ($1.67); holding only the fewest, optimal paid $2.50."""
    cloud = _const_cloud(init_s=200.0)
    static = compile_plan(HB, ONE_GPU, cloud, 650.0, policy="static", samples=10)
    optimal = compile_plan(HB, ONE_GPU, cloud, 650.0, policy="optimal", samples=10)
    assert static.instances == (2, 2) and static.predicted.mean_cost_usd == pytest.approx(1000 / 600)
    assert optimal.predicted.mean_cost_usd <= static.predicted.mean_cost_usd + 1e-9


def test_shortest_achievable_jct_counts_plans_that_hold_instances():
    """Regression: the error said 600 s was the shortest JCT while (1, 8) on 4 held instances takes 400 s."""
    cloud = _const_cloud(init_s=200.0)
    static = compile_plan(HB, ONE_GPU, cloud, 450.0, policy="static", samples=10)
    assert static.predicted.mean_jct_s == pytest.approx(400.0)
    optimal = compile_plan(HB, ONE_GPU, cloud, 450.0, policy="optimal", samples=10)
    assert optimal.predicted.mean_jct_s <= 450.0
    with pytest.raises(InfeasibleDeadlineError) as info:
        compile_plan(HB, ONE_GPU, cloud, 399.0, samples=10)
    assert info.value.min_jct_s == pytest.approx(400.0)


def test_greedy_not_costlier_than_static_with_hourly_billing():
    """Regression: greedy kept the static plan cheapest by *surrogate* cost. 2 trials, 100 s on
    1 GPU or 40 s on 2, G=1, deadline 150 s: the surrogate prefers 4 instances x 40 s over 2 x
    100 s, but billed by the hour 2 instance-hours ($7.20) beat 4 ($14.40)."""
    model = model_profile({1: 100.0, 2: 40.0}, name="m")
    cloud = _const_cloud(init_s=0.0, gpus_per_instance=1, price_usd_per_hour=3.6, granularity_s=3600, minimum_s=3600)
    spec = ExperimentSpec.from_stages([(2, 1)])
    static = compile_plan(spec, model, cloud, 150.0, policy="static", samples=5)
    greedy = compile_plan(spec, model, cloud, 150.0, policy="greedy", samples=5)
    optimal = compile_plan(spec, model, cloud, 150.0, policy="optimal", samples=5)
    assert static.allocation == (2,) and static.predicted.mean_cost_usd == pytest.approx(7.2)
    assert greedy.predicted.mean_cost_usd <= static.predicted.mean_cost_usd + 1e-9
    assert optimal.predicted.mean_cost_usd <= static.predicted.mean_cost_usd + 1e-9


def test_optimal_not_costlier_than_greedy_when_the_next_stage_needs_the_instances():
    # 12 trials then 4 then 1, 100 s per iteration on 1 GPU, 50 s on 2, G=2, 200 s init.
    # 6 GPUs (3 instances) and 8 GPUs (4) both run 12 trials in two rounds, but after 6 the
    # 4-trial stage must launch a 4th instance and wait 200 s for it.
    spec = ExperimentSpec.from_stages([(12, 1), (4, 1), (1, 10)])
    cloud = _const_cloud(init_s=200.0, price_usd_per_hour=3.6)
    held = simulate(spec, (8, 8, 2), LINEAR, cloud, samples=3)
    assert held.instances == (4, 4, 1) and held.mean_jct_s == pytest.approx(950.0)
    assert held.mean_cost_usd == pytest.approx(2.3)
    greedy = compile_plan(spec, LINEAR, cloud, 960.0, policy="greedy", samples=3)
    optimal = compile_plan(spec, LINEAR, cloud, 960.0, policy="optimal", samples=3)
    assert greedy.predicted.mean_cost_usd == pytest.approx(2.3)
    assert optimal.predicted.mean_cost_usd <= greedy.predicted.mean_cost_usd + 1e-9


def test_optimal_considers_holding_some_instances_across_a_bracket_boundary():
    # Bracket 1: 8 trials then 1; bracket 2: 8 new trials. G=1, 200 s init. Releasing down to
    # 8 (not 1) after the first stage keeps what bracket 2 needs without holding 16 throughout.
    spec = ExperimentSpec.chain([ExperimentSpec.from_stages([(8, 1), (1, 1)]), ExperimentSpec.from_stages([(8, 1)])])
    cloud = _const_cloud(init_s=200.0, gpus_per_instance=1, price_usd_per_hour=3.6)
    held = simulate(spec, (16, 2, 8), LINEAR, cloud, samples=3, instances=(16, 8, 8))
    assert held.mean_jct_s == pytest.approx(400.0) and held.mean_cost_usd == pytest.approx(5.2)
    optimal = compile_plan(spec, LINEAR, cloud, 420.0, policy="optimal", samples=3)
    assert optimal.predicted.mean_cost_usd <= held.mean_cost_usd + 1e-9
    assert (optimal.allocation, optimal.instances) == ((16, 2, 8), (16, 8, 8))   # not the static $5.60 plan
    assert optimal.predicted.mean_jct_s <= 420.0
    from rubberband.cli.plan_cmd import plan_table

    rows = plan_table(optimal).splitlines()[3:]
    assert "8 (6 held idle)" in rows[1] and "held" not in rows[0] + rows[2]   # `rubberband plan` says so


# --- paper trends (Figures 11 and 12) ------------------------------------------------------------

def test_elastic_gain_shrinks_as_init_latency_grows():
    """Fig. 12: at the tightest deadline (90 min) the gain of elastic over static falls from 1 s to 100 s."""
    exp = load_experiment(SHA512)
    lo, hi = whatif(exp.spec, exp.model, exp.cloud, 90 * 60, {"init_latency_s": [1.0, 100.0]},
                    ["static", "optimal"], samples=50)
    assert saving(lo) > saving(hi) > 1.0
    assert hi.costs["optimal"] > lo.costs["optimal"]


@pytest.mark.parametrize("billing", ["per_instance", "per_function"])
def test_elastic_gain_grows_with_the_number_of_trials(billing):
    """Fig. 11: SHA(k, 4, 508, 2), 20-minute deadline: elastic saves more as k grows."""
    exp = load_experiment(SHA64)
    scenarios = whatif(exp.spec, exp.model, exp.cloud, 1200.0, {"num_trials": [32, 64, 128], "billing": [billing]},
                       ["static", "optimal"], samples=100, spec_for_trials=exp.spec_with_trials)
    diffs = [s.costs["static"] - s.costs["optimal"] for s in scenarios]
    assert all(d > 0 for d in diffs)
    assert diffs[0] < diffs[1] < diffs[2]       # the dollar saving grows at every step
    if billing == "per_instance":
        assert saving(scenarios[0]) < saving(scenarios[-1])     # and so does the ratio, first vs last


def test_issue_target_fig12_optimal_at_least_twice_cheaper_than_static():
    exp = load_experiment(SHA512)
    assert exp.deadline_s == 5400.0 and exp.cloud.init_latency_s == Constant(1.0)
    table = StageTable(exp.spec, exp.model, exp.cloud, samples=100, seed=exp.seed)
    optimal = plan_on_table(table, exp.deadline_s, "optimal")
    static = plan_on_table(table, exp.deadline_s, "static")
    assert static.predicted.mean_cost_usd >= 2.0 * optimal.predicted.mean_cost_usd
    assert optimal.predicted.mean_jct_s <= exp.deadline_s


# --- Plan JSON, argument errors, catalogs --------------------------------------------------------

def test_plan_json_round_trip():
    exp = load_experiment(CIFAR)
    plan = compile_plan(exp.spec, exp.model, exp.cloud, 1200.0, samples=100, compare=True, confidence=0.8)
    back = Plan.from_json(plan.to_json())
    assert back.allocation == plan.allocation and back.instances == plan.instances
    assert back.gpus_per_trial == plan.gpus_per_trial
    assert back.spec.stages == plan.spec.stages and back.spec.bracket_starts == plan.spec.bracket_starts
    assert back.cloud == plan.cloud
    assert (back.policy, back.deadline_s, back.confidence, back.samples, back.seed) == \
        (plan.policy, plan.deadline_s, plan.confidence, plan.samples, plan.seed)
    for key, value in plan.predicted.summary().items():
        assert back.predicted.summary()[key] == pytest.approx(value, rel=1e-5, abs=1e-4), key
    assert back.predicted.p_meet(1200.0) == plan.predicted.p_meet(1200.0)
    assert back.predicted.stages == plan.predicted.stages
    assert [c["policy"] for c in back.considered] == [c["policy"] for c in plan.considered]
    assert json.loads(back.to_json())["allocation"] == list(plan.allocation)


def test_plan_json_round_trip_keeps_the_whole_spec():
    exp = load_experiment(CIFAR)
    plan = compile_plan(exp.spec, exp.model, exp.cloud, 1200.0, samples=50)
    assert Plan.from_json(plan.to_json()).spec == plan.spec


def test_plan_json_round_trip_of_a_hyperband_job():
    spec = JOBS[5].spec
    model, cloud = setup(JOBS[5], DEFAULT, 0)
    plan = compile_plan(spec, model, cloud, 1e6, samples=SAMPLES)
    back = Plan.from_json(plan.to_json())
    assert back.spec.stages == spec.stages and back.spec.bracket_starts == (0, 2)
    assert back.cloud == cloud and back.allocation == plan.allocation


def test_unknown_policy_is_a_spec_error_with_did_you_mean():
    exp = load_experiment(CIFAR)
    with pytest.raises(SpecError, match=r"unknown policy 'gredy'.*did you mean `greedy`"):
        compile_plan(exp.spec, exp.model, exp.cloud, 1200.0, policy="gredy")


@pytest.mark.parametrize("deadline", [0, -5.0, float("nan"), float("inf"), True, "20m"])
def test_bad_deadline_is_a_spec_error(deadline):
    exp = load_experiment(CIFAR)
    with pytest.raises(SpecError, match="deadline_s"):
        compile_plan(exp.spec, exp.model, exp.cloud, deadline)


@pytest.mark.parametrize("confidence", [0, 1, 1.5, -0.1])
def test_bad_confidence_is_a_spec_error(confidence):
    exp = load_experiment(CIFAR)
    with pytest.raises(SpecError, match="confidence"):
        compile_plan(exp.spec, exp.model, exp.cloud, 1200.0, confidence=confidence)


def test_auto_instance_type_picks_the_cheapest_v100_type():
    exp = load_experiment(CIFAR)
    catalog = exp.catalog.with_overrides(exp.cloud_overrides)
    assert isinstance(catalog, CloudCatalog)
    plan = compile_plan(exp.spec, exp.model, catalog, 1200.0, instance_type="auto", samples=200)
    wanted = {name for name, e in catalog.types.items() if e.get("gpu_model") == "V100"}
    assert wanted == {"p3.2xlarge", "p3.8xlarge", "p3.16xlarge", "p3dn.24xlarge"}
    assert {c["instance_type"] for c in plan.considered} == wanted
    feasible = [c for c in plan.considered if "infeasible" not in c]
    assert plan.predicted.mean_cost_usd == pytest.approx(min(c["cost_usd_mean"] for c in feasible))
    assert plan.instance_type == min(feasible, key=lambda c: c["cost_usd_mean"])["instance_type"]
    for c in feasible:   # each per-type plan is what planning on that type alone gives
        alone = compile_plan(exp.spec, exp.model, exp.cloud_for(c["instance_type"]), 1200.0, samples=200)
        assert alone.predicted.mean_cost_usd == pytest.approx(c["cost_usd_mean"])
        assert list(alone.allocation) == c["allocation"]


def test_catalog_needs_an_instance_type():
    exp = load_experiment(CIFAR)
    with pytest.raises(SpecError, match="instance_type"):
        compile_plan(exp.spec, exp.model, exp.catalog, 1200.0)


def test_compare_lists_every_policy_and_marks_none_cheaper():
    exp = load_experiment(CIFAR)
    plan = compile_plan(exp.spec, exp.model, exp.cloud, 1200.0, samples=200, compare=True)
    assert [c["policy"] for c in plan.considered][0] == "optimal"
    assert sorted(c["policy"] for c in plan.considered) == sorted(POLICIES)
    for c in plan.considered:
        assert c["cost_usd_mean"] >= plan.predicted.mean_cost_usd - 1e-9
        assert c["jct_s_mean"] <= 1200.0 * (1 + 1e-9)


def test_compile_plan_does_not_modify_its_inputs_and_is_deterministic():
    exp = load_experiment(CIFAR)
    before = (exp.spec, exp.model.to_dict(), exp.cloud.to_dict())
    a = compile_plan(exp.spec, exp.model, exp.cloud, 1200.0, samples=100, seed=5)
    b = compile_plan(exp.spec, exp.model, exp.cloud, 1200.0, samples=100, seed=5)
    assert (exp.spec, exp.model.to_dict(), exp.cloud.to_dict()) == before
    assert a.allocation == b.allocation and a.predicted.mean_cost_usd == b.predicted.mean_cost_usd
    again = simulate(exp.spec, a.allocation, exp.model, exp.cloud, samples=100, seed=5, instances=a.instances)
    assert again.mean_cost_usd == a.predicted.mean_cost_usd and again.mean_jct_s == a.predicted.mean_jct_s


# --- what-if --------------------------------------------------------------------------------------

WHATIF_SAMPLES = 50


def assert_matches(scenario, spec, model, cloud, deadline_s):
    for name in POLICIES:
        try:
            plan = compile_plan(spec, model, cloud, deadline_s, policy=name, samples=WHATIF_SAMPLES)
        except InfeasibleDeadlineError:
            assert scenario.costs[name] is None and scenario.allocations[name] is None, name
            continue
        assert scenario.costs[name] == pytest.approx(plan.predicted.mean_cost_usd, rel=1e-12), (scenario.values, name)
        assert scenario.jcts[name] == pytest.approx(plan.predicted.mean_jct_s, rel=1e-12)
        assert scenario.allocations[name] == plan.allocation


def test_whatif_deadlines_share_one_table_and_match_compile_plan():
    exp = load_experiment(CIFAR)
    values = [300.0, 1080.0, 1200.0, 1440.0]
    scenarios = whatif(exp.spec, exp.model, exp.cloud, 1200.0, {"deadline_s": values}, samples=WHATIF_SAMPLES)
    assert [s.values["deadline_s"] for s in scenarios] == values
    assert all(c is None for c in scenarios[0].costs.values())      # 5 min is infeasible (the fastest plan takes 7.5 min)
    for s, d in zip(scenarios, values):
        assert_matches(s, exp.spec, exp.model, exp.cloud, d)
    optimal = [s.costs["optimal"] for s in scenarios[1:]]
    assert optimal == sorted(optimal, reverse=True)                  # more time never costs more
    assert json.dumps([s.to_dict() for s in scenarios])


def test_whatif_num_trials_uses_the_experiment_sha():
    exp = load_experiment(CIFAR)
    scenarios = whatif(exp.spec, exp.model, exp.cloud, 1200.0, {"num_trials": [16, 32]}, samples=WHATIF_SAMPLES,
                       spec_for_trials=exp.spec_with_trials)
    for s in scenarios:
        assert_matches(s, exp.spec_with_trials(s.values["num_trials"]), exp.model, exp.cloud, 1200.0)
    assert scenarios[0].costs["optimal"] < scenarios[1].costs["optimal"]


def test_whatif_init_latency_and_billing():
    exp = load_experiment(CIFAR)
    scenarios = whatif(exp.spec, exp.model, exp.cloud, 1200.0,
                       {"init_latency_s": [1.0, 100.0], "billing": ["per_instance", "per_function"]},
                       samples=WHATIF_SAMPLES)
    assert [(s.values["init_latency_s"], s.values["billing"]) for s in scenarios] == [
        (1.0, "per_instance"), (1.0, "per_function"), (100.0, "per_instance"), (100.0, "per_function")]
    for s in scenarios:
        b = exp.cloud.billing
        cloud = exp.cloud.replace(init_latency_s=Constant(s.values["init_latency_s"]),
                                  billing=Billing(BillingModel(s.values["billing"]), b.granularity_s, b.minimum_s))
        assert_matches(s, exp.spec, exp.model, cloud, 1200.0)


def test_whatif_data_price_and_instance_type():
    exp = load_experiment(CIFAR)
    scenarios = whatif(exp.spec, exp.model, exp.cloud, 1200.0,
                       {"instance_type": ["p3.8xlarge", "p3.16xlarge"], "data_price_usd_per_gb": [0.0, 0.16]},
                       policies=["static", "optimal"], samples=WHATIF_SAMPLES, cloud_for_type=exp.cloud_for)
    for s in scenarios:
        base = exp.cloud_for(s.values["instance_type"])
        cloud = base.replace(data=DataCost(base.data.dataset_gb, s.values["data_price_usd_per_gb"]))
        for name in ("static", "optimal"):
            plan = compile_plan(exp.spec, exp.model, cloud, 1200.0, policy=name, samples=WHATIF_SAMPLES)
            assert s.costs[name] == pytest.approx(plan.predicted.mean_cost_usd, rel=1e-12)
    assert set(scenarios[0].costs) == {"static", "optimal"}
    free, paid = scenarios[0].costs["optimal"], scenarios[1].costs["optimal"]
    assert paid > free       # 0.15 GB at $0.16/GB on every launch


@pytest.mark.parametrize("axis,match", [("deadline", "did you mean `deadline_s`"), ("colour", "choose from")])
def test_whatif_unknown_axis(axis, match):
    exp = load_experiment(CIFAR)
    with pytest.raises(SpecError, match=match):
        whatif(exp.spec, exp.model, exp.cloud, 1200.0, {axis: [1]})


def test_whatif_unknown_policy_and_missing_helpers():
    exp = load_experiment(CIFAR)
    with pytest.raises(SpecError, match="did you mean `optimal`"):
        whatif(exp.spec, exp.model, exp.cloud, 1200.0, {"deadline_s": [1200]}, policies=["optimmal"])
    with pytest.raises(SpecError, match="num_trials"):
        whatif(exp.spec, exp.model, exp.cloud, 1200.0, {"num_trials": [16]})
    with pytest.raises(SpecError, match="instance_type"):
        whatif(exp.spec, exp.model, exp.cloud, 1200.0, {"instance_type": ["p3.2xlarge"]})


def test_saving_is_static_over_optimal():
    exp = load_experiment(CIFAR)
    (s,) = whatif(exp.spec, exp.model, exp.cloud, 1200.0, {"deadline_s": [1200.0]}, samples=WHATIF_SAMPLES)
    assert saving(s) == pytest.approx(s.costs["static"] / s.costs["optimal"])
    (none,) = whatif(exp.spec, exp.model, exp.cloud, 1200.0, {"deadline_s": [60.0]}, samples=WHATIF_SAMPLES)
    assert saving(none) is None
