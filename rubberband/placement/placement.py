"""The placement policy: which node and GPUs each trial gets, and how to pack before releasing.

A pure function of its arguments (paper §4.4, Algorithm 3): ``place`` maps trials' GPU
demands onto the cluster's nodes and ``scale_down_plan`` packs the trials onto the oldest
nodes so that the newest can be released (DESIGN §4: scale-down releases the most recently
launched instances first). Neither touches Ray or the cloud: the executor applies the
returned values.

The policy is best-fit decreasing with displacement. A node's size is its GPU count and
``G`` the largest node size (in the usual homogeneous cluster, every node's size):

- a trial wanting ``m <= G`` GPUs sits on one node; one wanting ``m > G`` takes whole nodes
  (the fewest, largest first) and fills them in order, leaving the last one's spare GPUs idle;
- reserved trials never move, and a trial that wants as many GPUs as it holds in
  ``previous`` (an *unchanged* trial) stays on its slots when they still exist;
- every other trial is placed largest first (ties: the order of ``demands``) on the node in
  use with the least room that fits it, else on the first listed (oldest) empty node;
- a trial that finds no room evicts strictly smaller, non-reserved trials from the node(s)
  where that moves the fewest unchanged trials, and the evicted trials are placed again.

When every trial of a stage wants the same GPU count (what the executor asks for), or the
sizes divide each other and the node size (powers of two on 1/2/4/8-GPU nodes), this uses
the fewest nodes and moves the fewest trials; with other size mixes it may use a node more
than an exhaustive search would (``rubberband.testing.placement_oracle`` is that search, the
property tests' reference).
"""

from __future__ import annotations

import heapq
import numbers
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rubberband.errors import RubberbandError, SpecError

#: One GPU: ``(node id, GPU index on that node)``.
Slot = tuple[Hashable, int]


class InfeasiblePlacementError(RubberbandError, ValueError):
    """The trials cannot be packed onto the nodes asked for (e.g. a too small scale-down)."""


# --- values -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """Which GPU slots each trial holds: an immutable mapping trial id -> slots.

    Attributes:
        assignments: trial id -> tuple of ``(node id, GPU index)`` slots. A read-only view.
        unplaced: trials that were asked for but could not be placed (demand exceeded
            capacity), in the order they were asked for.

    Raises:
        SpecError: if a slot is malformed or used twice, a trial has no slots, or a trial is
            both placed and unplaced.
    """

    assignments: Mapping[Hashable, tuple[Slot, ...]] = field(default_factory=dict)
    unplaced: tuple[Hashable, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.assignments, Mapping):
            raise SpecError(f"assignments: expected a mapping trial -> slots, got {type(self.assignments).__name__}")
        owner: dict[Slot, Hashable] = {}
        clean: dict[Hashable, tuple[Slot, ...]] = {}
        for trial, slots in self.assignments.items():
            if isinstance(slots, (str, bytes)) or not isinstance(slots, Iterable):
                raise SpecError(f"assignments[{trial!r}]: expected a sequence of (node, gpu) slots, got {slots!r}")
            tup = tuple(_slot(trial, s) for s in slots)
            if not tup:
                raise SpecError(f"assignments[{trial!r}]: a placed trial needs at least one slot; list it in unplaced instead")
            for s in tup:
                if s in owner:
                    raise SpecError(f"slot {s!r} is given to both {owner[s]!r} and {trial!r}; a GPU runs one trial")
                owner[s] = trial
            clean[trial] = tup
        unplaced = tuple(self.unplaced)
        if len(set(unplaced)) != len(unplaced):
            raise SpecError(f"unplaced: lists a trial twice: {list(unplaced)!r}")
        both = [t for t in unplaced if t in clean]
        if both:
            raise SpecError(f"unplaced: {both[0]!r} also has slots; a trial is either placed or unplaced")
        object.__setattr__(self, "assignments", MappingProxyType(clean))
        object.__setattr__(self, "unplaced", unplaced)

    def __hash__(self) -> int:
        return hash((frozenset(self.assignments.items()), self.unplaced))

    def slots(self, trial: Hashable) -> tuple[Slot, ...]:
        """The slots of ``trial``; ``()`` if it is unplaced.

        Raises:
            KeyError: if ``trial`` is neither placed nor unplaced here.
        """
        if trial in self.assignments:
            return self.assignments[trial]
        if trial in self.unplaced:
            return ()
        raise KeyError(f"trial {trial!r} is not in this placement")

    def trials(self) -> tuple[Hashable, ...]:
        """The placed trials, in order."""
        return tuple(self.assignments)

    def nodes_used(self) -> frozenset[Hashable]:
        """Ids of the nodes hosting at least one trial."""
        return frozenset(node for slots in self.assignments.values() for node, _ in slots)

    def trials_on(self, node: Hashable) -> tuple[Hashable, ...]:
        """The trials with at least one slot on ``node``, in order."""
        return tuple(t for t, slots in self.assignments.items() if any(n == node for n, _ in slots))

    def releasable(self, nodes: Sequence[tuple[Hashable, int]] | Mapping[Hashable, int]) -> tuple[Hashable, ...]:
        """Ids of the given nodes that host no trial, listed last first.

        Args:
            nodes: the cluster, as given to ``place``: ``(node id, GPUs)`` pairs oldest first
                (or a mapping node id -> GPUs).

        Returns:
            The empty nodes' ids, most recently launched (listed last) first — the order to
            release them in.
        """
        used = self.nodes_used()
        return tuple(nid for nid, _ in reversed(_check_nodes(nodes)) if nid not in used)

    def moves(self, previous: Placement | None) -> tuple[Hashable, ...]:
        """Trials placed both here and in ``previous`` whose slots differ.

        New trials (placed here, not in ``previous``) are starts, not moves; trials placed in
        ``previous`` but not here (finished, or now unplaced) are stops. Slot order does not
        matter. A trial whose GPU count changed always moves: resizing restarts it.

        Args:
            previous: the former placement (``None`` means nothing moves).

        Returns:
            The moved trials, in this placement's order.
        """
        if previous is None:
            return ()
        old = previous.assignments
        return tuple(
            t for t, slots in self.assignments.items() if t in old and set(old[t]) != set(slots)
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data: ``{"assignments": {trial: [[node, gpu], ...]}, "unplaced": [...]}``.

        Trial and node ids keep their Python types (JSON turns integer keys into strings).
        """
        return {
            "assignments": {t: [[n, g] for n, g in slots] for t, slots in self.assignments.items()},
            "unplaced": list(self.unplaced),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Placement:
        """Inverse of ``to_dict``.

        Raises:
            SpecError: on unknown keys or malformed slots.
        """
        if not isinstance(data, Mapping):
            raise SpecError(f"placement: expected a mapping, got {type(data).__name__}")
        unknown = set(data) - {"assignments", "unplaced"}
        if unknown:
            raise SpecError(f"placement: unknown key(s) {sorted(map(str, unknown))}; allowed: assignments, unplaced")
        return cls(dict(data.get("assignments", {})), tuple(data.get("unplaced", ())))


@dataclass(frozen=True)
class ScaleDownPlan:
    """How to pack trials so that the cluster can shrink.

    Attributes:
        placement: the placement after the moves; it uses only nodes in ``keep``.
        moved: trials whose slots change (checkpoint, then restart on their new slots).
        release: ids of the nodes to release once the moves are done, listed last first.
        keep: ids of the nodes kept, in the order they were listed.
    """

    placement: Placement
    moved: tuple[Hashable, ...]
    release: tuple[Hashable, ...]
    keep: tuple[Hashable, ...]


# --- validation ---------------------------------------------------------------------------
def _slot(trial: Hashable, s: object) -> Slot:
    if isinstance(s, (str, bytes)) or not isinstance(s, Sequence) or len(s) != 2:
        raise SpecError(f"assignments[{trial!r}]: slot {s!r} is not a (node id, GPU index) pair")
    node, gpu = s
    if isinstance(gpu, bool) or not isinstance(gpu, numbers.Integral) or gpu < 0:
        raise SpecError(f"assignments[{trial!r}]: GPU index {gpu!r} must be an integer >= 0")
    _hashable(node, "node id")
    return (node, int(gpu))


def _hashable(value: object, what: str) -> None:
    try:
        hash(value)
    except TypeError:
        raise SpecError(f"{what} {value!r} is not hashable; use a str or int") from None


def _count(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise SpecError(f"{where}: expected a positive integer number of GPUs, got {value!r}")
    return int(value)


def _check_demands(demands: Mapping[Hashable, int]) -> dict[Hashable, int]:
    if not isinstance(demands, Mapping):
        raise SpecError(f"demands: expected a mapping trial id -> GPUs, got {type(demands).__name__}")
    return {t: _count(m, f"demands[{t!r}]") for t, m in demands.items()}


def _check_nodes(nodes: Sequence[tuple[Hashable, int]] | Mapping[Hashable, int]) -> list[tuple[Hashable, int]]:
    pairs = list(nodes.items()) if isinstance(nodes, Mapping) else list(nodes)
    out, seen = [], set()
    for pair in pairs:
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise SpecError(f"nodes: expected (node id, GPU count) pairs, got {pair!r}")
        nid, gpus = pair
        _hashable(nid, "node id")
        if nid in seen:
            raise SpecError(f"nodes: node id {nid!r} is listed twice; node ids must be unique")
        seen.add(nid)
        out.append((nid, _count(gpus, f"nodes[{nid!r}]")))
    return out


def _check_previous(previous: Placement | None) -> Placement:
    if previous is None:
        return Placement()
    if not isinstance(previous, Placement):
        raise SpecError(f"previous: expected a Placement or None, got {type(previous).__name__}")
    return previous



def _check_reserved(reserved: Iterable[Hashable], dem: dict[Hashable, int], prev: Placement) -> set[Hashable]:
    res = set()
    for t in reserved:
        _hashable(t, "reserved trial")
        if t not in dem:
            raise SpecError(f"reserved: trial {t!r} is not in demands; a reserved trial must still be wanted")
        if t not in prev.assignments:
            raise SpecError(f"reserved: trial {t!r} has no slots in previous; only a placed trial can be reserved")
        if len(prev.assignments[t]) != dem[t]:
            raise SpecError(
                f"reserved: trial {t!r} holds {len(prev.assignments[t])} GPUs in previous but wants {dem[t]}; "
                "a reserved trial cannot be resized — confirm or cancel the reservation first"
            )
        res.add(t)
    return res


# --- place --------------------------------------------------------------------------------
def place(
    demands: Mapping[Hashable, int],
    nodes: Sequence[tuple[Hashable, int]] | Mapping[Hashable, int],
    previous: Placement | None = None,
    reserved: Iterable[Hashable] = (),
) -> Placement:
    """Map each trial's GPU demand onto nodes and GPU slots (paper Algorithm 3).

    Reserved trials stay exactly where they are, unchanged trials (same GPU count as in
    ``previous``) stay on their slots, and the others are placed best-fit decreasing,
    displacing smaller trials when a larger one finds no room (see the module docstring).
    With the same ``demands``, ``nodes`` and ``previous`` nothing moves. Packing a scattered
    cluster onto fewer nodes is ``scale_down_plan``'s job, not this one's.

    Args:
        demands: trial id -> GPUs wanted (an integer >= 1).
        nodes: the cluster as ``(node id, GPU count)`` pairs, oldest first (or a mapping).
        previous: the placement currently in force, if any; trials in it but not in
            ``demands`` are gone and free their slots.
        reserved: trials whose slots in ``previous`` are reserved but not yet confirmed;
            they keep those slots and are never displaced.

    Returns:
        A new ``Placement``; ``unplaced`` lists the trials that could not be placed.

    Raises:
        SpecError: on a non-positive or non-integer demand, malformed or duplicate nodes, a
            ``previous`` that is not a Placement, or a reserved trial that is not in
            ``demands``, not placed in ``previous``, holds a different GPU count than it now
            wants, or sits on a GPU that ``nodes`` does not have.
    """
    dem = _check_demands(demands)
    node_list = _check_nodes(nodes)
    prev = _check_previous(previous)
    res = _check_reserved(reserved, dem, prev)
    return _Packer(node_list, dem, prev, res).run()


class _Packer:
    """One run of best-fit decreasing with displacement; nodes are indices into the caller's list."""

    def __init__(self, node_list: list[tuple[Hashable, int]], dem: dict[Hashable, int], prev: Placement,
                 res: set[Hashable]):
        self.ids = [nid for nid, _ in node_list]
        self.caps = [g for _, g in node_list]
        self.index = {nid: i for i, nid in enumerate(self.ids)}
        self.largest = max(self.caps, default=0)
        self.dem, self.prev, self.res = dem, prev, res
        self.on: list[dict[Hashable, int]] = [{} for _ in self.caps]   # trial -> GPUs it holds on the node
        self.free = list(self.caps)
        self.whole = [False] * len(self.caps)          # held by a multi-node trial: no one else fits
        self.open: set[int] = set()                     # nodes in use with room left (best fit looks here)
        self.where: dict[Hashable, tuple[int, ...]] = {}  # trial -> node indices, in fill order
        self.exact: dict[Hashable, tuple[Slot, ...]] = {}  # trial -> its slots in previous, when it keeps them
        self.home: dict[Hashable, tuple[int, ...] | None] = {}  # unchanged trial -> the nodes it may stay on

    def big(self, t: Hashable) -> bool:
        return self.dem[t] > self.largest

    # --- state ----------------------------------------------------------------------------
    def _refresh(self, i: int) -> None:
        self.whole[i] = any(self.big(t) for t in self.on[i])
        self.free[i] = 0 if self.whole[i] else self.caps[i] - sum(self.on[i].values())
        if self.on[i] and self.free[i]:
            self.open.add(i)
        else:
            self.open.discard(i)

    def _put(self, t: Hashable, nodes: tuple[int, ...]) -> None:
        left = self.dem[t]
        for i in nodes:
            g = min(self.caps[i], left)
            left -= g
            self.on[i][t] = g
            self._refresh(i)
        self.where[t] = nodes
        if (home := self.home.get(t)) is not None and set(home) == set(nodes):
            self.exact[t] = self.prev.assignments[t]

    def _hold(self, t: Hashable, slots: tuple[Slot, ...]) -> None:
        """Put ``t`` back on exactly ``slots`` (node ids), which are known to exist."""
        nodes = tuple(dict.fromkeys(self.index[nid] for nid, _ in slots))
        for i in nodes:
            self.on[i][t] = sum(1 for nid, _ in slots if self.index[nid] == i)
            self._refresh(i)
        self.where[t] = nodes
        self.exact[t] = slots

    def _remove(self, t: Hashable) -> None:
        for i in self.where.pop(t):
            del self.on[i][t]
            self._refresh(i)
        self.exact.pop(t, None)

    # --- the policy -----------------------------------------------------------------------
    def _home(self, t: Hashable) -> tuple[int, ...] | None:
        """The nodes an unchanged trial may stay on: its former slots exist and obey the rules."""
        slots = self.prev.assignments.get(t, ())
        if len(slots) != self.dem[t]:
            return None
        per_node: dict[int, int] = {}
        for nid, g in slots:
            i = self.index.get(nid)
            if i is None or g >= self.caps[i]:
                return None
            per_node[i] = per_node.get(i, 0) + 1
        if not self.big(t):
            return tuple(per_node) if len(per_node) == 1 else None
        # Whole nodes: all but at most one full, or it spans more nodes than it needs.
        return tuple(per_node) if sum(k < self.caps[i] for i, k in per_node.items()) <= 1 else None

    def _fits_home(self, t: Hashable, nodes: tuple[int, ...]) -> bool:
        """Whether ``t`` can stay on ``nodes`` beside what is placed (a hand-made ``previous``
        may have let a multi-node trial share a node)."""
        if self.big(t):
            return all(not self.on[i] for i in nodes)
        return not self.whole[nodes[0]]

    def _find(self, m: int) -> tuple[int, ...] | None:
        """Best fit: the node in use with the least room that holds ``m`` GPUs (ties: listed
        first), else the first listed empty node; a multi-node trial takes the fewest empty
        nodes, largest first."""
        n = len(self.caps)
        if m > self.largest:
            take, total = [], 0
            for i in sorted((i for i in range(n) if not self.on[i]), key=lambda i: (-self.caps[i], i)):
                take.append(i)
                total += self.caps[i]
                if total >= m:
                    return tuple(take)
            return None
        fits = [(self.free[i], i) for i in self.open if self.free[i] >= m]
        if fits:
            return (min(fits)[1],)
        return next(((i,) for i in range(n) if not self.on[i] and self.caps[i] >= m), None)

    def _make_room(self, t: Hashable, kept: set[Hashable], rank: dict[Hashable, int]
                   ) -> tuple[tuple[int, ...], list[Hashable]] | None:
        """Node(s) for ``t`` once strictly smaller, non-reserved trials are evicted there,
        choosing the node(s) that evict the fewest unchanged (kept) trials, then the fewest
        trials and GPUs; ``None`` when no node can be cleared."""
        m = self.dem[t]

        def cost(victims: Iterable[Hashable]) -> tuple[int, int, int]:
            victims = list(victims)
            return sum(v in kept for v in victims), len(victims), sum(self.dem[v] for v in victims)

        def evictable(v: Hashable) -> bool:
            return v not in self.res and self.dem[v] < m

        if m > self.largest:
            # A multi-node victim frees all its nodes: charge each of them its share.
            def share(i: int) -> tuple[float, float, int]:
                span = {v: len(self.where[v]) for v in self.on[i]}
                return (sum(1 / span[v] for v in span if v in kept), sum(1 / k for k in span.values()),
                        sum(self.on[i].values()))

            clear = sorted(
                (share(i), -self.caps[i], i) for i in range(len(self.caps))
                if all(evictable(v) for v in self.on[i])
            )
            take, total = [], 0
            for _, _, i in clear:
                take.append(i)
                total += self.caps[i]
                if total >= m:
                    return tuple(take), list(dict.fromkeys(v for i in take for v in self.on[i]))
            return None
        best = None
        for i, cap in enumerate(self.caps):
            if cap < m or self.whole[i]:
                continue
            room, victims = self.free[i], []
            # Evict trials that already moved before unchanged ones, then larger ones (fewer
            # victims), then the ones placed last.
            for v in sorted(filter(evictable, self.on[i]), key=lambda v: (v in kept, -self.dem[v], -rank[v])):
                if room >= m:
                    break
                victims.append(v)
                room += self.dem[v]
            if room >= m and (best is None or (cost(victims), i) < best[0]):
                best = ((cost(victims), i), (i,), victims)
        return None if best is None else (best[1], best[2])

    def run(self) -> Placement:
        for t in self.dem:
            if t in self.res:
                for nid, g in self.prev.assignments[t]:
                    if nid not in self.index or g >= self.caps[self.index[nid]]:
                        raise SpecError(
                            f"reserved: trial {t!r} is reserved on slot ({nid!r}, {g}) but nodes has no such GPU; "
                            "pass the node it was reserved on, or drop the reservation"
                        )
                self._hold(t, self.prev.assignments[t])
        self.home = {t: self._home(t) for t in self.dem if t not in self.res and t in self.prev.assignments}
        order = {t: k for k, t in enumerate(self.dem)}
        ranked = sorted((t for t in self.dem if t not in self.res),
                        key=lambda t: (-self.dem[t], self.home.get(t) is None, order[t]))
        rank = {t: r for r, t in enumerate(ranked)}
        kept, queue = set(), []
        for t in ranked:      # unchanged trials first stay where they are, larger ones first
            nodes = self.home.get(t)
            if nodes is not None and self._fits_home(t, nodes):
                self._hold(t, self.prev.assignments[t])
                kept.add(t)
            else:
                queue.append(rank[t])
        # Largest first. Evicted trials are strictly smaller than their evictor, so sizes come
        # out of the queue in non-increasing order: a size that found no room (even by
        # eviction) cannot find any later, and a trial placed from the queue is never evicted.
        heapq.heapify(queue)
        failed: set[int] = set()
        unplaced = set()
        while queue:
            t = ranked[heapq.heappop(queue)]
            nodes = None if self.dem[t] in failed else self._find(self.dem[t])
            if nodes is None and self.dem[t] not in failed and (made := self._make_room(t, kept, rank)):
                nodes, victims = made
                for v in victims:
                    self._remove(v)
                    kept.discard(v)
                    heapq.heappush(queue, rank[v])
            if nodes is None:
                failed.add(self.dem[t])
                unplaced.add(t)
            else:
                self._put(t, nodes)
        return Placement(self._slots(), tuple(t for t in self.dem if t in unplaced))

    def _slots(self) -> dict[Hashable, tuple[Slot, ...]]:
        """GPU indices: trials keeping their former slots claim them first; the others take the
        lowest free GPUs of their nodes (a multi-node trial fills its nodes in order)."""
        taken: list[set[int]] = [set() for _ in self.caps]
        for held in self.exact.values():
            for nid, g in held:
                taken[self.index[nid]].add(g)
        out = {}
        for t in self.dem:
            if t in self.exact:
                out[t] = self.exact[t]
            elif t in self.where:
                slots: list[Slot] = []
                for i in self.where[t]:
                    free = (g for g in range(self.caps[i]) if g not in taken[i])
                    mine = [next(free) for _ in range(self.on[i][t])]
                    taken[i].update(mine)
                    slots.extend((self.ids[i], g) for g in mine)
                out[t] = tuple(slots)
        return out


# --- scale down ---------------------------------------------------------------------------
def scale_down_plan(
    placement: Placement,
    nodes: Sequence[tuple[Hashable, int]] | Mapping[Hashable, int],
    target_nodes: int,
) -> ScaleDownPlan:
    """Pack the placed trials onto the ``target_nodes`` oldest nodes so the newest can go.

    The nodes listed last (launched most recently) are released, as DESIGN §4's cost model
    assumes. The trials on them move to the kept nodes with ``place`` (best fit, largest
    first), and trials already on kept nodes stay unless a moving trial must evict them.

    Args:
        placement: the placement in force; its trials keep their GPU counts, and its
            ``unplaced`` trials stay unplaced.
        nodes: the cluster now, ``(node id, GPU count)`` pairs oldest first (or a mapping);
            it must include every node ``placement`` uses.
        target_nodes: how many nodes to keep. If it is not below ``len(nodes)`` nothing moves
            and nothing is released.

    Returns:
        A ``ScaleDownPlan``: the new placement, the moved trials, and the nodes to release.

    Raises:
        SpecError: if ``target_nodes`` is not an integer >= 0, or ``nodes`` is malformed or
            misses a node that ``placement`` uses.
        InfeasiblePlacementError: if the trials do not fit on the ``target_nodes`` oldest nodes.
    """
    if not isinstance(placement, Placement):
        raise SpecError(f"placement: expected a Placement, got {type(placement).__name__}")
    node_list = _check_nodes(nodes)
    if isinstance(target_nodes, bool) or not isinstance(target_nodes, numbers.Integral) or target_nodes < 0:
        raise SpecError(f"target_nodes: expected an integer >= 0, got {target_nodes!r}")
    ids = [nid for nid, _ in node_list]
    missing = [n for n in placement.nodes_used() if n not in set(ids)]
    if missing:
        raise SpecError(f"nodes: placement uses node {missing[0]!r}, which nodes does not list; pass every node in use")
    keep = node_list[:target_nodes]
    demands = {t: len(s) for t, s in placement.assignments.items()}
    packed = place(demands, keep, placement)
    if packed.unplaced:     # the trials that stay fragment the kept nodes: pack them all afresh
        packed = place(demands, keep)
    if packed.unplaced:
        fresh = place(demands, node_list)
        need = f"at least {len(fresh.nodes_used())}" if not fresh.unplaced else "more than these"
        raise InfeasiblePlacementError(
            f"cannot shrink to {target_nodes} nodes: the {len(demands)} placed trials ({sum(demands.values())} GPUs) "
            f"do not fit on the oldest {target_nodes} and need {need} nodes; keep more nodes or stop some trials first"
        )
    return ScaleDownPlan(
        placement=Placement(packed.assignments, placement.unplaced),
        moved=packed.moves(placement),
        release=tuple(reversed(ids[len(keep):])),
        keep=tuple(ids[: len(keep)]),
    )
