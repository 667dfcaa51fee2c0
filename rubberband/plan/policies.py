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
from rubberband.plan.table import StageTable
from rubberband.schema import did_you_mean
from rubberband.simulator.engine import simulate

MAX_FULL_SIMULATIONS = 200


@dataclass(frozen=True)
class Candidate:
    """A plan as the table scores it: mean JCT and surrogate mean cost."""

    allocation: tuple[int, ...]
    instances: tuple[int, ...]
    jct_s: float
    cost_usd: float
    note: str = ""


PolicyFn = Callable[[StageTable, float], list[Candidate]]
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


def _candidate(table: StageTable, allocation, instances=None, note: str = "") -> Candidate:
    allocation = tuple(int(a) for a in allocation)
    if instances is None:
        instances = tuple(table.need(i, a) for i, a in enumerate(allocation))
    jct, cost = table.evaluate(allocation, instances)
    return Candidate(allocation, tuple(int(h) for h in instances), jct, cost, note)


def choose(table: StageTable, candidates: Sequence[Candidate], deadline_s: float,
           confidence: float | None, max_simulations: int = MAX_FULL_SIMULATIONS) -> tuple[Candidate, Any] | None:
    """Simulate candidates in full, cheapest surrogate first, and keep the cheapest that meets
    the constraint.

    The surrogate cost is a lower bound on the billed cost (rounding only adds), so once the
    next candidate's surrogate is at least the best billed cost found, no later one can win:
    the search stops there, exact, after a handful of simulations under per-second billing
    and more under coarse billing (at most ``MAX_FULL_SIMULATIONS``). With
    ``confidence=None`` the constraint is mean JCT <= deadline (exact from the table, since
    mean JCT adds up over stages); otherwise P(JCT <= deadline) >= confidence.
    """
    eps = 1e-9 * deadline_s
    pool = sorted(candidates, key=lambda c: (c.cost_usd, c.jct_s))
    if confidence is None:
        pool = [c for c in pool if c.jct_s <= deadline_s + eps]
    best = None
    for sims, cand in enumerate(pool):
        if sims >= max_simulations or (best is not None and cand.cost_usd >= best[1].mean_cost_usd - 1e-12):
            break
        result = simulate(table.spec, cand.allocation, table.model, table.cloud, samples=table.samples,
                          seed=table.seed, instances=cand.instances, draws=table.draws,
                          spot_instances=table.spot_instances(cand.instances))
        ok = result.mean_jct_s <= deadline_s + eps if confidence is None else result.p_meet(deadline_s) >= confidence
        if ok and (best is None or result.mean_cost_usd < best[1].mean_cost_usd - 1e-12):
            best = (cand, result)
    return best


# --- static ---------------------------------------------------------------------------------
def static_allocation(table: StageTable, k: int) -> tuple[int, ...] | None:
    """Each stage shares all ``k`` instances' GPUs fairly (paper §3.2).

    A stage with ``n`` trials on ``K = k * G`` GPUs queues its trials on the ``K`` GPUs when
    ``K < n``; otherwise each trial gets ``m = floor(K / n)`` GPUs, capped at the profile and
    lowered until ``k`` instances hold the trials with each trial's workers together.
    ``None`` when some stage cannot run on ``k`` instances.
    """
    gpus = k * table.cloud.gpus_per_instance
    lo, hi = table.model.min_gpus, table.model.max_gpus
    out = []
    for i, stage in enumerate(table.spec.stages):
        n = stage.num_trials
        if gpus < n:
            if lo > 1:
                return None
            out.append(gpus)
            continue
        m = min(gpus // n, hi)
        while m >= lo and table.need(i, n * m) > k:
            m -= 1
        if m < lo:
            return None
        out.append(n * m)
    return tuple(out)


def static_candidates(table: StageTable, deadline_s: float = math.inf) -> list[Candidate]:
    G = table.cloud.gpus_per_instance
    k_max = max(table.need(i, max(table.candidates(i))) for i in range(table.num_stages))
    out = []
    for k in range(1, k_max + 1):
        alloc = static_allocation(table, k)
        if alloc is None or table.queue_bound_s(alloc) > deadline_s:
            continue
        out.append(_candidate(table, alloc, (k,) * table.num_stages, note=f"static {k}x{table.cloud.instance_type} ({k * G} GPUs)"))
    return out


@policy("static")
def static_policy(table: StageTable, deadline_s: float) -> list[Candidate]:
    """The cheapest fixed cluster of K instances that meets the deadline (paper §3.2 baseline)."""
    return static_candidates(table, deadline_s)


# --- naive elastic --------------------------------------------------------------------------
@policy("naive-elastic")
def naive_elastic_policy(table: StageTable, deadline_s: float) -> list[Candidate]:
    """A fixed ``m`` GPUs per trial in every stage, cluster sized ``n_i * m`` (paper §6.3)."""
    out = []
    for m in range(table.model.min_gpus, table.model.max_gpus + 1):
        alloc = tuple(s.num_trials * m for s in table.spec.stages)
        out.append(_candidate(table, alloc, note=f"{m} GPU(s) per trial"))
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
def greedy_policy(table: StageTable, deadline_s: float) -> list[Candidate]:
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
        if cand.jct_s > deadline_s:
            continue
        result = greedy_descent(table, start, deadline_s)
        out.append(Candidate(result.allocation, result.instances, result.jct_s, result.cost_usd,
                             note=f"greedy from static x{mult} ({k * mult} instances)"))
    return out


# --- optimal ----------------------------------------------------------------------------------
@policy("optimal")
def optimal_policy(table: StageTable, deadline_s: float) -> list[Candidate]:
    """Exact search over every valid allocation vector and every useful instance count to
    hold (dynamic programming over stages).

    Guarantee: returns the Pareto front of (mean JCT, surrogate mean cost) over *all* valid
    allocation vectors (``valid_allocations``: each stage's factors and multiples of its trial
    count and queueing on whole instances) combined with every held-instance vector in which
    each stage holds either the fewest instances its allocation needs or as many as some
    later stage's allocation needs (holding them across the SYNC instead of releasing and
    relaunching: static clusters, and keeping a HyperBand bracket's instances for the next
    bracket, are special cases), whose mean JCT meets ``deadline_s``. Mean JCT is exactly
    additive over stages, so feasibility is exact for the given samples and seed. The
    surrogate cost bills instance-seconds without rounding; the true cost adds at most
    ``max(granularity_s, minimum_s)`` of billing per instance launch, which ``choose``
    resolves by simulating the cheapest candidates in full.

    The state between stages is the instance count held (it decides how many instances
    the next stage must launch and wait for); per state the DP keeps every non-dominated
    (time, cost) pair, pruned by lower bounds on the remaining stages' time and cost.
    """
    front = pareto_front(table, deadline_s)
    # Static clusters are in the search space already; they stay as named candidates so a
    # plan that is one says so.
    return [_candidate(table, alloc, held) for alloc, held in front] + static_candidates(table, deadline_s)


def pareto_front(table: StageTable, deadline_s: float = math.inf,
                 cost_cap: float = math.inf) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``(allocation, instances held)`` vectors on the (mean JCT, surrogate cost) Pareto front
    meeting ``deadline_s``, fastest first (see ``optimal_policy`` for the search space)."""
    t_suf, c_suf = table.suffix_bounds()
    eps = 1e-9 * max(1.0, deadline_s if math.isfinite(deadline_s) else 1.0)
    stages = range(table.num_stages)
    cands = [np.array(table.candidates(i, deadline_s), dtype=np.int64) for i in stages]
    needs = [np.array([table.need(i, a) for a in cands[i]], dtype=np.int64) for i in stages]
    # Per stage: the counts some later stage needs (worth holding through this one's SYNC).
    later: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * table.num_stages
    for i in range(table.num_stages - 2, -1, -1):
        later[i] = np.union1d(later[i + 1], needs[i + 1])
    # Points of the previous stage: time, cost, state (instances held).
    T = np.zeros(1)
    C = np.zeros(1)
    H = np.zeros(1, dtype=np.int64)
    history: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []   # per stage: parent, allocation, held
    for i in stages:
        # Options of this stage: (candidate index, instances held).
        opt_k = [np.arange(len(cands[i]))]
        opt_h = [needs[i]]
        for v in later[i]:
            more = np.flatnonzero(needs[i] < v)
            opt_k.append(more)
            opt_h.append(np.full(len(more), v, dtype=np.int64))
        ok, oh = np.concatenate(opt_k), np.concatenate(opt_h)
        prev_states, inverse = np.unique(H, return_inverse=True)
        dur, cost = table.stage_grid(i, cands[i][ok], oh, prev_states)
        Tn = (T[:, None] + dur[inverse]).ravel()
        Cn = (C[:, None] + cost[inverse]).ravel()
        parent = np.repeat(np.arange(len(T)), len(ok))
        oidx = np.tile(np.arange(len(ok)), len(T))
        keep = (Tn + t_suf[i + 1] <= deadline_s + eps) & (Cn + c_suf[i + 1] <= cost_cap)
        Tn, Cn, parent, oidx = Tn[keep], Cn[keep], parent[keep], oidx[keep]
        if len(Tn) == 0:
            return []
        Hn = oh[oidx]
        order = np.lexsort((Cn, Tn, Hn))
        Tn, Cn, Hn, parent, oidx = Tn[order], Cn[order], Hn[order], parent[order], oidx[order]
        mask = np.zeros(len(Tn), dtype=bool)
        starts = np.flatnonzero(np.r_[True, Hn[1:] != Hn[:-1]])
        ends = np.r_[starts[1:], len(Tn)]
        for s, e in zip(starts, ends):
            seg = Cn[s:e]
            running = np.minimum.accumulate(seg)
            mask[s] = True
            mask[s + 1:e] = seg[1:] < running[:-1] - 1e-12
        T, C, H = Tn[mask], Cn[mask], Hn[mask]
        history.append((parent[mask], cands[i][ok[oidx[mask]]], Hn[mask]))
    # Final front over all states.
    order = np.lexsort((C, T))
    best_c, plans = math.inf, []
    for j in order:
        if C[j] < best_c - 1e-12:
            best_c = C[j]
            plans.append(_backtrack(history, int(j)))
    return plans


def _backtrack(history: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
               index: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    alloc, held = [], []
    for parent, allocs, helds in reversed(history):
        alloc.append(int(allocs[index]))
        held.append(int(helds[index]))
        index = int(parent[index])
    return tuple(reversed(alloc)), tuple(reversed(held))
