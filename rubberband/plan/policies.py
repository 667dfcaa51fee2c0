"""Planning policies: static, naive-elastic, greedy (paper Algorithm 2) and optimal.

Every policy scores plans with one ``StageTable`` (common random numbers, per-stage means)
and returns candidate plans; ``compile.choose`` then simulates the cheapest candidates in full
and keeps the cheapest one that meets the constraint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rubberband.errors import SpecError
from rubberband.plan.search import (
    SIMULATING,
    PathPlan,
    PlanProgress,
    Progress,
    StageGraph,
    costly_survivors,
    pareto_front,
)
from rubberband.plan.table import StageTable
from rubberband.schema import did_you_mean
from rubberband.simulator.result import SimResult

MAX_FULL_SIMULATIONS = 200


@dataclass(frozen=True)
class Candidate:
    """A plan as the table scores it: mean JCT and surrogate mean cost."""

    allocation: tuple[int, ...]
    instances: tuple[int, ...]
    jct_s: float
    cost_usd: float
    note: str = ""


# A policy maps a table, a deadline, the confidence asked for, a cost cap (plans at or above
# it are not needed) and a progress callback to its candidate plans.
PolicyFn = Callable[..., list[Candidate]]
POLICIES: dict[str, PolicyFn] = {}


def policy(name: str) -> Callable[[PolicyFn], PolicyFn]:
    """Register a planning policy under ``name``."""

    def wrap(fn: PolicyFn) -> PolicyFn:
        POLICIES[name] = fn
        return fn

    return wrap


def get_policy(name: str) -> PolicyFn:
    """Look a policy up by name; unknown names list the valid ones."""
    if name not in POLICIES:
        raise SpecError(f"policy: unknown policy {name!r}{did_you_mean(name, POLICIES)}; choose one of {', '.join(POLICIES)}")
    return POLICIES[name]


def _candidate(table: StageTable, allocation: Sequence[int], instances: Sequence[int] | None = None,
               note: str = "") -> Candidate:
    allocation = tuple(int(a) for a in allocation)
    if instances is None:
        instances = tuple(table.need(i, a) for i, a in enumerate(allocation))
    jct, cost = table.evaluate(allocation, instances)
    return Candidate(allocation, tuple(int(h) for h in instances), jct, cost, note)


def choose(table: StageTable, candidates: Sequence[Candidate], deadline_s: float,
           confidence: float | None, max_simulations: int = MAX_FULL_SIMULATIONS,
           progress: Progress | None = None, report: bool = False) -> Any:
    """Simulate candidates in full, cheapest surrogate first, and keep the cheapest that meets
    the constraint.

    The surrogate cost is a lower bound on the billed cost (rounding only adds), so once the
    next candidate's surrogate is at least the best billed cost found, no later one can win:
    the search stops there, exact, after a handful of simulations under per-second billing
    and more under coarse billing (at most ``MAX_FULL_SIMULATIONS`` new ones; candidates the
    table simulated already, e.g. the optimal policy's incumbent, count as found from the
    start). With ``confidence=None`` the constraint is mean JCT <= deadline (exact from the
    table, since mean JCT adds up over stages); otherwise P(JCT <= deadline) >= confidence.
    A candidate whose per-sample JCT floor (``plan_floor``) already misses the constraint is
    passed over without a simulation: its full simulation could only read later. So is one
    whose billed-cost floor (``StageTable.cost_floor``: the surrogate plus the billing minimum's
    top-up of each instance's mean life) is at least the best billed cost found: its simulation
    could not replace the best (that takes a billed cost below it), so the choice is the same,
    with far fewer simulations where short-lived instances make the minimum count (issue 22).
    ``progress`` hears of each simulation as it starts (``PlanProgress``, phase ``simulating``).

    Returns ``(candidate, its SimResult)`` or ``None``; with ``report``, ``(that, simulations
    run)`` (``(None, None)`` for none), so a caller can tell whether the simulations ran out.
    """
    eps = 1e-9 * deadline_s
    pool = sorted(candidates, key=lambda c: (c.cost_usd, c.jct_s))
    if confidence is None:
        pool = [c for c in pool if c.jct_s <= deadline_s + eps]

    def meets(result: SimResult) -> bool:
        return result.mean_jct_s <= deadline_s + eps if confidence is None else result.p_meet(deadline_s) >= confidence

    best = None
    for cand in pool:
        result = table.simulated(cand.allocation, cand.instances)
        if result is not None and meets(result) and (best is None or result.mean_cost_usd < best[1].mean_cost_usd - 1e-12):
            best = (cand, result)
    sims = 0
    cost_floors = getattr(table, "cost_floors", None)      # a VariantTable has none: the surrogate alone
    floors = None
    for left, cand in enumerate(pool):
        if sims >= max_simulations or (best is not None and cand.cost_usd >= best[1].mean_cost_usd - 1e-12):
            break
        if table.simulated(cand.allocation, cand.instances) is not None:
            continue
        if best is not None and cost_floors is not None:
            if floors is None:       # every candidate's at once, the first time one may be passed over
                floors = cost_floors(np.array([c.allocation for c in pool], dtype=np.int64),
                                     np.array([c.instances for c in pool], dtype=np.int64))
            # Less a hair for the other order of the sums (the simulator adds per sample).
            if floors[left] - 1e-9 * abs(floors[left]) >= best[1].mean_cost_usd - 1e-12:
                continue
        if cannot_meet(table, cand, deadline_s, confidence):
            continue
        if progress is not None:
            progress(PlanProgress(sims + 1, min(len(pool) - left, max_simulations - sims) + sims, 0, phase=SIMULATING))
        result = table.simulate(cand.allocation, cand.instances)
        sims += 1
        if meets(result) and (best is None or result.mean_cost_usd < best[1].mean_cost_usd - 1e-12):
            best = (cand, result)
    if report:
        return (best if best is not None else (None, None)), sims
    return best


def plan_floor(table: StageTable, allocation: Sequence[int], held: Sequence[int]) -> np.ndarray:
    """Per sample, a lower bound on the JCT a full simulation of the plan gives.

    Stage by stage the simulator (``simulator/engine.py``) starts the TRAIN nodes only once
    the stage's new instances are up — SCALE plus the slowest of their INITs, the same draws
    as ``StageDraws.init_max`` (``init_each``'s rows), after any wait for spot capacity — and
    ends the stage at its last TRAIN plus the SYNC. Its TRAIN nodes run on at most
    ``shape.running`` slots, each at least as long as its drawn duration (a reclaim only adds
    lost work and a restart), so the makespan is at least the slowest trial and the work per
    slot (``StageTable._train_bounds``, per sample). Adding those up per sample bounds the JCT
    in every sample, so its mean and every order statistic are bounded too: a plan whose
    floor misses the deadline (in the mean, or at the confidence) cannot meet it.
    """
    total = np.zeros(table.samples)
    for sub, i, a, new in stage_launches(table, allocation, held):
        shape = sub.shape(i, a)
        longest, work = sub._stats(i, shape)
        d = sub.draws[i]
        total = total + np.maximum(longest, work / shape.running) + d.sync(sub.models[i])
        if new > 0:
            total = total + d.scale(sub.cloud) + d.init_max(sub.cloud, new)
    return total


def stage_launches(table: StageTable, allocation: Sequence[int], held: Sequence[int]) -> list[tuple[Any, ...]]:
    """Per stage of a plan: ``(StageTable, stage, allocation, new instances)`` — what the stage
    launches beyond what it keeps of the stage before (``StageTable.stage``'s ``Δ``), or of the
    instances held at the start. A ``VariantTable`` decodes its keys (``VariantTable.launches``)."""
    own = getattr(table, "launches", None)
    if own is not None:
        launches: list[tuple[Any, ...]] = own(allocation, held)
        return launches
    out, previous = [], table.start_state
    for i, (a, h) in enumerate(zip(allocation, held)):
        out.append((table, i, int(a), max(0, int(h) - int(table.previous_held(i, previous)))))
        previous = h
    return out


def constraint_value(jct_s: np.ndarray, confidence: float | None) -> float:
    """What the constraint reads of per-sample JCTs: their mean, or with ``confidence`` the
    quantile that must be within the deadline (the ``ceil(p * n)``-th smallest)."""
    if confidence is None:
        return float(np.mean(jct_s))
    jct = np.sort(jct_s)
    return float(jct[max(0, math.ceil(confidence * len(jct) - 1e-9) - 1)])


def cannot_meet(table: StageTable, cand: Candidate, deadline_s: float, confidence: float | None) -> bool:
    """Whether the plan's ``plan_floor`` already misses the constraint ``choose`` checks (mean JCT
    within the deadline, or P(JCT <= deadline) >= confidence), so no simulation can meet it."""
    floor = plan_floor(table, cand.allocation, cand.instances)
    eps = 1e-9 * deadline_s      # the floor adds up the stages in another order than the simulator
    if confidence is None:
        return float(floor.mean()) > deadline_s + 2 * eps
    return float(np.mean(floor <= deadline_s + 2 * eps)) < confidence


# --- static ---------------------------------------------------------------------------------
def static_allocations(table: StageTable, ks: np.ndarray) -> np.ndarray:
    """``static_allocation`` for many cluster sizes at once: one row per ``k`` in ``ks``, 0
    in every column of a row whose cluster cannot run some stage.

    A stage needs no more instances as a trial gets fewer GPUs (``need`` is non-decreasing in
    ``m``), so lowering ``m`` until ``k`` instances hold the trials lands on the largest ``m``
    whose need is at most ``k``: a binary search, for every ``k`` together.
    """
    ks = np.asarray(ks, dtype=np.int64)
    G = table.cloud.gpus_per_instance
    out = np.zeros((len(ks), table.num_stages), dtype=np.int64)
    ok = np.ones(len(ks), dtype=bool)
    gpus = ks * G
    for i, stage in enumerate(table.spec.stages):
        lo, hi = table.models[i].min_gpus, table.models[i].max_gpus     # a target stage: its own profile's
        n = stage.num_trials
        need = np.array([table.need(i, n * m) for m in range(lo, hi + 1)])
        m = np.minimum(np.minimum(gpus // n, hi), lo + np.searchsorted(need, ks, side="right") - 1)
        queue = gpus < n
        ok &= np.where(queue, lo == 1, m >= lo)
        out[:, i] = np.where(queue, gpus, n * m)
    out[~ok] = 0
    return out


def static_allocation(table: StageTable, k: int) -> tuple[int, ...] | None:
    """Each stage shares all ``k`` instances' GPUs fairly (paper §3.2).

    A stage with ``n`` trials on ``K = k * G`` GPUs queues its trials on the ``K`` GPUs when
    ``K < n``; otherwise each trial gets ``m = floor(K / n)`` GPUs, capped at the profile and
    lowered until ``k`` instances hold the trials with each trial's workers together.
    ``None`` when some stage cannot run on ``k`` instances.
    """
    row = static_allocations(table, np.array([k]))[0]
    return tuple(int(a) for a in row) if row.all() else None


def static_candidates(table: StageTable, deadline_s: float = math.inf, cost_cap: float = math.inf) -> list[Candidate]:
    """Static clusters of every size ``k`` whose plan may meet ``deadline_s``, at a surrogate
    cost of at most ``cost_cap``.

    Of the sizes that give the same allocation vector only the smallest is kept: more
    instances doing the same work cost more (each is billed for the whole job) and start no
    sooner (stage 0 waits for the slowest of more INITs), in every sample.

    Under a cost cap and per-instance billing, sizes above ``cap / (p · Σ fast_s)`` are never
    laid out: each of the ``k`` instances is billed every stage's duration, at least its
    ``fast_s`` (no allocation of a stage is faster: a queue is slower than its trials all at
    once), at the least stage price ``p``, so their bounds below would rule them out anyway."""
    G = table.cloud.gpus_per_instance
    k_max = max(table.need(i, max(table.candidates(i))) for i in range(table.num_stages))
    instance_floor_usd = min(table.stage_usd_per_s) * sum(table.fast_s)
    if table.per_instance and math.isfinite(cost_cap) and instance_floor_usd > 0:
        k_max = min(k_max, int(cost_cap * (1 + 1e-6) / instance_floor_usd))
    ks = np.arange(1, k_max + 1)
    if not len(ks):
        return []
    allocs = static_allocations(table, ks)
    valid = np.flatnonzero(allocs.all(axis=1))
    _, first = np.unique(allocs[valid], axis=0, return_index=True)
    rows = valid[np.sort(first)]
    # Bounds first: a static cluster's queues are list scheduled only if it may meet both.
    # It holds k instances in every stage, each billed at least the stage's duration. Few
    # allocations recur over many sizes: bound each once, add up by stage (the same order).
    lower_t, lower_c = np.zeros(len(rows)), np.zeros(len(rows))
    for i in range(table.num_stages):
        distinct, where = np.unique(allocs[rows, i], return_inverse=True)
        t, c = np.array([table.stage_bounds(i, int(a)) for a in distinct]).reshape(-1, 2).T
        lower_t += t[where]
        lower_c += table.stage_usd_per_s[i] * ks[rows] * t[where] if table.per_instance else c[where]
    rows = rows[(lower_t <= deadline_s * (1 + 1e-9)) & (lower_c <= cost_cap * (1 + 1e-9))]
    if not len(rows):
        return []
    held = np.repeat(ks[rows][:, None], table.num_stages, axis=1)
    jct, cost = table.evaluate_many(allocs[rows], held)
    return [Candidate(tuple(int(a) for a in allocs[j]), (int(ks[j]),) * table.num_stages, float(t), float(c),
                      note=f"static {ks[j]}x{table.cloud.instance_type} ({ks[j] * G} GPUs)")
            for j, t, c in zip(rows, jct, cost) if c <= cost_cap * (1 + 1e-9)]


def statics(table: StageTable, deadline_s: float = math.inf, cost_cap: float = math.inf) -> list[Candidate]:
    """``static_candidates`` of a table, or of each unpacked variant of a ``VariantTable``."""
    own = getattr(table, "static_candidates", None)
    return own(deadline_s, cost_cap) if own is not None else static_candidates(table, deadline_s, cost_cap)


@policy("static")
def static_policy(table: StageTable, deadline_s: float, confidence: float | None = None,
                  cost_cap: float = math.inf, progress: Progress | None = None) -> list[Candidate]:
    """The cheapest fixed cluster of K instances that meets the deadline (paper §3.2 baseline)."""
    return static_candidates(table, deadline_s)


# --- naive elastic --------------------------------------------------------------------------
@policy("naive-elastic")
def naive_elastic_policy(table: StageTable, deadline_s: float, confidence: float | None = None,
                         cost_cap: float = math.inf, progress: Progress | None = None) -> list[Candidate]:
    """A fixed ``m`` GPUs per trial in every stage, cluster sized ``n_i * m`` (paper §6.3); a
    target stage (DESIGN §4.6) gets ``m`` within its own profile's range."""
    out = []
    for m in range(table.model.min_gpus, table.model.max_gpus + 1):
        alloc = tuple(s.num_trials * min(max(m, p.min_gpus), p.max_gpus)
                      for s, p in zip(table.spec.stages, table.models))
        cand = _candidate(table, alloc, note=f"{m} GPU(s) per trial")
        if all(table.holds(h) for h in cand.instances):
            out.append(cand)
    return out


# --- greedy (Algorithm 2) -------------------------------------------------------------------
def greedy_descent(table: StageTable, start: tuple[int, ...], deadline_s: float) -> Candidate:
    """Algorithm 2: from ``start``, repeatedly lower one stage to its next smaller valid
    allocation, choosing the largest cost saving per second of JCT added; stop when no
    feasible candidate saves money."""
    best = _candidate(table, start)
    while True:
        choice, choice_score = None, -math.inf
        for i, a in enumerate(best.allocation):
            smaller = next_smaller(table, i, a)
            if smaller is None:
                continue
            alloc = best.allocation[:i] + (smaller,) + best.allocation[i + 1:]
            cand = _candidate(table, alloc)
            saving = best.cost_usd - cand.cost_usd
            if saving <= 1e-12 or cand.jct_s > deadline_s:
                continue
            added = cand.jct_s - best.jct_s
            score = math.inf if added <= 0 else saving / added
            if score > choice_score or (score == choice_score and choice is not None and cand.cost_usd < choice.cost_usd):
                choice, choice_score = cand, score
        if choice is None:
            return best
        best = choice


def next_smaller(table: StageTable, stage: int, allocation: int) -> int | None:
    """The next smaller valid allocation of a stage (a factor or multiple of its trials).

    Under per-instance billing, allocations that still need as many instances save nothing
    (the instances are paid for either way) and would stall the descent on a plateau, so the
    step goes on to the largest smaller allocation that needs fewer instances.
    """
    smaller = [c for c in table.candidates(stage) if c < allocation]
    if not smaller:
        return None
    if table.per_instance:
        need = table.need(stage, allocation)
        fewer = [c for c in smaller if table.need(stage, c) < need]
        return max(fewer) if fewer else None
    return max(smaller)


@policy("greedy")
def greedy_policy(table: StageTable, deadline_s: float, confidence: float | None = None,
                  cost_cap: float = math.inf, progress: Progress | None = None) -> list[Candidate]:
    """The paper's Algorithm 2, warm-started from the best static plan and 2x, 3x its size.

    Guarantee (the paper's): never worse than the warm start; the best static plan itself is
    kept among the candidates, so greedy is never worse than ``static``.
    """
    chosen = choose(table, static_candidates(table, deadline_s), deadline_s, None)
    if chosen is None:
        return []
    best_static = chosen[0]
    k = best_static.instances[0]
    out = [best_static]
    for mult in (1, 2, 3):
        start = static_allocation(table, k * mult)
        if start is None:
            continue
        cand = _candidate(table, start)
        if cand.jct_s > deadline_s or not all(table.holds(h) for h in cand.instances):
            continue
        result = greedy_descent(table, start, deadline_s)
        out.append(Candidate(result.allocation, result.instances, result.jct_s, result.cost_usd,
                             note=f"greedy from static x{mult} ({k * mult} instances)"))
    return out


# --- optimal ----------------------------------------------------------------------------------
@policy("optimal")
def optimal_policy(table: StageTable, deadline_s: float, confidence: float | None = None,
                   cost_cap: float = math.inf, progress: Progress | None = None) -> list[Candidate]:
    """Exact search over every valid allocation vector and every useful instance count to
    hold (dynamic programming over stages, ``rubberband.plan.search``).

    Guarantee: returns the Pareto front of (mean JCT, surrogate mean cost) over *all* valid
    allocation vectors (``valid_allocations``: each stage's factors and multiples of its trial
    count and queueing on whole instances) combined with every held-instance vector in which
    each stage holds either the fewest instances its allocation needs or as many as some
    later stage's allocation needs (holding them across the SYNC instead of releasing and
    relaunching: static clusters, and keeping a HyperBand bracket's instances for the next
    bracket, are special cases), whose mean JCT meets ``deadline_s`` — up to the surrogate
    cost of an incumbent: a plan known, from its full simulation, to meet the constraint
    (mean JCT, or P(JCT <= deadline) >= ``confidence``) at a billed cost ``B``. No plan of
    surrogate cost above ``B`` can beat it (the surrogate is a lower bound on the billed cost),
    so cutting the front there changes nothing ``choose`` returns. ``cost_cap``: a billed cost
    already in hand elsewhere (e.g. another market's plan) cuts the search too. Mean JCT is
    exactly additive over stages, so feasibility is exact for the given samples and seed. The
    surrogate cost bills instance-seconds without rounding; the true cost adds at most
    ``max(granularity_s, minimum_s)`` of billing per instance launch, which ``choose``
    resolves by simulating the cheapest candidates in full.

    On a market whose stage means come from the spot kernel the surrogate is an estimate, not
    a bound (``StageTable``); the cut at ``B`` is then within that surrogate's tolerance.
    """
    # A first pass takes every costly allocation (a queue to list schedule, a stage that may be
    # reclaimed) at its lower bounds, for an incumbent; then only the costly allocations that
    # its cost and Lagrangian weight cannot rule out (``costly_survivors``) are simulated.
    if not all(table.candidates(i, deadline_s) for i in range(table.num_stages)):
        # Within ``max_instances`` a stage may have only queues too slow for the deadline.
        return statics(table, deadline_s, cost_cap)
    graph = StageGraph(table.optimistic(), deadline_s, progress=progress)
    if _cannot_beat(graph, deadline_s, cost_cap):
        return statics(table, deadline_s, cost_cap)
    incumbents = [_incumbent(table, graph, deadline_s, confidence, cost_cap, progress)]
    cap, lam = (math.inf, None) if incumbents[0] is None else incumbents[0][1:]
    weighed = incumbents[0]       # the incumbent whose weight ``lam`` is
    cap = min(cap, cost_cap)     # the Lagrangian bound holds for any weight and cap
    if lam is None and math.isfinite(cap):      # a cap from elsewhere: the hull's weight still bounds
        hull = graph.hull_plan(deadline_s)
        lam = hull[1] if hull is not None else None
    costly = costly_survivors(graph, deadline_s, cap, lam, progress)
    allocations = [[a for a in table.candidates(i, deadline_s) if table.simulated_cheaply(i, a)] + costly[i]
                   for i in range(table.num_stages)]
    if not all(allocations):      # a stage none of whose allocations can be in a plan within the cap
        return [_candidate(table, p.allocation, p.instances) for p, *_ in filter(None, incumbents)] \
            + statics(table, deadline_s, cap)
    graph = StageGraph(table, deadline_s, allocations, progress)
    incumbents.append(_incumbent(table, graph, deadline_s, confidence, cap, progress))
    if incumbents[1] is not None and incumbents[1][1] < cap:
        cap, lam = incumbents[1][1:]
        weighed = incumbents[1]
    # The incumbents are candidates too: where stage means come from the spot kernel, a
    # surrogate may exceed the billed cost and so fall outside the cut front. Static clusters
    # are in the search space already; they stay as named candidates so a plan that is one
    # says so.
    known = [(p.allocation, p.instances) for p, *_ in filter(None, incumbents)]
    trial = _trial_cap(weighed, deadline_s, cap)
    if trial is not None:
        # A first front cut well below the incumbent's cost (the front's cost is what the search
        # time grows with): when ``choose`` finds on it a plan billed below the cut, that plan is
        # the full search's too (``_trial_cap`` says why); else its best plan, if any, is a
        # tighter incumbent for the full search.
        cands = [_candidate(table, alloc, held)
                 for alloc, held in pareto_front(table, deadline_s, trial, graph=graph, lam=lam, progress=progress)
                 + known] + statics(table, deadline_s, trial)
        weigh = [c for c in cands if c.cost_usd < cost_cap] if math.isfinite(cost_cap) else cands   # as cheaper_plan
        (best, result), simulations = choose(table, weigh, deadline_s, confidence, progress=progress, report=True)
        if result is not None:
            if simulations < MAX_FULL_SIMULATIONS and result.mean_cost_usd < trial * (1 - _TRIAL_SLACK) - 1e-12:
                return cands
            if result.mean_cost_usd < cap:
                cap = result.mean_cost_usd
                known.append((best.allocation, best.instances))
    front = pareto_front(table, deadline_s, cap, graph=graph, lam=lam, progress=progress) + known
    return [_candidate(table, alloc, held) for alloc, held in front] + statics(table, deadline_s, cap)


# A trial cut is tried when the incumbent's cost is this share above the Lagrangian bound, and
# sits at this share of the way from the bound to the incumbent's cost.
_TRIAL_GAP, _TRIAL_AT = 0.03, 0.5
_TRIAL_SLACK = 1e-9      # relative: a plan within this of the trial cut does not settle the search


def _trial_cap(weighed: tuple[PathPlan, float, float] | None, deadline_s: float, cap: float) -> float | None:
    """Where to cut a first, cheaper front of the optimal search, or ``None`` for none.

    ``weighed`` is the incumbent (a plan of least ``C + λ·T``, its billed cost, ``λ``): every plan
    that meets the deadline has a surrogate cost of at least ``L = C + λ·(T − deadline)`` (weak
    duality), and the search keeps the front up to ``cap`` (the incumbent's billed cost). The
    trial cut ``c`` sits between them. Why a plan billed below ``c`` settles the search: the
    front cut at ``c`` is the full front's points of cost up to ``c`` (a point above ``c``
    dominates none below it, and the bounds keep every point below it), the static clusters
    likewise, so ``choose`` reads the same candidates in the same order up to ``c``; it stops
    at the first surrogate at least its best billed cost ``B < c``, before anything the cut
    dropped, with the same ``B`` — unless its simulations ran out first (then the full search
    runs, as before)."""
    if weighed is None or not math.isfinite(cap) or not math.isfinite(deadline_s):
        return None
    plan, _, lam = weighed
    bound = plan.cost_usd + lam * (plan.jct_s - deadline_s)
    if not cap - bound > _TRIAL_GAP * cap:
        return None
    return bound + _TRIAL_AT * (cap - bound)


def _cannot_beat(graph: StageGraph, deadline_s: float, cost_cap: float) -> bool:
    """Whether every plan of ``graph`` (laid out on ``StageTable.optimistic()``, so below every
    plan's surrogate) that meets ``deadline_s`` costs at least ``cost_cap``: by duality, each
    such plan costs at least ``min(C + λT) − λ·deadline_s`` for the hull's weight ``λ``. Then
    the search has nothing under the cap to find (a cap from another type or market: the
    type-per-stage search of ``market="auto"`` skips most market vectors so)."""
    if not (math.isfinite(cost_cap) and math.isfinite(deadline_s)):
        return False
    hull = graph.hull_plan(deadline_s)
    if hull is None:
        return False
    plan, lam = hull
    return plan.cost_usd + lam * (plan.jct_s - deadline_s) >= cost_cap + 1e-9 * max(1.0, cost_cap)


# Retargets of the incumbent when the hull plan meets the mean but not the confidence.
_INCUMBENT_TRIES = 4


def _incumbent(table: StageTable, graph: StageGraph, deadline_s: float, confidence: float | None,
               cost_cap: float = math.inf, progress: Progress | None = None) -> tuple[PathPlan, float, float] | None:
    """A plan that meets the constraint in full simulation, its billed cost, and the
    Lagrangian weight that found it: the cheapest plan of the lower convex hull of ``graph``'s
    front that meets the deadline, or, when its full simulation misses the constraint (the
    graph's values may be optimistic; a confidence asks for more than the mean), the one that
    meets a deadline tightened by the overshoot (a few tries; a plan whose ``plan_floor``
    misses already is not simulated, its overshoot read off the floor). ``None`` when none is found
    (the search then runs uncapped), or when the plan's surrogate cost is at least
    ``cost_cap`` (a cost in hand already: no use simulating it)."""
    target = deadline_s
    for attempt in range(_INCUMBENT_TRIES):
        hull = graph.hull_plan(target)
        if hull is None:
            return None
        plan, lam = hull
        if plan.cost_usd >= cost_cap:
            return None
        candidate = Candidate(plan.allocation, plan.instances, plan.jct_s, plan.cost_usd)
        if table.simulated(plan.allocation, plan.instances) is None and cannot_meet(table, candidate, deadline_s,
                                                                                      confidence):
            # It misses by its floor already: retarget by the floor (a little less than the
            # simulation would read) and spare the simulation.
            reached = constraint_value(plan_floor(table, plan.allocation, plan.instances), confidence)
        else:
            if progress is not None and table.simulated(plan.allocation, plan.instances) is None:
                progress(PlanProgress(attempt + 1, _INCUMBENT_TRIES, 0, phase=SIMULATING))
            result = table.simulate(plan.allocation, plan.instances)
            if confidence is None:
                if result.mean_jct_s <= deadline_s * (1 + 1e-9):
                    return plan, result.mean_cost_usd, lam
            elif result.p_meet(deadline_s) >= confidence:
                return plan, result.mean_cost_usd, lam
            reached = constraint_value(result.jct_s, confidence)
        target = min(target, plan.jct_s) - (reached - deadline_s) - 1e-6 * deadline_s
    return None
