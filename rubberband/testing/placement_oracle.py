"""Exhaustive placement search: the reference the placement policy's property tests compare with.

Too slow for a run (it enumerates every assignment of trials to nodes), exact on the small
inputs of a property test. Equal-sized nodes only; the rules are those of
``rubberband.placement``: a trial of ``m <= G`` GPUs on one node, a larger one on
``ceil(m / G)`` whole nodes, reserved trials on their former slots.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from itertools import combinations, product

from rubberband.placement import Placement


def unchanged(demands: dict, nodes: Sequence[tuple[Hashable, int]], previous: Placement | None,
              reserved: Iterable[Hashable] = ()) -> dict:
    """Non-reserved trials that could stay put: trial -> frozenset of its former node ids."""
    if previous is None:
        return {}
    caps = dict(nodes)
    reserved = set(reserved)
    out = {}
    for t, m in demands.items():
        if t in reserved or t not in previous.assignments:
            continue
        slots = previous.slots(t)
        if len(slots) == m and all(n in caps and g < caps[n] for n, g in slots):
            out[t] = frozenset(n for n, _ in slots)
    return out


def best(trials: Sequence[Hashable], demands: dict, nodes: Sequence[tuple[Hashable, int]],
         previous: Placement | None, reserved: Iterable[Hashable] = ()) -> tuple[int, int] | None:
    """Fewest ``(moves of unchanged trials, nodes used)`` placing ``trials``, or ``None`` if
    they do not fit. Reserved trials (not in ``trials``) stay on their former slots."""
    if not nodes:
        return (0, 0) if not trials else None
    ids = [n for n, _ in nodes]
    g = nodes[0][1]
    free = dict(nodes)
    fixed_whole, used0 = set(), set()
    for t in reserved:
        for n, _ in (previous or Placement()).slots(t):
            free[n] -= 1
            used0.add(n)
            if demands[t] > g:
                fixed_whole.add(n)
    stay = unchanged(demands, nodes, previous, reserved)
    options = [[(n,) for n in ids] if demands[t] <= g else list(combinations(ids, math.ceil(demands[t] / g)))
               for t in trials]
    found = None
    for combo in product(*options):
        load: Counter = Counter()
        whole = set(fixed_whole)
        ok = True
        for t, where in zip(trials, combo):
            if demands[t] > g:
                if any(n in whole or load[n] or free[n] < g for n in where):
                    ok = False
                    break
                whole.update(where)
            else:
                n = where[0]
                load[n] += demands[t]
                if n in whole or load[n] > free[n]:
                    ok = False
                    break
        if not ok:
            continue
        moves = sum(1 for t, where in zip(trials, combo) if t in stay and frozenset(where) != stay[t])
        key = (moves, len(used0 | {n for where in combo for n in where}))
        if found is None or key < found:
            found = key
    return found


def admitted(demands: dict, nodes: Sequence[tuple[Hashable, int]], previous: Placement | None,
             reserved: Iterable[Hashable] = ()) -> list:
    """Trials admitted largest first (ties: unchanged first, then order) while a packing exists."""
    reserved = tuple(reserved)
    stay = unchanged(demands, nodes, previous, reserved)
    order = {t: k for k, t in enumerate(demands)}
    ranked = sorted((t for t in demands if t not in reserved), key=lambda t: (-demands[t], t not in stay, order[t]))
    if best(ranked, demands, nodes, previous, reserved) is not None:
        return ranked
    out: list = []
    for t in ranked:
        if best(out + [t], demands, nodes, previous, reserved) is not None:
            out.append(t)
    return out


def fewest_nodes(sizes: Sequence[int], g: int) -> int:
    """Fewest nodes of ``g`` GPUs that hold trials of ``sizes`` (set-partition enumeration)."""
    whole = sum(math.ceil(m / g) for m in sizes if m > g)
    small = sorted((m for m in sizes if m <= g), reverse=True)
    least = [len(small)]

    def rec(k: int, bins: list[int]) -> None:
        if len(bins) >= least[0] and k < len(small):
            return
        if k == len(small):
            least[0] = min(least[0], len(bins))
            return
        for b in range(len(bins)):
            if bins[b] + small[k] <= g:
                bins[b] += small[k]
                rec(k + 1, bins)
                bins[b] -= small[k]
        bins.append(small[k])
        rec(k + 1, bins)
        bins.pop()

    rec(0, [])
    return whole + least[0]


def fewest_moves_to_shrink(before: Placement, nodes: Sequence[tuple[Hashable, int]], target: int) -> int | None:
    """Fewest moves that fit every placed trial on the ``target`` oldest nodes, or ``None``."""
    demands = {t: len(before.slots(t)) for t in before.trials()}
    found = best(list(demands), demands, list(nodes[:target]), before)
    if found is None:
        return None
    # ``best`` counts moves among the kept nodes; every trial on a released node moves too.
    gone = {n for n, _ in nodes[target:]}
    return found[0] + sum(1 for t in demands if any(n in gone for n, _ in before.slots(t)))
