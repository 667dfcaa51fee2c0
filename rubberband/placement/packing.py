"""Fractional placement: several 1-GPU trials on one GPU, by Worst-Fit-Decreasing (HyperSack).

A packed trial wants ``1/k`` of one GPU's compute (it was profiled with ``k`` trials per GPU),
its peak GPU memory, and some of its node's vCPUs (data loading). ``place_packed`` maps such
demands onto the GPUs of the nodes a stage holds so that on every GPU the compute shares add
up to at most 1 and the memory to at most the GPU's, and on every node the vCPUs to at most
the node's — HyperSack's three constraints. It is pure, like ``place`` (the whole-GPU policy
beside it), and the executor applies what it returns.

The policy, Worst-Fit-Decreasing:

- an *unchanged* trial (in ``previous`` with the same demand, its GPU still there) keeps its
  GPU while everything there still fits (taken in ``previous``'s order);
- the others go largest compute share first; among equal shares the leanest first (the
  smaller dominant share of memory over the largest GPU memory and vCPUs over the largest
  node's vCPUs per GPU: more of them fit), then in the order of ``demands``. Each goes onto
  the GPU that fits it and has the most room in its *tightest*
  dimension (compute left, memory left over the GPU's, its node's vCPUs left over the node's),
  ties to the oldest node's lowest GPU. Worst fit spreads trials over the GPUs a stage pays
  for, so no GPU runs more trials than it must (less contention), and it leaves room in every
  dimension for the trials still to come;
- a trial that fits nowhere is ``unplaced``.

Compute shares are counted exactly, in units of ``1 / lcm(k)`` of a GPU.
``rubberband.testing.packing_oracle`` is the exact search its occupancy is measured against.
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from rubberband.errors import SpecError
from rubberband.placement.placement import Slot, _hashable, _slot

_EPS = 1e-9   # memory and vCPUs are sums of floats


@dataclass(frozen=True)
class PackedDemand:
    """What one 1-GPU trial needs when packed: ``1/trials_per_gpu`` of a GPU's compute, its
    peak GPU memory and the vCPUs of its data loading (0: not limited by that dimension)."""

    trials_per_gpu: int = 1
    gpu_memory_gb: float = 0.0
    vcpus: float = 0.0

    def __post_init__(self) -> None:
        k = self.trials_per_gpu
        if isinstance(k, bool) or not isinstance(k, numbers.Real) or k != int(k) or k < 1:
            raise SpecError(f"trials_per_gpu: expected a whole number of trials per GPU of at least 1, got {k!r}")
        object.__setattr__(self, "trials_per_gpu", int(k))
        for name in ("gpu_memory_gb", "vcpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
                raise SpecError(f"{name}: expected a number of at least 0, got {value!r}")
            object.__setattr__(self, name, float(value))

    def to_dict(self) -> dict[str, Any]:
        return {"trials_per_gpu": self.trials_per_gpu, "gpu_memory_gb": self.gpu_memory_gb, "vcpus": self.vcpus}


@dataclass(frozen=True)
class GpuNode:
    """One instance as the packing sees it: ``gpus`` GPUs of ``gpu_memory_gb`` each and
    ``vcpus`` shared by all its trials (``None``: not limited)."""

    id: Hashable
    gpus: int
    gpu_memory_gb: float | None = None
    vcpus: float | None = None

    def __post_init__(self) -> None:
        _hashable(self.id, "node id")
        g = self.gpus
        if isinstance(g, bool) or not isinstance(g, numbers.Integral) or g < 1:
            raise SpecError(f"nodes[{self.id!r}].gpus: expected a positive integer number of GPUs, got {g!r}")
        for name in ("gpu_memory_gb", "vcpus"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)
                                      or not 0 < value < math.inf):
                raise SpecError(f"nodes[{self.id!r}].{name}: expected a number greater than 0 (or None), got {value!r}")


@dataclass(frozen=True)
class PackedPlacement:
    """Which GPU each packed trial sits on.

    Attributes:
        assignments: trial id -> its one ``(node id, GPU index)`` slot (a GPU may hold several
            trials). A read-only view.
        demands: trial id -> ``PackedDemand``, for every placed and unplaced trial.
        unplaced: trials that fit nowhere, in the order they were asked for.

    Raises:
        SpecError: on a malformed slot, a trial without a demand, or a trial both placed and unplaced.
    """

    assignments: Mapping[Hashable, Slot] = field(default_factory=dict)
    demands: Mapping[Hashable, PackedDemand] = field(default_factory=dict)
    unplaced: tuple[Hashable, ...] = ()

    def __post_init__(self) -> None:
        slots = {t: _slot(t, s) for t, s in dict(self.assignments).items()}
        unplaced = tuple(self.unplaced)
        demands = dict(self.demands)
        for t in (*slots, *unplaced):
            if not isinstance(demands.get(t), PackedDemand):
                raise SpecError(f"demands[{t!r}]: every placed or unplaced trial needs a PackedDemand")
        both = [t for t in unplaced if t in slots]
        if both or len(set(unplaced)) != len(unplaced):
            raise SpecError(f"unplaced: {(both or list(unplaced))[0]!r} is listed twice or also placed")
        object.__setattr__(self, "assignments", MappingProxyType(slots))
        object.__setattr__(self, "demands", MappingProxyType({t: demands[t] for t in (*slots, *unplaced)}))
        object.__setattr__(self, "unplaced", unplaced)

    def __hash__(self) -> int:
        return hash((frozenset(self.assignments.items()), self.unplaced))

    def trials(self) -> tuple[Hashable, ...]:
        """The placed trials, in order."""
        return tuple(self.assignments)

    def trials_on(self, slot: Slot) -> tuple[Hashable, ...]:
        """The trials sharing one GPU, in order."""
        return tuple(t for t, s in self.assignments.items() if s == tuple(slot))

    def gpus_used(self) -> frozenset[Slot]:
        """The ``(node, GPU)`` slots running at least one trial."""
        return frozenset(self.assignments.values())

    def nodes_used(self) -> frozenset[Hashable]:
        return frozenset(node for node, _ in self.assignments.values())

    def compute_placed(self) -> float:
        """GPUs' worth of compute the placed trials take (the sum of their ``1/k``)."""
        return sum(1 / self.demands[t].trials_per_gpu for t in self.assignments)

    def moves(self, previous: PackedPlacement | None) -> tuple[Hashable, ...]:
        """Trials placed here and in ``previous`` on another GPU (starts and stops are not moves)."""
        if previous is None:
            return ()
        old = previous.assignments
        return tuple(t for t, s in self.assignments.items() if t in old and old[t] != s)

    def to_dict(self) -> dict[str, Any]:
        return {"assignments": {t: list(s) for t, s in self.assignments.items()},
                "demands": {t: d.to_dict() for t, d in self.demands.items()},
                "unplaced": list(self.unplaced)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PackedPlacement:
        """Inverse of ``to_dict``.

        Raises:
            SpecError: on unknown keys, malformed slots or demands.
        """
        if not isinstance(data, Mapping) or set(data) - {"assignments", "demands", "unplaced"}:
            raise SpecError("packed placement: expected a mapping with keys assignments, demands, unplaced")
        demands = {}
        for t, d in dict(data.get("demands", {})).items():
            if not isinstance(d, Mapping) or set(d) - {"trials_per_gpu", "gpu_memory_gb", "vcpus"}:
                raise SpecError(f"demands[{t!r}]: expected {{trials_per_gpu, gpu_memory_gb, vcpus}}, got {d!r}")
            demands[t] = PackedDemand(**d)
        return cls(dict(data.get("assignments", {})), demands, tuple(data.get("unplaced", ())))


# --- place --------------------------------------------------------------------------------
def place_packed(
    demands: Mapping[Hashable, PackedDemand | int],
    nodes: Sequence[GpuNode | tuple[Any, ...]],
    previous: PackedPlacement | None = None,
) -> PackedPlacement:
    """Place packed 1-GPU trials on GPUs by Worst-Fit-Decreasing (see the module docstring).

    Args:
        demands: trial id -> ``PackedDemand`` (or just ``k``, trials per GPU, with no memory
            or vCPU needs).
        nodes: the stage's instances, oldest first: ``GpuNode`` values or
            ``(id, gpus[, gpu_memory_gb[, vcpus]])`` tuples.
        previous: the packed placement in force; unchanged trials keep their GPU.

    Returns:
        A new ``PackedPlacement``: no GPU over its compute or memory, no node over its vCPUs.

    Raises:
        SpecError: on a malformed demand or node, duplicate node ids, or a ``previous`` that
            is not a ``PackedPlacement``.
    """
    dem = _check_demands(demands)
    node_list = _check_nodes(nodes)
    if previous is not None and not isinstance(previous, PackedPlacement):
        raise SpecError(f"previous: expected a PackedPlacement or None, got {type(previous).__name__}")
    return _WorstFit(node_list, dem).run(previous)


def _check_demands(demands: Mapping[Hashable, PackedDemand | int]) -> dict[Hashable, PackedDemand]:
    if not isinstance(demands, Mapping):
        raise SpecError(f"demands: expected a mapping trial id -> PackedDemand, got {type(demands).__name__}")
    out = {}
    for t, d in demands.items():
        _hashable(t, "trial id")
        if isinstance(d, PackedDemand):
            out[t] = d
            continue
        try:
            out[t] = PackedDemand(d)
        except SpecError as exc:
            raise SpecError(f"demands[{t!r}].{exc}") from None
    return out


def _check_nodes(nodes: Sequence[GpuNode | tuple[Any, ...]]) -> list[GpuNode]:
    out, seen = [], set()
    for n in nodes:
        if not isinstance(n, GpuNode):
            if isinstance(n, (str, bytes)) or not isinstance(n, Sequence) or not 2 <= len(n) <= 4:
                raise SpecError(f"nodes: expected GpuNode or (id, gpus[, gpu_memory_gb[, vcpus]]), got {n!r}")
            n = GpuNode(*n)
        if n.id in seen:
            raise SpecError(f"nodes: node id {n.id!r} is listed twice; node ids must be unique")
        seen.add(n.id)
        out.append(n)
    return out


class _WorstFit:
    """One run of Worst-Fit-Decreasing; GPUs are ``(node index, GPU index)``."""

    def __init__(self, nodes: list[GpuNode], dem: dict[Hashable, PackedDemand]):
        self.nodes, self.dem = nodes, dem
        self.unit = math.lcm(*(d.trials_per_gpu for d in dem.values())) if dem else 1
        self.index = {n.id: i for i, n in enumerate(nodes)}
        self.mem_cap = [n.gpu_memory_gb if n.gpu_memory_gb is not None else math.inf for n in nodes]
        self.cpu_cap = [n.vcpus if n.vcpus is not None else math.inf for n in nodes]
        self.compute = [[self.unit] * n.gpus for n in nodes]           # free units per GPU
        self.mem = [[self.mem_cap[i]] * n.gpus for i, n in enumerate(nodes)]
        self.cpu = list(self.cpu_cap)
        self.where: dict[Hashable, tuple[int, int]] = {}

    def _need(self, t: Hashable) -> int:
        return self.unit // self.dem[t].trials_per_gpu

    def _fits(self, t: Hashable, i: int, g: int) -> bool:
        d = self.dem[t]
        return (self.compute[i][g] >= self._need(t) and self.mem[i][g] + _EPS >= d.gpu_memory_gb
                and self.cpu[i] + _EPS >= d.vcpus)

    def _put(self, t: Hashable, i: int, g: int) -> None:
        d = self.dem[t]
        self.compute[i][g] -= self._need(t)
        self.mem[i][g] -= d.gpu_memory_gb
        self.cpu[i] -= d.vcpus
        self.where[t] = (i, g)

    def _room(self, i: int, g: int) -> float:
        """The GPU's tightest dimension, as a fraction of its capacity (unlimited ones count 1)."""
        room = self.compute[i][g] / self.unit
        if self.mem_cap[i] < math.inf:
            room = min(room, self.mem[i][g] / self.mem_cap[i])
        if self.cpu_cap[i] < math.inf:
            room = min(room, self.cpu[i] / self.cpu_cap[i])
        return room

    def run(self, previous: PackedPlacement | None) -> PackedPlacement:
        stay = []
        if previous is not None:
            for t, (nid, g) in previous.assignments.items():
                i = self.index.get(nid)
                if (t in self.dem and previous.demands[t] == self.dem[t] and i is not None
                        and g < self.nodes[i].gpus and self._fits(t, i, g)):
                    self._put(t, i, g)
                    stay.append(t)
        big_mem = max((m for m in self.mem_cap if m < math.inf), default=math.inf)
        big_cpu = max((c / n.gpus for c, n in zip(self.cpu_cap, self.nodes) if c < math.inf), default=math.inf)
        order = {t: r for r, t in enumerate(self.dem)}

        def size(t: Hashable) -> tuple[float, float, int]:
            d = self.dem[t]
            share = 1 / d.trials_per_gpu
            return (-share, max(share, d.gpu_memory_gb / big_mem, d.vcpus / big_cpu), order[t])

        # A max-heap of GPUs by room. Placing on a node lowers its other GPUs' room (shared
        # vCPUs) without touching their entries: an entry is re-checked when it comes up and
        # pushed back with its true room if that is lower (room only ever falls).
        heap = [(-self._room(i, g), i, g) for i, n in enumerate(self.nodes) for g in range(n.gpus)]
        heapq.heapify(heap)
        # Demands that fit nowhere: room only falls, so neither they nor any demand at least as
        # large in every dimension ever will.
        failed: list[PackedDemand] = []
        unplaced = set()
        for t in sorted((t for t in self.dem if t not in self.where), key=size):
            d = self.dem[t]
            if any(f.trials_per_gpu >= d.trials_per_gpu and f.gpu_memory_gb <= d.gpu_memory_gb and f.vcpus <= d.vcpus
                   for f in failed):
                unplaced.add(t)
                continue
            passed = []
            while heap:
                neg, i, g = heapq.heappop(heap)
                room = self._room(i, g)
                if room < -neg - _EPS:
                    heapq.heappush(heap, (-room, i, g))
                    continue
                if self._fits(t, i, g):
                    self._put(t, i, g)
                    heapq.heappush(heap, (-self._room(i, g), i, g))
                    break
                passed.append((neg, i, g))
            else:
                failed.append(d)
                unplaced.add(t)
            for entry in passed:
                heapq.heappush(heap, entry)
        slots = {t: (self.nodes[i].id, g) for t in self.dem if t in self.where for i, g in [self.where[t]]}
        return PackedPlacement(slots, self.dem, tuple(t for t in self.dem if t in unplaced))


def check_packed(p: PackedPlacement, nodes: Iterable[GpuNode | tuple[Any, ...]]) -> list[str]:
    """What ``p`` breaks on ``nodes``: GPUs over compute or memory, nodes over vCPUs, slots
    that do not exist. Empty when every constraint holds (the property tests' check)."""
    node_list = _check_nodes(list(nodes))
    by_id = {n.id: n for n in node_list}
    share: dict[Slot, float] = {}
    mem: dict[Slot, float] = {}
    cpu: dict[Hashable, float] = {}
    errors = []
    for t, (nid, g) in p.assignments.items():
        n = by_id.get(nid)
        if n is None or not 0 <= g < n.gpus:
            errors.append(f"{t!r} sits on {(nid, g)!r}, which the nodes do not have")
            continue
        d = p.demands[t]
        share[(nid, g)] = share.get((nid, g), 0) + 1 / d.trials_per_gpu
        mem[(nid, g)] = mem.get((nid, g), 0.0) + d.gpu_memory_gb
        cpu[nid] = cpu.get(nid, 0.0) + d.vcpus
    for s, v in share.items():
        if v > 1 + _EPS:
            errors.append(f"GPU {s!r} runs {v:.3f} GPUs of compute")
        cap = by_id[s[0]].gpu_memory_gb
        if cap is not None and mem[s] > cap + 1e-6:
            errors.append(f"GPU {s!r} holds {mem[s]:.2f} GB of {cap:g} GB")
    for nid, v in cpu.items():
        cap = by_id[nid].vcpus
        if cap is not None and v > cap + 1e-6:
            errors.append(f"node {nid!r} runs {v:g} of {cap:g} vCPUs")
    return errors
