"""The placement policy: which node and GPUs each trial gets, and how to pack before releasing.

A pure function of its arguments (paper §4.4, Algorithm 3): ``place`` maps trials' GPU
demands onto the cluster's nodes, keeping each trial's workers together, leaving unchanged
trials where they are and using as few nodes as it can; ``scale_down_plan`` says which
trials to move, and where, so that the cluster can shrink to a target number of nodes.
Neither touches Ray or the cloud: the executor applies the returned values.

Rules (a node's size is its GPU count; ``G`` is the largest node size, and in the usual
homogeneous cluster every node's size):

- a trial wanting ``m <= G`` GPUs sits on one node;
- a trial wanting ``m > G`` GPUs takes whole nodes exclusively — ``ceil(m / G)`` of them when
  nodes are equal — and fills them in order (every node but the last is full);
- no ``(node, GPU index)`` slot is used twice, and reserved trials are never moved;
- larger trials are placed first and may displace smaller non-reserved ones; when not
  everything fits, a trial is left unplaced only if it cannot fit beside the higher-ranked
  trials placed (larger first; ties: unchanged trials first, then the order of ``demands``);
- then the fewest unchanged trials move, then the fewest nodes are used (nodes in use first,
  best fit; among empty nodes the ones listed first).

The node-level search lives in ``rubberband.placement._packing``. On small inputs (at most
``EXACT_MAX_TRIALS`` trials to place, within a search budget) it is exact: who is unplaced,
how many unchanged trials move and how many nodes are used all match an exhaustive search.
Beyond that it is best-fit decreasing with displacement (the paper's Algorithm 3), which on
a fresh placement is optimal, and places everything that fits, whenever the trial sizes
divide each other and the node size (powers of two on 1/2/4/8-GPU nodes, as successive
halving produces); with other size mixes it may use a node more than needed, or report a
trial unplaced that an exhaustive search could fit. On nodes of different sizes,
multi-node trials are placed heuristically even on small inputs.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from types import MappingProxyType
from typing import Any

from rubberband.errors import RubberbandError, SpecError
from rubberband.placement import _packing

#: One GPU: ``(node id, GPU index on that node)``.
Slot = tuple[Hashable, int]

#: ``scale_down_plan`` tries every choice of nodes to release when there are at most this
#: many choices (exact on small clusters), else a few greedy choices.
EXACT_RELEASE_CHOICES = 64


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
        owner: dict = {}
        clean: dict = {}
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

    def nodes_used(self) -> frozenset:
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


def _check_demands(demands: Mapping[Hashable, int]) -> dict:
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


# --- place --------------------------------------------------------------------------------
def place(
    demands: Mapping[Hashable, int],
    nodes: Sequence[tuple[Hashable, int]] | Mapping[Hashable, int],
    previous: Placement | None = None,
    reserved: Iterable[Hashable] = (),
) -> Placement:
    """Map each trial's GPU demand onto nodes and GPU slots (paper Algorithm 3).

    Priorities, in order: reserved trials stay exactly where they are; as many trials are
    placed as fit, larger ones first; the fewest unchanged trials move (a trial is unchanged
    when it wants as many GPUs as it holds in ``previous``); the fewest nodes are used,
    nodes already in use first, then empty nodes in the order listed. With the same
    ``demands``, ``nodes`` and ``previous`` nothing moves. Compacting a fragmented cluster
    (moving unchanged trials to free nodes) is ``scale_down_plan``'s job, not this one's.

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
    prob = _problem(dem, node_list, prev, reserved)
    cand = _packing.solve(prob)
    return _to_placement(prob, cand, dem, node_list)


def _problem(dem: dict, node_list: list, prev: Placement, reserved: Iterable[Hashable]) -> _packing.Problem:
    ids = [nid for nid, _ in node_list]
    caps = tuple(g for _, g in node_list)
    index = {nid: i for i, nid in enumerate(ids)}
    maxcap = max(caps, default=0)
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

    fixed: dict = {}
    fixed_excl = [False] * len(caps)
    hosted: set[int] = set()  # nodes hosting a reserved or an accepted unchanged trial
    for t in dem:
        if t not in res:
            continue
        slots = []
        for nid, g in prev.assignments[t]:
            if nid not in index or g >= caps[index[nid]]:
                raise SpecError(
                    f"reserved: trial {t!r} is reserved on slot ({nid!r}, {g}) but nodes has no such GPU; "
                    "pass the node it was reserved on, or drop the reservation"
                )
            slots.append((index[nid], g))
        fixed[t] = tuple(slots)
        spans = {i for i, _ in slots}
        hosted |= spans
        if dem[t] > maxcap:
            for i in spans:
                fixed_excl[i] = True

    # An unchanged trial may stay only if its former slots still exist and obey the rules.
    stays: dict = {}
    for t, m in dem.items():
        if t in res or t not in prev.assignments:
            continue
        nodes_of = _stay_nodes(prev.assignments[t], m, caps, index, maxcap)
        if nodes_of is not None:
            stays[t] = nodes_of
    order_of = {t: k for k, t in enumerate(dem)}
    ranked = sorted((t for t in dem if t not in res), key=lambda t: (-dem[t], t not in stays, order_of[t]))

    # Accept unchanged trials in rank order while they stay consistent with each other (a
    # hand-made `previous` might share a multi-node trial's node); the rest must move.
    whole: set[int] = {i for i, e in enumerate(fixed_excl) if e}
    items = []
    prev_slots = {}
    for rank, t in enumerate(ranked):
        m = dem[t]
        big = m > maxcap
        nodes_of = stays.get(t)
        if nodes_of is not None:
            if (big and any(i in hosted for i in nodes_of)) or (not big and nodes_of[0] in whole):
                nodes_of = None
            else:
                hosted |= set(nodes_of)
                if big:
                    whole |= set(nodes_of)
                prev_slots[t] = tuple((index[nid], g) for nid, g in prev.assignments[t])
        items.append(_packing.Item(t, m, rank, order_of[t], big, nodes_of))
    return _packing.Problem(caps, fixed, tuple(fixed_excl), tuple(items), prev_slots)


def _stay_nodes(slots: tuple[Slot, ...], m: int, caps: tuple[int, ...], index: dict, maxcap: int) -> tuple[int, ...] | None:
    """Node indices of an unchanged trial's former slots, or None if it cannot stay there."""
    if len(slots) != m:
        return None
    per_node: dict[int, int] = {}
    for nid, g in slots:
        i = index.get(nid)
        if i is None or g >= caps[i]:
            return None
        per_node[i] = per_node.get(i, 0) + 1
    if m <= maxcap:
        return tuple(per_node) if len(per_node) == 1 else None
    # Whole nodes: every node but at most one must be full, or it spans more than needed.
    if sum(1 for i, k in per_node.items() if k < caps[i]) > 1:
        return None
    return tuple(per_node)


def _to_placement(prob: _packing.Problem, cand: _packing.Candidate, dem: dict, node_list: list) -> Placement:
    ids = [nid for nid, _ in node_list]
    slots = _packing.materialize(prob, cand)
    assignments = {
        t: tuple((ids[i], g) for i, g in slots[t]) for t in dem if t in slots
    }
    return Placement(assignments, tuple(t for t in dem if t in cand.unplaced))


# --- scale down ---------------------------------------------------------------------------
def scale_down_plan(
    placement: Placement,
    nodes: Sequence[tuple[Hashable, int]] | Mapping[Hashable, int],
    target_nodes: int,
    reserved: Iterable[Hashable] = (),
) -> ScaleDownPlan:
    """Which trials to move, and where, so that only ``target_nodes`` nodes stay (pack first).

    Chooses the nodes to release so that the fewest trials move (empty nodes first, then the
    nodes whose trials are fewest and smallest; ties release the most recently listed), then
    re-places the displaced trials with ``place`` on the kept nodes. On small clusters every
    choice of nodes to release is tried (at most ``EXACT_RELEASE_CHOICES``), so the moves are
    the fewest possible; otherwise a few greedy choices are compared.

    Args:
        placement: the placement in force; its trials keep their GPU counts, and its
            ``unplaced`` trials stay unplaced.
        nodes: the cluster now, ``(node id, GPU count)`` pairs oldest first (or a mapping);
            it must include every node ``placement`` uses.
        target_nodes: how many nodes to keep. If it is not below ``len(nodes)`` nothing moves
            and nothing is released.
        reserved: trials that must not move; their nodes are kept.

    Returns:
        A ``ScaleDownPlan``: the new placement, the moved trials, and the nodes to release.

    Raises:
        SpecError: if ``target_nodes`` is not an integer >= 0, ``nodes`` is malformed or
            misses a node that ``placement`` uses, or a reserved trial is not placed.
        InfeasiblePlacementError: if the trials cannot fit on ``target_nodes`` nodes.
    """
    if not isinstance(placement, Placement):
        raise SpecError(f"placement: expected a Placement, got {type(placement).__name__}")
    node_list = _check_nodes(nodes)
    if isinstance(target_nodes, bool) or not isinstance(target_nodes, numbers.Integral) or target_nodes < 0:
        raise SpecError(f"target_nodes: expected an integer >= 0, got {target_nodes!r}")
    target_nodes = int(target_nodes)
    ids = [nid for nid, _ in node_list]
    known = set(ids)
    missing = [n for n in placement.nodes_used() if n not in known]
    if missing:
        raise SpecError(f"nodes: placement uses node {missing[0]!r}, which nodes does not list; pass every node in use")
    res = set(reserved)
    for t in res:
        if t not in placement.assignments:
            raise SpecError(f"reserved: trial {t!r} is not placed in placement; only a placed trial can be reserved")
    if len(node_list) <= target_nodes:
        return ScaleDownPlan(placement, (), (), tuple(ids))

    demands = {t: len(s) for t, s in placement.assignments.items()}
    pinned = {n for t in res for n, _ in placement.assignments[t]}
    drop = len(node_list) - target_nodes
    free_choice = [i for i, nid in enumerate(ids) if nid not in pinned]
    best = None
    for out in _release_choices(placement, node_list, free_choice, drop):
        kept = [node_list[i] for i in range(len(node_list)) if i not in out]
        p = place(demands, kept, placement, res)
        if p.unplaced:
            continue
        moved = p.moves(placement)
        # Among equally cheap choices release the most recently listed nodes.
        key = (len(moved), sum(demands[t] for t in moved), tuple(-i for i in sorted(out, reverse=True)))
        if best is None or key < best[0]:
            best = (key, out, p, moved)
    if best is None:
        raise InfeasiblePlacementError(_shrink_message(placement, demands, node_list, res, target_nodes))
    _, out, p, moved = best
    return ScaleDownPlan(
        placement=Placement(p.assignments, placement.unplaced),
        moved=moved,
        release=tuple(ids[i] for i in sorted(out, reverse=True)),
        keep=tuple(nid for i, nid in enumerate(ids) if i not in out),
    )


def _release_choices(placement: Placement, node_list: list, free_choice: list[int], drop: int) -> list[frozenset]:
    """Sets of node indices to release: all of them when few, else greedy picks."""
    if drop > len(free_choice):
        return []
    if math.comb(len(free_choice), drop) <= EXACT_RELEASE_CHOICES:
        return [frozenset(c) for c in combinations(free_choice, drop)]
    index = {nid: i for i, (nid, _) in enumerate(node_list)}
    on: list[set] = [set() for _ in node_list]
    gpus = [0] * len(node_list)
    for t, slots in placement.assignments.items():
        for nid, _ in slots:
            on[index[nid]].add(t)
            gpus[index[nid]] += 1
    choices = []
    # Greedy by marginal moves: a multi-node trial moved off one node moves off all of them.
    moving: set = set()
    out: list[int] = []
    pool = list(free_choice)
    for _ in range(drop):
        i = min(pool, key=lambda i: (len(on[i] - moving), gpus[i], -i))
        pool.remove(i)
        out.append(i)
        moving |= on[i]
    choices.append(frozenset(out))
    choices.append(frozenset(sorted(free_choice, key=lambda i: (gpus[i], len(on[i]), -i))[:drop]))
    choices.append(frozenset(sorted(free_choice, reverse=True)[:drop]))
    unique = []
    for c in choices:
        if c not in unique:
            unique.append(c)
    return unique


def _shrink_message(placement: Placement, demands: dict, node_list: list, res: set, target: int) -> str:
    gpus = sum(demands.values())
    anchor = Placement({t: placement.assignments[t] for t in res})
    packed = place(demands, node_list, anchor, res)
    need = len(packed.nodes_used())
    if need > target:
        return (
            f"cannot shrink to {target} nodes: the {len(demands)} placed trials ({gpus} GPUs) need at least "
            f"{need} of these nodes; keep at least {need} nodes or stop some trials first"
        )
    return (
        f"cannot shrink to {target} nodes: no packing of the {len(demands)} placed trials ({gpus} GPUs) "
        f"onto {target} nodes was found; keep more nodes or stop some trials first"
    )
