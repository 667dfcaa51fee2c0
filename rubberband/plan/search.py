"""The optimal policy's exact search: stage options, bounds from below, and the Pareto-front DP.

A plan picks, per stage, an allocation and how many instances to hold; the state between
stages is the count held (it decides how many instances the next stage launches and waits
for). ``StageGraph`` lays a ``StageTable`` out as that graph: per stage, the options that
can be on a Pareto front (``stage_options``), the states they lead to, and every option's
mean duration and surrogate cost from every state, as matrices.

On that graph, a backward pass gives exact bounds on what the remaining stages take from
each state: the least time, the least cost, and for a weight ``λ`` the least ``cost + λ·time``
(``to_go``). Minimising ``cost + λ·time`` over whole plans is a shortest path; searching ``λ``
finds the cheapest plan on the lower convex hull of (mean JCT, cost) that meets the deadline
(``hull_plan``). Its billed cost ``B`` (full simulation) caps the search: a plan whose surrogate
cost (a lower bound on its billed cost) exceeds ``B`` cannot beat it. The forward DP
(``pareto_front``) keeps, per state, the (time, cost) points no other point of that state
dominates, and drops a point as soon as the bounds prove that no completion of it meets the
deadline within the cap — by time, by cost, or by Lagrangian duality: every completion has
``C + λT + V_λ ≤ C_total + λ·T_total``, so ``C + λT + V_λ > B + λ·D`` rules the point out.
It never lays out every (point, option) pair: states from which an option costs the same meet
it as one merged front, and each bound keeps a prefix of a source's points sorted by its key
(``pareto_front``'s docstring proves both exact). Every rule only removes plans that cannot
win, so the search stays exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rubberband.plan.table import StageTable

# Relative slack on float comparisons between sums taken in different orders.
_REL = 1e-9


def stage_options(table: StageTable, i: int, cands: np.ndarray, needs: np.ndarray,
                  later: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stage ``i``'s options that can be on a Pareto front: ``(allocations, held)``.

    The search space lets an allocation hold the fewest instances it needs, or any count in
    ``later`` above that. Once the held count ``h`` is fixed, the stage's duration and cost
    depend on the allocation only through its mean TRAIN makespan ``train_s`` (duration) and,
    under per-instance billing, ``price * h * train_s`` (cost), or its ``busy_usd`` under
    per-function billing; everything else (SCALE, INIT, data) depends on ``h`` and the
    previous stage's count alone (``StageTable``'s formulas). So among the allocations that may
    hold ``h``, one that is no slower and no costlier in those terms is as good for every
    previous state and every continuation: only the non-dominated ones are kept (under
    per-instance billing, the single fastest). A stage of SHA(512) with up to 64 GPUs per
    trial keeps some 40 options of several thousand.
    """
    types = table.state_types      # a held count of one type cannot hold another's instances
    if table.per_instance and len(cands):
        return _fastest_per_count(cands, needs, later, _fastest_trains(table, i, cands, needs, later), types)
    # Makespans alone first: under per-instance billing no summed duration is needed (``train_s``).
    train = np.array([table.train_s(i, int(a)) for a in cands])
    busy = np.array([table.entry(i, int(a)).busy_usd for a in cands])
    later_set = set(later.tolist())
    out_a, out_h = [], []
    for h in np.union1d(needs, later):
        allowed = np.flatnonzero((needs == h) | (((needs < h) & (needs % types == h % types))
                                                 if int(h) in later_set else False))
        if len(allowed) == 0:
            continue
        # Fastest first (ties: the smaller allocation), then whatever is strictly cheaper.
        order = allowed[np.lexsort((cands[allowed], train[allowed]))]
        if table.per_instance:
            keep = order[:1]
        else:
            running = np.minimum.accumulate(busy[order])
            keep = order[np.r_[True, busy[order][1:] < running[:-1]]]
        out_a.append(cands[keep])
        out_h.append(np.full(len(keep), h, dtype=np.int64))
    return np.concatenate(out_a), np.concatenate(out_h)


def _fastest_trains(table: StageTable, i: int, cands: np.ndarray, needs: np.ndarray,
                    later: np.ndarray) -> np.ndarray:
    """``train_s`` of stage ``i``'s candidates where ``_fastest_per_count`` may choose them, and
    ``inf`` where it cannot: under per-instance billing each held count keeps its fastest
    candidate alone, so a costly one (a queue to list schedule, the spot kernel) whose lower
    bound (``train_bound``) is above the fastest time already known for every count it may
    hold is never chosen; it is passed over, cheapest bound first. Each count keeps a candidate
    with a known time (one is passed over only where every count it may hold has one), and one
    passed over is slower than it, never tied with it, so the choice is the one made with every
    time known."""
    train = np.full(len(cands), np.inf)
    cheap = getattr(table, "train_s_cheap", None)
    costly = []
    for j, a in enumerate(cands):
        if cheap is None or cheap(i, int(a)):
            train[j] = table.train_s(i, int(a))
        else:
            costly.append(j)
    if not costly:
        return train
    types = table.state_types
    counts = np.union1d(needs, later)
    is_later = np.isin(counts, later)
    least = _least_per_count(counts, is_later, needs, train, types)
    bounds = np.array([table.train_bound(i, int(cands[j])) for j in costly])
    for j, bound in sorted(zip(costly, bounds.tolist()), key=lambda jb: jb[1]):
        need = needs[j]
        mine = (counts == need) | (is_later & (counts > need) & (counts % types == need % types))
        # A hair below the bound: the bound and the time add up their samples differently.
        if np.any(least[mine] >= bound * (1 - 1e-9)):
            train[j] = table.train_s(i, int(cands[j]))
            np.minimum(least, np.where(mine, train[j], np.inf), out=least)
    return train


def _least_per_count(counts: np.ndarray, is_later: np.ndarray, needs: np.ndarray, train: np.ndarray,
                     types: int) -> np.ndarray:
    """Per held count, the least ``train`` of the candidates that may hold it: those that need
    exactly it, and, where a later stage needs it, those of its type that need fewer."""
    least = np.full(len(counts), np.inf)
    np.minimum.at(least, np.searchsorted(counts, needs), train)
    for r in np.unique(counts % types):
        mine = np.flatnonzero(needs % types == r)
        if not len(mine):
            continue
        by_need = mine[np.argsort(needs[mine], kind="stable")]
        prefix = np.minimum.accumulate(train[by_need])
        at = np.flatnonzero(is_later & (counts % types == r))
        below = np.searchsorted(needs[by_need], counts[at], side="left") - 1
        ok = below >= 0
        least[at[ok]] = np.minimum(least[at[ok]], prefix[below[ok]])
    return least


def _fastest_per_count(cands: np.ndarray, needs: np.ndarray, later: np.ndarray, train: np.ndarray,
                       types: int) -> tuple[np.ndarray, np.ndarray]:
    """``stage_options`` under per-instance billing, for every held count at once: per count
    ``h``, the fastest allocation (ties: the smaller) of those needing exactly ``h``, or, when a
    later stage needs ``h``, fewer of the same type. Each candidate's place in one sort by
    (time, allocation) decides, so the choice is the one a sort of each count's own would make."""
    rank = np.empty(len(cands), dtype=np.int64)
    rank[np.lexsort((cands, train))] = np.arange(len(cands))
    counts = np.union1d(needs, later)
    best = np.full(len(counts), len(cands), dtype=np.int64)         # least rank per count; len: none
    np.minimum.at(best, np.searchsorted(counts, needs), rank)
    is_later = np.isin(counts, later)
    for r in np.unique(counts % types):
        mine = np.flatnonzero(needs % types == r)
        if not len(mine):
            continue
        by_need = mine[np.argsort(needs[mine], kind="stable")]
        least = np.minimum.accumulate(rank[by_need])                  # least rank among needs up to each
        at = np.flatnonzero(is_later & (counts % types == r))
        below = np.searchsorted(needs[by_need], counts[at], side="left") - 1     # needs strictly below h
        ok = below >= 0
        best[at[ok]] = np.minimum(best[at[ok]], least[below[ok]])
    found = best < len(cands)
    order = np.argsort(rank)                                          # rank -> candidate
    return cands[order[best[found]]], counts[found].astype(np.int64)


@dataclass(frozen=True)
class PlanProgress:
    """Where a plan search is, for a progress line: stage ``stage`` (from 1) of ``stages``, with
    ``kept`` candidates left after pruning (options of the stage while the search space is laid
    out, partial plans during the DP); ``scenario`` of ``scenarios`` in a what-if sweep.

    ``phase`` says what the time goes to, so a line never sits on a stage that is done:
    ``LAYOUT`` (the stage's options, its queues list scheduled: reported as a stage starts and
    as it ends), ``BOUNDS`` (which costly allocations a plan may use), ``FRONT`` (the DP), and
    ``SIMULATING`` (full simulations: ``stage`` is the one under way, ``stages`` the most there
    may be)."""

    stage: int
    stages: int
    kept: int
    scenario: int = 0
    scenarios: int = 0
    phase: str = ""

    @property
    def step(self) -> tuple:
        """What a progress line shows every change of, however soon after the last: a stage
        whose options are about to be laid out, a simulation about to run, a new phase or
        scenario (the work it names may take long); counts within one may wait."""
        return self.scenario, self.phase, self.stage if self.phase in (LAYOUT, SIMULATING) else 0

    def describe(self) -> str:
        """The progress line's text after "planning: "."""
        where = f"scenario {self.scenario} of {self.scenarios}, " if self.scenarios else ""
        if self.phase == SIMULATING:
            return f"{where}simulating plan {self.stage} of at most {self.stages} in full"
        doing = f" ({self.phase})" if self.phase else ""
        return f"{where}stage {self.stage} of {self.stages}, {self.kept:,} candidates kept{doing}"


LAYOUT, BOUNDS, FRONT, SIMULATING = "laying out options", "bounding", "searching plans", "simulating"


# A callback the planner calls as it goes (the pure core never prints; the CLI draws the line).
Progress = Callable[[PlanProgress], None]


@dataclass(frozen=True)
class PathPlan:
    """One plan through the graph, with its mean JCT and surrogate cost."""

    allocation: tuple[int, ...]
    instances: tuple[int, ...]
    jct_s: float
    cost_usd: float


class StageGraph:
    """The optimal policy's search space on a ``StageTable`` (see the module docstring).

    Args:
        table: the per-stage means.
        deadline_s: drops queued allocations that cannot meet it (``StageTable.candidates``).
        allocations: per stage, the allocations to search (default: all candidates).
        progress: called after each stage is laid out, with its options kept.
    """

    def __init__(self, table: StageTable, deadline_s: float = math.inf,
                 allocations: list[list[int]] | None = None, progress: Progress | None = None):
        self.table = table
        n = table.num_stages
        if allocations is None:
            allocations = [table.candidates(i, deadline_s) for i in range(n)]
        cands = [np.array(sorted(allocations[i]), dtype=np.int64) for i in range(n)]
        needs = [np.array([table.need(i, a) for a in cands[i]], dtype=np.int64) for i in range(n)]
        # Per stage: the counts some later stage needs (worth holding through this one's SYNC).
        later = [np.zeros(0, dtype=np.int64)] * n
        start = table.start_state     # held before stage 0 (instances held at the start; 0: none)
        for i in range(n - 2, -1, -1):
            # The count held at the start is worth keeping too, until a later stage needs more.
            later[i] = np.union1d(later[i + 1], [*needs[i + 1], *([start] if start else [])])
            # Never more than a stage may hold (``max_instances``), held instances included.
            later[i] = later[i][[table.holds(int(h)) for h in later[i]]].astype(np.int64)
        self.later = later                    # per stage: the counts it may hold for a later stage
        self.alloc: list[np.ndarray] = []     # per stage, per option: allocation
        self.held: list[np.ndarray] = []      # per stage, per option: instances held
        self.states: list[np.ndarray] = [np.array([start], dtype=np.int64)]   # per stage: held counts before it
        for i in range(n):
            if progress is not None:      # a stage of queues to list schedule can take a while
                progress(PlanProgress(i + 1, n, len(cands[i]), phase=LAYOUT))
            a, h = stage_options(table, i, cands[i], needs[i], later[i])
            self.alloc.append(a)
            self.held.append(h)
            self.states.append(np.unique(h))
            if progress is not None:
                progress(PlanProgress(i + 1, n, len(a), phase=LAYOUT))
        self.states[n] = np.zeros(1, dtype=np.int64)    # the end: one state
        # Per stage: the state index each option leads to, and (states x options) matrices.
        self.next = [np.searchsorted(self.states[i + 1], self.held[i]) if i < n - 1
                     else np.zeros(len(self.held[i]), dtype=np.int64) for i in range(n)]
        self.dur, self.cost = [], []
        for i in range(n):
            d, c = table.stage_grid(i, self.alloc[i], self.held[i], self.states[i])
            self.dur.append(d)
            self.cost.append(np.ascontiguousarray(c))

    @property
    def num_stages(self) -> int:
        return len(self.alloc)

    def to_go(self, time_weight: float, cost_weight: float) -> list[np.ndarray]:
        """Per stage ``i`` and state: the least ``cost_weight·cost + time_weight·time`` of stages
        ``i..end`` (a list of ``num_stages + 1`` arrays, the last ``[0]``)."""
        out = [np.zeros(1)] * (self.num_stages + 1)
        for i in range(self.num_stages - 1, -1, -1):
            out[i] = self._weighted(i, time_weight, cost_weight, out[i + 1][self.next[i]]).min(axis=1)
        return out

    def _weighted(self, i: int, time_weight: float, cost_weight: float, after: np.ndarray) -> np.ndarray:
        """``cost_weight·cost[i] + time_weight·dur[i] + after`` (``after`` per option), in one
        buffer; a weight of 0 drops its term, a weight of 1 skips its product: the same numbers,
        as every duration and cost is finite (``0·x`` is then ``+0``, and ``y + 0 = y``)."""
        if cost_weight == 0.0:
            total = self.dur[i] * time_weight if time_weight != 1.0 else self.dur[i].copy()
        else:
            total = self.cost[i] * cost_weight if cost_weight != 1.0 else self.cost[i].copy()
            if time_weight != 0.0:
                total += self.dur[i] * time_weight if time_weight != 1.0 else self.dur[i]
        total += after
        return total

    def to_reach(self, time_weight: float, cost_weight: float) -> list[np.ndarray]:
        """Per stage ``i`` and state before it: the least ``cost_weight·cost + time_weight·time``
        of stages ``0..i-1`` that ends in that state (``inf`` where none does)."""
        out = [np.zeros(1)]
        for i in range(self.num_stages):
            total = (out[i][:, None] + cost_weight * self.cost[i] + time_weight * self.dur[i]).min(axis=0)
            reach = np.full(len(self.states[i + 1]), np.inf)
            np.minimum.at(reach, self.next[i], total)
            out.append(reach)
        return out

    def _walk(self, pick: Callable[[int, int], int]) -> PathPlan:
        state, alloc, held, jct, cost = 0, [], [], 0.0, 0.0
        for i in range(self.num_stages):
            o = pick(i, state)
            alloc.append(int(self.alloc[i][o]))
            held.append(int(self.held[i][o]))
            jct += self.dur[i][state, o]
            cost += self.cost[i][state, o]
            state = int(self.next[i][o])
        return PathPlan(tuple(alloc), tuple(held), float(jct), float(cost))

    def weighted_plan(self, lam: float) -> PathPlan:
        """The plan of least ``cost + lam·JCT`` (a point of the front's lower convex hull)."""
        best: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * self.num_stages     # per stage and state
        v = np.zeros(1)
        for i in range(self.num_stages - 1, -1, -1):      # ``to_go(lam, 1.0)``, keeping each state's choice
            # ``cost + lam * dur + v[next]`` in one buffer: the same sums (``+`` and ``*`` commute exactly).
            total = np.multiply(self.dur[i], lam)
            total += self.cost[i]
            total += v[self.next[i]]
            best[i] = total.argmin(axis=1)
            v = total[np.arange(len(total)), best[i]]
        return self._walk(lambda i, s: int(best[i][s]))

    def fastest(self) -> PathPlan:
        """The plan of least mean JCT, the cheapest of those (to float rounding)."""
        t = self.to_go(1.0, 0.0)
        c: list[np.ndarray] = [np.zeros(1)] * (self.num_stages + 1)
        for i in range(self.num_stages - 1, -1, -1):
            total_t = self.dur[i] + t[i + 1][self.next[i]][None, :]
            total_c = self.cost[i] + c[i + 1][self.next[i]][None, :]
            fastest = total_t <= total_t.min(axis=1, keepdims=True) * (1 + _REL)
            c[i] = np.where(fastest, total_c, np.inf).min(axis=1)
        def pick(i: int, s: int) -> int:
            total_t = self.dur[i][s] + t[i + 1][self.next[i]]
            total_c = np.where(total_t <= total_t.min() * (1 + _REL), self.cost[i][s] + c[i + 1][self.next[i]], np.inf)
            return int(np.argmin(total_c))
        return self._walk(pick)

    def hull_plan(self, deadline_s: float) -> tuple[PathPlan, float] | None:
        """The cheapest plan of the lower convex hull whose mean JCT meets ``deadline_s``, and its
        weight ``λ`` (``None`` when even the fastest plan is too slow).

        A walk along the hull (Eisner and Severance): between a hull plan that misses the
        deadline and one that meets it, the plan of least ``cost + λ·JCT`` at the slope ``λ`` of
        the segment joining them is either on that segment (they are neighbours on the hull:
        the one that meets is the answer, and ``λ`` makes both optimal) or strictly below it, a
        hull plan between them that replaces the one on its side of the deadline. A few
        shortest paths instead of a bisection's forty."""
        slow = self.weighted_plan(0.0)
        if slow.jct_s <= deadline_s:
            return slow, 0.0
        fast = self.fastest()
        if fast.jct_s > deadline_s:
            return None
        lam = 0.0
        for _ in range(_HULL_STEPS):
            lam = max(0.0, (fast.cost_usd - slow.cost_usd) / (slow.jct_s - fast.jct_s))
            line = fast.cost_usd + lam * fast.jct_s
            plan = self.weighted_plan(lam)
            if plan.cost_usd + lam * plan.jct_s >= line - _REL * max(1.0, abs(line)):
                break
            if plan.jct_s <= deadline_s:
                fast = plan
            else:
                slow = plan
        return fast, lam


# Most steps of the hull walk (each finds a new hull plan; there are rarely more than a dozen).
_HULL_STEPS = 64


def costly_survivors(graph: StageGraph, deadline_s: float, cost_cap: float = math.inf,
                     lam: float | None = None, progress: Progress | None = None) -> list[list[int]]:
    """Per stage, the candidate allocations that are costly to simulate (a queue to list
    schedule, a stage the spot kernel runs) and that some plan meeting ``deadline_s`` at a
    surrogate cost of at most ``cost_cap`` may use.

    ``graph`` is laid out on ``StageTable.optimistic()``: every value in it is at most the true
    one (costly allocations at their ``stage_bounds``), so the least time, cost and (with
    ``lam``) ``cost + lam·time`` to reach each state and to go from each state bound every plan
    from below. An allocation goes unless, for some state before its stage and some count it
    may hold, all three bounds of a plan through it are within the deadline, the cap and the
    Lagrangian ``cost_cap + lam·deadline_s``."""
    view, n = graph.table, graph.num_stages
    finite_c = math.isfinite(cost_cap)
    t_eps = _REL * max(1.0, deadline_s if math.isfinite(deadline_s) else 1.0)
    c_eps = _REL * max(1.0, cost_cap if finite_c else 1.0)
    t_in, t_go = graph.to_reach(1.0, 0.0), graph.to_go(1.0, 0.0)
    c_in, c_go = (graph.to_reach(0.0, 1.0), graph.to_go(0.0, 1.0)) if finite_c else (None, None)
    use_v = bool(lam) and finite_c and math.isfinite(deadline_s)
    v_in, v_go = (graph.to_reach(lam, 1.0), graph.to_go(lam, 1.0)) if use_v else (None, None)
    out = []
    types = view.state_types
    for i in range(n):
        keep = []
        states = graph.states[i]
        later = graph.later[i]
        for a in view.candidates(i, deadline_s):
            if view.simulated_cheaply(i, a):
                continue
            need = view.need(i, a)
            # The fewest it needs, then every count a later stage needs above it, of its type (ascending).
            held = np.concatenate(([need], later[(later > need) & (later % types == need % types)])).astype(np.int64)
            nxt = np.searchsorted(graph.states[i + 1], held) if i < n - 1 else np.zeros(len(held), dtype=np.int64)
            d, c = view.stage_many(i, np.full(len(held), a)[None, :], held[None, :], states[:, None])
            ok = t_in[i][:, None] + d + t_go[i + 1][nxt][None, :] <= deadline_s + t_eps
            if finite_c:
                ok &= c_in[i][:, None] + c + c_go[i + 1][nxt][None, :] <= cost_cap + c_eps
            if use_v:
                ok &= (v_in[i][:, None] + c + lam * d + v_go[i + 1][nxt][None, :]
                       <= cost_cap + lam * deadline_s + c_eps + lam * t_eps)
            if ok.any():
                keep.append(a)
        out.append(keep)
        if progress is not None:
            progress(PlanProgress(i + 1, n, len(keep), phase=BOUNDS))
    return out


def pareto_front(table: StageTable, deadline_s: float = math.inf, cost_cap: float = math.inf,
                 graph: StageGraph | None = None, lam: float | None = None,
                 progress: Progress | None = None) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """``(allocation, instances held)`` vectors on the (mean JCT, surrogate cost) Pareto front
    whose mean JCT meets ``deadline_s`` and whose cost is at most ``cost_cap``, fastest first
    (see ``optimal_policy`` for the search space). ``lam``: the weight of a Lagrangian bound
    (``StageGraph.hull_plan`` gives a tight one); the front is the same with or without it.
    ``progress``: called after each stage with the partial plans kept.

    Stage by stage, every kept point meets every option of the stage, but not one by one:

    - *Merged sources.* Where an option's duration and cost are the same (to the bit) from
      every state at or above some state (a stage that launches nothing from there on), the
      points of all those states are merged into their own front first (``_suffix_fronts``)
      and the option meets that front once. Exact: the points share one shift, so one that
      another of them dominates stays dominated after it (sums round monotonically), and a
      dominated point never lowers the running least cost that decides what is kept.
    - *Bounds as prefixes.* Each source's points are sorted by the bound's key (``C + λT``
      with a Lagrangian bound, else ``T``, else ``C``); a bound keeps a prefix of them, found
      by a binary search per (source, option) with a little slack, and the bounds are then
      applied to those points with the very sums and comparisons of a whole-matrix pass. So
      only points that may survive are ever built, and the same ones survive.
    """
    graph = graph or StageGraph(table, deadline_s)
    finite_d, finite_c = math.isfinite(deadline_s), math.isfinite(cost_cap)
    t_eps = _REL * max(1.0, deadline_s if finite_d else 1.0)
    c_eps = _REL * max(1.0, cost_cap if finite_c else 1.0)
    t_go = graph.to_go(1.0, 0.0) if finite_d else None
    c_go = graph.to_go(0.0, 1.0) if finite_c else None
    v_go = graph.to_go(lam, 1.0) if lam and finite_d and finite_c else None
    # Points after the previous stage: time, cost, state index; sorted by state, then time, cost.
    T = np.zeros(1)
    C = np.zeros(1)
    S = np.zeros(1, dtype=np.int64)
    history: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []   # per stage: parent, allocation, held
    for i in range(graph.num_stages):
        nxt, dur, cost = graph.next[i], graph.dur[i], graph.cost[i]
        # The bound's key per point, and per (row, option) the most it may be (``None``: no bound).
        if v_go is not None:
            key = C + lam * T
            rhs = cost_cap + lam * deadline_s + c_eps + lam * t_eps
            limit = rhs - (cost + lam * dur + v_go[i + 1][nxt][None, :])
        elif t_go is not None:
            key, rhs = T, deadline_s + t_eps
            limit = rhs - (dur + t_go[i + 1][nxt][None, :])
        elif c_go is not None:
            key, rhs = C, cost_cap + c_eps
            limit = rhs - (cost + c_go[i + 1][nxt][None, :])
        else:
            key = limit = None
        if limit is not None:
            # Slack for the other order of the sums (the exact test follows on what it keeps).
            limit = limit + 1e-9 * (abs(rhs) + np.abs(limit) + 1.0)
        pool, blocks = _blocks(T, C, S, dur, cost, key)
        parts = []
        for start, end, row, options in blocks:
            if limit is None:
                counts = np.full(len(options), end - start)
            else:
                counts = np.searchsorted(key[pool[start:end]], limit[row, options], side="right")
            parts.append((start, row, options, counts))
        starts = np.concatenate([np.full(len(o), s) for s, _, o, _ in parts])
        rows = np.concatenate([np.full(len(o), r) for _, r, o, _ in parts])
        options = np.concatenate([o for _, _, o, _ in parts])
        counts = np.concatenate([c for _, _, _, c in parts]).astype(np.int64)
        total = int(counts.sum())
        if total == 0:
            return []
        pair = np.repeat(np.arange(len(counts)), counts)
        offset = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        parent = pool[starts[pair] + offset]
        option, row = options[pair], rows[pair]
        # The same sums as ``T[:, None] + dur[S]`` (a merged source's row equals each of its states').
        Tn = T[parent] + dur[row, option]
        Cn = C[parent] + cost[row, option]
        Sn = nxt[option]
        keep = np.ones(total, dtype=bool)
        if t_go is not None:
            keep &= Tn + t_go[i + 1][Sn] <= deadline_s + t_eps
        if c_go is not None:
            keep &= Cn + c_go[i + 1][Sn] <= cost_cap + c_eps
        if v_go is not None:
            keep &= Cn + lam * Tn + v_go[i + 1][Sn] <= cost_cap + lam * deadline_s + c_eps + lam * t_eps
        keep = np.flatnonzero(keep)
        if len(keep) == 0:
            return []
        mask = _front_per_state(Tn, Cn, Sn, keep)
        T, C, S = Tn[mask], Cn[mask], Sn[mask]
        history.append((parent[mask], graph.alloc[i][option[mask]], graph.held[i][option[mask]]))
        if progress is not None:
            progress(PlanProgress(i + 1, graph.num_stages, len(T), phase=FRONT))
    order = np.lexsort((C, T))
    best_c, plans = math.inf, []
    for j in order:
        if C[j] < best_c - 1e-12:
            best_c = C[j]
            plans.append(_backtrack(history, int(j)))
    return plans


def _front_per_state(T: np.ndarray, C: np.ndarray, S: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Of the points ``idx``, per state and sorted by time then cost, those strictly cheaper (by
    more than ``1e-12``) than every point before them in the state; in (state, time, cost)
    order. The first of each state always stays."""
    if len(idx) <= _ONE_SORT:
        idx = idx[np.lexsort((C[idx], T[idx], S[idx]))]
        s, c = S[idx], C[idx]
        first = np.empty(len(idx), dtype=bool)
        first[0] = True
        np.not_equal(s[1:], s[:-1], out=first[1:])
        # A running least cost that starts again at each state, in ranks (exact): each state's
        # ranks are shifted below every earlier state's.
        values, rank = np.unique(c, return_inverse=True)
        shifted = rank.astype(np.int64) - np.cumsum(first) * (len(values) + 1)
        least = values[np.minimum.accumulate(shifted) + np.cumsum(first) * (len(values) + 1)]
        keep = first.copy()
        keep[1:] |= c[1:] < least[:-1] - 1e-12
        return idx[keep]
    # Many points: one state at a time (small sorts are cheaper than one sort of them all).
    by_state = idx[np.argsort(S[idx], kind="stable")]
    s = S[by_state]
    seg = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1], [True])))
    chosen = []
    for a, b in zip(seg[:-1], seg[1:]):
        part = by_state[a:b]
        part = part[np.lexsort((C[part], T[part]))]
        c = C[part]
        keep = np.empty(len(part), dtype=bool)
        keep[0] = True
        keep[1:] = c[1:] < np.minimum.accumulate(c)[:-1] - 1e-12
        chosen.append(part[keep])
    return np.concatenate(chosen)


# Up to this many points, one sort of them all beats a sort per state.
_ONE_SORT = 100_000


def _blocks(T: np.ndarray, C: np.ndarray, S: np.ndarray, dur: np.ndarray, cost: np.ndarray,
            key: np.ndarray | None) -> tuple[np.ndarray, list[tuple[int, int, int, np.ndarray]]]:
    """The sources a stage's options meet: ``(pool, [(start, end, row, options)])``, each source
    the points ``pool[start:end]`` (sorted by ``key``) that meet ``options`` from ``dur`` and
    ``cost``'s row ``row``. A state's own points meet the options whose values differ from some
    state above it; the rest meet a merged front of all the states from which they are the same
    (``pareto_front``'s docstring)."""
    present, first = np.unique(S, return_index=True)
    ends = np.append(first[1:], len(S))
    top = present[-1]
    same = (dur[present] == dur[top][None, :]) & (cost[present] == cost[top][None, :])
    # Per option: the first present state from which every row above is the top one's.
    tail = np.logical_and.accumulate(same[::-1], axis=0)[::-1]
    since = len(present) - tail.sum(axis=0)
    order = np.arange(len(S)) if key is None else np.lexsort((key, S))
    pieces, blocks = [order], []
    for j in range(len(present) - 1):
        options = np.flatnonzero(since > j)
        if len(options):
            blocks.append((int(first[j]), int(ends[j]), int(present[j]), options))
    at = len(S)
    for k, front in _suffix_fronts(T, C, first, np.unique(since)):
        if key is not None:
            front = front[np.argsort(key[front], kind="stable")]
        pieces.append(front)
        blocks.append((at, at + len(front), int(top), np.flatnonzero(since == k)))
        at += len(front)
    return np.concatenate(pieces), blocks


def _suffix_fronts(T: np.ndarray, C: np.ndarray, first: np.ndarray, ks: np.ndarray):
    """For each ``k`` in ``ks``: the indices of the points of the ``k``-th present state and every
    state after it that no other of them dominates (no slower and no costlier; of equal points
    one), as ``(k, indices)``. Built from the top down, each from the one above it."""
    front = np.zeros(0, dtype=np.int64)
    end = len(T)
    for k in sorted((int(k) for k in ks), reverse=True):
        idx = np.concatenate((np.arange(first[k], end), front))
        idx = idx[np.lexsort((C[idx], T[idx]))]
        c = C[idx]
        keep = np.empty(len(idx), dtype=bool)
        keep[0] = True
        keep[1:] = c[1:] < np.minimum.accumulate(c)[:-1]
        front, end = idx[keep], int(first[k])
        yield k, front


def _backtrack(history: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
               index: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    alloc, held = [], []
    for parent, allocs, helds in reversed(history):
        alloc.append(int(allocs[index]))
        held.append(int(helds[index]))
        index = int(parent[index])
    return tuple(reversed(alloc)), tuple(reversed(held))
