"""Packing engine behind ``rubberband.placement``: cluster state, best fit, displacement, exact search.

Everything here works on node *indices* (positions in the caller's node list) and on
``Item`` records built and validated by ``rubberband.placement.placement``; that module turns a
``Candidate`` into a ``Placement`` value. The engine decides which node(s) each trial goes to;
GPU indices are chosen only at the end (``materialize``), because once the per-node GPU counts
fit, any unchanged trial can keep its exact former GPUs and the others take what is left.

Objective, in this order (lexicographic):

1. *Admission.* Trials are ranked largest first (ties: unchanged trials first, then the
   caller's order). A trial is left unplaced only if it cannot be placed together with all
   higher-ranked placed trials — the paper's "larger trials displace smaller ones".
2. *Stability.* The fewest unchanged trials moved (each move is a checkpoint and restart).
3. *Size.* The fewest nodes hosting anything, so the rest can be released; then nodes listed
   first (oldest), since the executor releases the most recently launched first.

Two heuristics always run (fast at 1,000 trials): ``incremental`` (keep every unchanged trial,
best-fit-decreasing for the rest, displace smaller trials when a larger one does not fit —
the paper's Algorithm 3) and ``repack`` (best-fit-decreasing from scratch, unchanged trials
first offered their former node). On small inputs (at most ``EXACT_MAX_TRIALS`` trials to
place) ``exact`` then searches the whole space unless a heuristic result is already proven
optimal by a lower bound, within a budget of ``EXACT_BUDGET`` search steps.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from itertools import combinations

#: The exact search runs only when at most this many (non-reserved) trials are to be placed;
#: beyond that the search space is too large for it to finish within its budget anyway.
EXACT_MAX_TRIALS = 12
#: Search-tree nodes one exact search may visit before it settles for the best plan found.
EXACT_BUDGET = 20_000

_EMPTY = -1  # index key of a node that hosts nothing


@dataclass(frozen=True)
class Item:
    """One non-reserved trial to place.

    Attributes:
        trial: the caller's trial id.
        size: GPUs wanted.
        rank: position in priority order (0 is placed first).
        order: position in the caller's ``demands`` (the output order).
        big: wants whole nodes (more GPUs than the largest node has).
        prev: node indices of its former slots when it may stay exactly where it was (same
            demand, slots still valid and consistent with the rules), else ``None``.
    """

    trial: Hashable
    size: int
    rank: int
    order: int
    big: bool
    prev: tuple[int, ...] | None


@dataclass(frozen=True)
class Problem:
    """One validated placement problem, in node indices.

    Attributes:
        caps: GPUs per node, in the caller's order.
        fixed: reserved trial -> its slots as ``(node index, GPU index)``; never moved.
        fixed_excl: per node, whether a reserved multi-node trial holds it whole.
        items: the other trials, sorted by ``rank``.
        prev_slots: trial -> former slots (node index, GPU index) for items with ``prev``.
    """

    caps: tuple[int, ...]
    fixed: dict
    fixed_excl: tuple[bool, ...]
    items: tuple[Item, ...]
    prev_slots: dict

    @property
    def maxcap(self) -> int:
        return max(self.caps, default=0)


@dataclass
class Candidate:
    """A node-level answer: the state holding the placed trials, and the trials left out."""

    state: State
    unplaced: set = field(default_factory=set)


class _OutOfBudget(Exception):
    pass


class _Budget:
    def __init__(self, steps: int):
        self.left = steps

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _OutOfBudget


class State:
    """Per-node free GPUs and occupants, with indexes for best-fit lookups.

    Nodes hosting something and with room left sit in a heap per free-GPU count; empty
    nodes sit in a heap per node size. Heaps are lazy: an entry is valid only while the
    node's key still matches, so updates are O(log n) pushes and stale entries are skipped.
    """

    def __init__(self, prob: Problem):
        self.prob = prob
        caps = prob.caps
        n = len(caps)
        fixed_gpus = [0] * n
        for slots in prob.fixed.values():
            for i, _ in slots:
                fixed_gpus[i] += 1
        self.pinned = [g > 0 for g in fixed_gpus]
        self.excl = list(prob.fixed_excl)
        self.free = [0 if self.excl[i] else caps[i] - fixed_gpus[i] for i in range(n)]
        self.occ: list[dict] = [{} for _ in range(n)]  # trial -> GPUs it holds on the node
        self.where: dict = {}  # trial -> node indices, in fill order
        self.kept: set = set()  # trials sitting on exactly their former node(s)
        self._key: list[int | None] = [None] * n
        self._open: dict[int, list[int]] = {}
        self._empty: dict[int, list[int]] = {}
        for i in range(n):
            self._index(i)

    # --- indexes --------------------------------------------------------------------------
    def empty(self, i: int) -> bool:
        return not self.pinned[i] and not self.occ[i]

    def _index(self, i: int) -> None:
        if self.empty(i):
            key: int | None = _EMPTY
        elif self.excl[i] or self.free[i] == 0:
            key = None
        else:
            key = self.free[i]
        if key == self._key[i]:
            return
        self._key[i] = key
        if key == _EMPTY:
            heapq.heappush(self._empty.setdefault(self.prob.caps[i], []), i)
        elif key is not None:
            heapq.heappush(self._open.setdefault(key, []), i)

    def find(self, it: Item) -> tuple[int, ...] | None:
        """Where ``it`` would go now, or ``None`` if nowhere has room.

        A single-node trial goes to the node in use with the least room that still fits it
        (best fit; ties to the node listed first), else to the first listed empty node that
        fits. A multi-node trial takes the fewest empty nodes that hold it (largest first,
        then listed first — for equal-sized nodes simply the first listed).
        """
        if it.big:
            return self._find_whole_nodes(it.size)
        m = it.size
        for f in sorted(self._open):
            if f < m:
                continue
            heap = self._open[f]
            while heap and self._key[heap[0]] != f:
                heapq.heappop(heap)
            if heap:
                return (heap[0],)
        best = None
        for cap, heap in self._empty.items():
            if cap < m:
                continue
            while heap and self._key[heap[0]] != _EMPTY:
                heapq.heappop(heap)
            if heap and (best is None or heap[0] < best):
                best = heap[0]
        return None if best is None else (best,)

    def _find_whole_nodes(self, m: int) -> tuple[int, ...] | None:
        caps = self.prob.caps
        empties = sorted((i for i, k in enumerate(self._key) if k == _EMPTY), key=lambda i: (-caps[i], i))
        take, total = [], 0
        for i in empties:
            take.append(i)
            total += caps[i]
            if total >= m:
                return tuple(take)
        return None

    def fits_at(self, it: Item, nodes: tuple[int, ...]) -> bool:
        if it.big:
            return all(self.empty(i) for i in nodes)
        i = nodes[0]
        return not self.excl[i] and self.free[i] >= it.size

    # --- changes --------------------------------------------------------------------------
    def assign(self, it: Item, nodes: tuple[int, ...]) -> None:
        caps = self.prob.caps
        if it.big:
            left = it.size
            for i in nodes:
                g = min(caps[i], left)
                left -= g
                self.occ[i][it.trial] = g
                self.free[i] = 0  # the unused GPUs of a multi-node trial's last node stay idle
                self.excl[i] = True
                self._index(i)
            stays = it.prev is not None and set(nodes) == set(it.prev)
        else:
            i = nodes[0]
            self.occ[i][it.trial] = it.size
            self.free[i] -= it.size
            self._index(i)
            stays = it.prev is not None and nodes == it.prev
        self.where[it.trial] = nodes
        if stays:
            self.kept.add(it.trial)

    def evict(self, it: Item) -> None:
        nodes = self.where.pop(it.trial)
        self.kept.discard(it.trial)
        for i in nodes:
            g = self.occ[i].pop(it.trial)
            if it.big:
                self.excl[i] = False
                self.free[i] = self.prob.caps[i]
            else:
                self.free[i] += g
            self._index(i)

    def displace(self, it: Item, items_by_trial: dict) -> tuple[tuple[int, ...], list[Item]] | None:
        """Room for ``it`` made by evicting strictly smaller, non-reserved trials.

        Evicting a trial placed in this round costs nothing, evicting an unchanged one costs a
        move, so the cheapest node is the one that evicts the fewest unchanged trials, then
        the fewest trials, then the fewest GPUs.

        Returns:
            ``(nodes, victims)``, or ``None`` when no node(s) can be cleared.
        """
        caps, m = self.prob.caps, it.size
        n = len(caps)
        if it.big:
            ranked = []
            for i in range(n):
                if self.pinned[i] or any(items_by_trial[o].size >= m for o in self.occ[i]):
                    continue
                occ = self.occ[i]
                cost = (sum(o in self.kept for o in occ), len(occ), sum(occ.values()))
                ranked.append((cost, -caps[i], i))
            ranked.sort()
            take, total = [], 0
            for _, _, i in ranked:
                take.append(i)
                total += caps[i]
                if total >= m:
                    break
            if total < m:
                return None
            seen: dict = {}
            for i in take:
                for o in self.occ[i]:
                    seen.setdefault(o, items_by_trial[o])
            return tuple(take), list(seen.values())
        best = None
        for i in range(n):
            if caps[i] < m or self.excl[i]:
                continue
            pool = sorted(
                (items_by_trial[o] for o in self.occ[i] if items_by_trial[o].size < m),
                key=lambda v: (v.trial in self.kept, -v.size, -v.rank),
            )
            room, victims = self.free[i], []
            for v in pool:
                if room >= m:
                    break
                victims.append(v)
                room += v.size
            if room < m:
                continue
            cost = (sum(v.trial in self.kept for v in victims), len(victims), sum(v.size for v in victims), i)
            if best is None or cost < best[0]:
                best = (cost, i, victims)
        if best is None:
            return None
        return (best[1],), best[2]

    # --- summaries ------------------------------------------------------------------------
    def used_nodes(self) -> list[int]:
        return [i for i in range(len(self.prob.caps)) if not self.empty(i)]


# --- heuristics ---------------------------------------------------------------------------
def incremental(prob: Problem, admitted: Iterable[Item]) -> Candidate:
    """Keep every unchanged trial; place the rest largest first, displacing smaller ones.

    This is the paper's Algorithm 3. Displaced trials are queued again; every displacement
    evicts strictly smaller trials, so sizes are processed in non-increasing order and a
    size that once failed to fit (even by displacement) can never fit later in this run.
    """
    admitted = list(admitted)
    st = State(prob)
    by_trial = {it.trial: it for it in prob.items}
    chosen = {it.trial for it in admitted}
    unplaced = {it.trial for it in prob.items if it.trial not in chosen}
    queue = []
    for it in admitted:
        if it.prev is not None:
            st.assign(it, it.prev)
        else:
            queue.append(it.rank)
    heapq.heapify(queue)
    failed: set[int] = set()
    guard = 8 * len(prob.items) + 64  # displacement chains are finite; this only bounds them
    while queue:
        it = prob.items[heapq.heappop(queue)]
        guard -= 1
        if guard < 0 or it.size in failed:
            unplaced.add(it.trial)
            continue
        nodes = st.find(it)
        if nodes is None:
            made = st.displace(it, by_trial)
            if made is None:
                failed.add(it.size)
                unplaced.add(it.trial)
                continue
            nodes, victims = made
            for v in victims:
                st.evict(v)
                heapq.heappush(queue, v.rank)
        st.assign(it, nodes)
    return Candidate(st, unplaced)


def repack(prob: Problem, admitted: Iterable[Item]) -> Candidate:
    """Best-fit-decreasing from scratch; an unchanged trial is first offered its former node.

    Trials that do not fit are left out, so this also decides admission on large inputs.
    """
    st = State(prob)
    admitted = list(admitted)
    chosen = {it.trial for it in admitted}
    unplaced = {it.trial for it in prob.items if it.trial not in chosen}
    for it in admitted:
        if it.prev is not None and st.fits_at(it, it.prev):
            st.assign(it, it.prev)
            continue
        nodes = st.find(it)
        if nodes is None:
            unplaced.add(it.trial)
        else:
            st.assign(it, nodes)
    return Candidate(st, unplaced)


def score(prob: Problem, cand: Candidate) -> tuple:
    """Sort key of a candidate: admission, then moves, then nodes (then oldest nodes)."""
    st = cand.state
    admission = tuple(it.trial in cand.unplaced for it in prob.items)
    moves = sum(1 for it in prob.items if it.prev is not None and it.trial in st.where and it.trial not in st.kept)
    used = st.used_nodes()
    return admission, moves, len(used), tuple(sorted(used, reverse=True))


def proven_optimal(prob: Problem, cand: Candidate) -> bool:
    """Whether ``cand`` places everything, moves nothing needlessly and meets the node bound."""
    st = cand.state
    if cand.unplaced or any(it.prev is not None and it.trial not in st.kept for it in prob.items):
        return False
    base = State(prob)
    rest = []
    for it in prob.items:
        if it.prev is not None:
            base.assign(it, it.prev)
        else:
            rest.append(it)
    return len(st.used_nodes()) <= _node_bound(base, rest)


def _node_bound(st: State, items: list[Item]) -> int:
    """Lower bound on nodes in use once ``items`` are added to ``st``.

    Multi-node trials need empty nodes; single-node trials first fill the room left on nodes
    in use, and each further node holds at most the largest node size.
    """
    maxcap = st.prob.maxcap
    used = st.used_nodes()
    room = sum(st.free[i] for i in used if not st.excl[i])
    whole = sum(math.ceil(it.size / maxcap) for it in items if it.big)
    small = sum(it.size for it in items if not it.big)
    return len(used) + whole + math.ceil(max(0, small - room) / maxcap)


# --- exact search -------------------------------------------------------------------------
def exact(prob: Problem, budget_steps: int = EXACT_BUDGET) -> Candidate | None:
    """Best candidate by exhaustive branch and bound, or ``None`` if the budget ran out first.

    Admission tries all trials, else adds trials in rank order while a packing exists. Then
    for d = 0, 1, ... unchanged trials dropped (lowest-ranked dropped first), the rest are
    packed on the fewest nodes; the first d with a packing is the fewest moves.
    """
    budget = _Budget(budget_steps)
    base = State(prob)
    found = None
    unplaced: set = set()
    try:
        items = list(prob.items)
        if _pack(base, items, budget, first_only=True) is not None:
            admitted = items
        else:
            admitted = []
            for it in items:
                if _pack(base, admitted + [it], budget, first_only=True) is not None:
                    admitted.append(it)
        chosen = {it.trial for it in admitted}
        unplaced = {it.trial for it in items if it.trial not in chosen}
        stay = [it for it in admitted if it.prev is not None]
        for d in range(len(stay) + 1):
            found = None
            bound = math.inf
            for dropped in combinations(reversed(stay), d):
                out = {it.trial for it in dropped}
                st = State(prob)
                for it in stay:
                    if it.trial not in out:
                        st.assign(it, it.prev)
                rest = [it for it in admitted if it.prev is None or it.trial in out]
                packed = _pack(st, rest, budget, bound=bound)
                if packed is not None:
                    bound, choice = packed
                    found = (st, rest, choice)
            if found is not None:
                break
    except _OutOfBudget:
        pass  # a packing found before the budget ran out is still valid, if not proven best
    if found is None:
        return None
    st, rest, choice = found
    for it in rest:
        st.assign(it, choice[it.trial])
    return Candidate(st, unplaced)


def _pack(st: State, items: list[Item], budget: _Budget, bound: float = math.inf,
          first_only: bool = False) -> tuple[int, dict] | None:
    """Fewest nodes in use (below ``bound``) after adding ``items`` to ``st``; ``st`` is untouched.

    Depth-first over items largest first. A single-node trial branches over the distinct
    (room, size) classes of nodes in use, best fit first, then one empty node per size (the
    first listed: empty nodes of one size are interchangeable); a multi-node trial takes the
    first listed empty nodes (interchangeable too). Branches that cannot beat the bound of
    ``_node_bound`` are cut.

    Returns:
        ``(nodes in use, {trial: node indices})``, or ``None`` if nothing beats ``bound``.
    """
    caps = st.prob.caps
    maxcap = st.prob.maxcap
    n = len(caps)
    order = sorted(items, key=lambda it: it.rank)
    count = len(order)
    used = [not st.empty(i) for i in range(n)]
    free = [0 if st.excl[i] else st.free[i] for i in range(n)]
    whole_after = [0] * (count + 1)
    small_after = [0] * (count + 1)
    for p in range(count - 1, -1, -1):
        it = order[p]
        whole_after[p] = whole_after[p + 1] + (math.ceil(it.size / maxcap) if it.big else 0)
        small_after[p] = small_after[p + 1] + (0 if it.big else it.size)
    choice: list[tuple[int, ...]] = [()] * count
    best: list = [bound, None]

    def rec(p: int, in_use: int, room: int) -> bool:
        budget.spend()
        if p == count:
            if in_use < best[0]:
                best[0], best[1] = in_use, list(choice)
            return first_only
        need = whole_after[p] + math.ceil(max(0, small_after[p] - room) / maxcap)
        if in_use + need >= best[0] or n - in_use < need:
            return False
        it = order[p]
        m = it.size
        if it.big:
            empties = sorted((i for i in range(n) if not used[i]), key=lambda i: (-caps[i], i))
            take, total = [], 0
            for i in empties:
                take.append(i)
                total += caps[i]
                if total >= m:
                    break
            if total < m:
                return False
            for i in take:
                used[i], free[i] = True, 0
            choice[p] = tuple(take)
            stop = rec(p + 1, in_use + len(take), room)
            for i in take:
                used[i], free[i] = False, caps[i]
            return stop
        options, seen = [], set()
        for i in range(n):
            if used[i] and free[i] >= m and (free[i], caps[i]) not in seen:
                seen.add((free[i], caps[i]))
                options.append((free[i], i))
        options.sort()
        seen.clear()
        for i in range(n):
            if not used[i] and caps[i] >= m and caps[i] not in seen:
                seen.add(caps[i])
                options.append((math.inf, i))
        for _, i in options:
            was_used = used[i]
            free[i] -= m
            used[i] = True
            choice[p] = (i,)
            if was_used:
                stop = rec(p + 1, in_use, room - m)
            else:
                stop = rec(p + 1, in_use + 1, room + caps[i] - m)
            free[i] += m
            used[i] = was_used
            if stop:
                return True
        return False

    rec(0, sum(used), sum(free[i] for i in range(n) if used[i]))
    if best[1] is None:
        return None
    return best[0], {it.trial: best[1][p] for p, it in enumerate(order)}


def materialize(prob: Problem, cand: Candidate) -> dict:
    """GPU slots per placed trial, as ``(node index, GPU index)`` tuples.

    Reserved and kept trials claim their former slots first; the others then take the lowest
    free GPU indices of their node (a multi-node trial fills its nodes in order).
    """
    caps = prob.caps
    st = cand.state
    taken: list[set[int]] = [set() for _ in caps]
    out: dict = {}
    for trial, slots in prob.fixed.items():
        out[trial] = tuple(slots)
    for trial in st.kept:
        out[trial] = tuple(prob.prev_slots[trial])
    for slots in out.values():
        for i, g in slots:
            taken[i].add(g)
    for it in prob.items:
        if it.trial not in st.where or it.trial in st.kept:
            continue
        nodes = st.where[it.trial]
        slots = []
        if it.big:
            left = it.size
            for i in nodes:
                g = min(caps[i], left)
                slots.extend((i, x) for x in range(g))
                left -= g
        else:
            i = nodes[0]
            x = 0
            while len(slots) < it.size:
                if x not in taken[i]:
                    slots.append((i, x))
                x += 1
        for i, g in slots:
            taken[i].add(g)
        out[it.trial] = tuple(slots)
    return out


def solve(prob: Problem) -> Candidate:
    """The best candidate the heuristics and, on small inputs, the exact search find."""
    items = prob.items
    if not prob.caps:
        return Candidate(State(prob), {it.trial for it in items})
    cands = [incremental(prob, items)]
    if cands[0].unplaced:
        cands.append(repack(prob, items))
        if cands[1].unplaced:
            # Over capacity (as far as best fit can tell): admit what repacking admitted and
            # see whether keeping the unchanged trials in place still holds all of it.
            cands.append(incremental(prob, [it for it in items if it.trial not in cands[1].unplaced]))
    best = min(cands, key=lambda c: score(prob, c))
    if len(items) <= EXACT_MAX_TRIALS and not proven_optimal(prob, best):
        found = exact(prob)
        if found is not None and score(prob, found) < score(prob, best):
            best = found
    return best
