"""Placement policy: rules, stability, optimality against brute force, scale-down plans."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from itertools import combinations, product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.errors import SpecError
from rubberband.placement import (
    InfeasiblePlacementError,
    Placement,
    ScaleDownPlan,
    place,
    scale_down_plan,
)

NODE_SIZES = (1, 4, 8)
FAST = settings(max_examples=75, deadline=None)
SLOW = settings(max_examples=40, deadline=None)


# --- checks and brute-force oracles -------------------------------------------------------

def check_valid(p: Placement, demands: dict, nodes: list, previous: Placement | None = None, reserved=()) -> None:
    """Every rule a placement must obey, whatever the inputs."""
    caps = dict(nodes)
    largest = max(caps.values(), default=0)
    homogeneous = len(set(caps.values())) <= 1
    assert set(p.trials()) | set(p.unplaced) == set(demands)
    assert not set(p.trials()) & set(p.unplaced)
    seen = set()
    for t in p.trials():
        slots = p.slots(t)
        m = demands[t]
        assert len(slots) == m, (t, slots, m)
        for node, gpu in slots:
            assert node in caps and 0 <= gpu < caps[node], (t, node, gpu)
            assert (node, gpu) not in seen, f"slot {(node, gpu)} used twice"
            seen.add((node, gpu))
        if t in reserved:
            assert slots == previous.slots(t), f"reserved {t} moved"
            continue  # a reserved trial stays as it was, even if the cluster changed under it
        per_node = Counter(n for n, _ in slots)
        if m <= largest:
            assert len(per_node) == 1, f"{t} wants {m} <= {largest} GPUs but spans {dict(per_node)}"
        else:
            if homogeneous:
                assert len(per_node) == math.ceil(m / largest), (t, dict(per_node))
            order = list(dict.fromkeys(n for n, _ in slots))
            assert all(per_node[n] == caps[n] for n in order[:-1]), f"{t} does not fill its nodes in order"
            for n in per_node:
                assert p.trials_on(n) == (t,), f"{t} shares node {n} with {p.trials_on(n)}"


def unchanged(demands: dict, nodes: list, previous: Placement | None, reserved=()) -> dict:
    """Non-reserved trials that could stay put: trial -> frozenset of its former node ids."""
    if previous is None:
        return {}
    caps = dict(nodes)
    out = {}
    for t, m in demands.items():
        if t in reserved or t not in previous.assignments:
            continue
        slots = previous.slots(t)
        if len(slots) == m and all(n in caps and g < caps[n] for n, g in slots):
            out[t] = frozenset(n for n, _ in slots)
    return out


def brute_best(trials: list, demands: dict, nodes: list, previous: Placement | None, reserved=()):
    """Exhaustive optimum ``(moves of unchanged trials, nodes used)`` for placing ``trials``.

    Equal-sized nodes only; reserved trials stay at their former slots. ``None`` when no
    valid placement of ``trials`` exists.
    """
    if not nodes:
        return (0, 0) if not trials else None
    ids = [n for n, _ in nodes]
    g = nodes[0][1]
    free = dict(nodes)
    fixed_whole, used0 = set(), set()
    for t in reserved:
        for n, _ in previous.slots(t):
            free[n] -= 1
            used0.add(n)
            if demands[t] > g:
                fixed_whole.add(n)
    stay = unchanged(demands, nodes, previous, reserved)
    options = []
    for t in trials:
        m = demands[t]
        options.append([(n,) for n in ids] if m <= g else list(combinations(ids, math.ceil(m / g))))
    best = None
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
        if best is None or key < best:
            best = key
    return best


def brute_admitted(demands: dict, nodes: list, previous: Placement | None, reserved=()) -> list:
    """Trials admitted largest first (ties: unchanged first, then order) while a packing exists."""
    stay = unchanged(demands, nodes, previous, reserved)
    order = {t: k for k, t in enumerate(demands)}
    ranked = sorted((t for t in demands if t not in reserved), key=lambda t: (-demands[t], t not in stay, order[t]))
    if brute_best(ranked, demands, nodes, previous, reserved) is not None:
        return ranked
    admitted: list = []
    for t in ranked:
        if brute_best(admitted + [t], demands, nodes, previous, reserved) is not None:
            admitted.append(t)
    return admitted


def min_nodes_fresh(sizes: list[int], g: int, n_nodes: int) -> int | None:
    """Fewest nodes of ``g`` GPUs holding ``sizes`` (set-partition enumeration), or None."""
    whole = sum(math.ceil(m / g) for m in sizes if m > g)
    small = sorted((m for m in sizes if m <= g), reverse=True)
    best = [len(small)]

    def rec(k: int, bins: list[int]) -> None:
        if len(bins) >= best[0] and k < len(small):
            return
        if k == len(small):
            best[0] = min(best[0], len(bins))
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
    total = whole + best[0]
    return total if total <= n_nodes else None


def moved_unchanged(p: Placement, demands: dict, nodes: list, previous: Placement | None, reserved=()) -> int:
    stay = unchanged(demands, nodes, previous, reserved)
    return sum(1 for t in p.moves(previous) if t in stay)


# --- strategies ---------------------------------------------------------------------------

def demand_sizes(largest: int):
    """Mostly single-node trials, sometimes multi-node ones."""
    return st.one_of(st.integers(1, largest), st.integers(1, largest), st.integers(largest + 1, 3 * largest))


def awkward_sizes(largest: int):
    """Single-node sizes that do not divide each other: where best fit can miss a packing."""
    return st.integers(2, max(2, largest // 2 + 1)) if largest >= 4 else st.integers(1, largest)


@st.composite
def scenarios(draw, max_nodes: int = 12, max_trials: int = 24, hetero: bool = False,
              change_nodes: bool = True, with_reserved: bool = True, node_sizes=NODE_SIZES):
    """``(demands, nodes, previous, reserved)``: maybe a former placement, then new demands."""
    if hetero:
        caps = draw(st.lists(st.sampled_from(node_sizes), min_size=1, max_size=max_nodes))
    else:
        caps = [draw(st.sampled_from(node_sizes))] * draw(st.integers(1, max_nodes))
    nodes0 = [(f"n{i}", c) for i, c in enumerate(caps)]
    sizes = st.one_of(demand_sizes(max(caps)), awkward_sizes(max(caps)))
    d0 = {f"t{i}": m for i, m in enumerate(draw(st.lists(sizes, max_size=max_trials)))}
    if not draw(st.booleans()):
        return d0, nodes0, None, ()
    previous = place(d0, nodes0)
    demands = {}
    for t, m in d0.items():
        action = draw(st.sampled_from(["keep", "keep", "drop", "resize"]))
        if action == "keep":
            demands[t] = m
        elif action == "resize":
            demands[t] = draw(sizes)
    extra = draw(st.lists(sizes, max_size=max(1, max_trials // 4)))
    demands.update({f"new{i}": m for i, m in enumerate(extra)})
    nodes = nodes0
    if change_nodes and draw(st.booleans()):
        cut = draw(st.integers(0, len(nodes0) - 1))
        more = [draw(st.sampled_from(NODE_SIZES)) if hetero else caps[0] for _ in range(draw(st.integers(0, 3)))]
        nodes = nodes0[: len(nodes0) - cut] + [(f"x{i}", c) for i, c in enumerate(more)]
    reserved: tuple = ()
    if with_reserved:
        caps_now = dict(nodes)
        can = [
            t for t in previous.trials()
            if demands.get(t) == len(previous.slots(t))
            and all(n in caps_now and g < caps_now[n] for n, g in previous.slots(t))
        ]
        reserved = tuple(t for t in can if draw(st.integers(0, 3)) == 0)
    return demands, nodes, previous, reserved


# --- rules hold for any input -------------------------------------------------------------

@FAST
@given(scenarios())
def test_rules_hold_on_equal_nodes(case):
    demands, nodes, previous, reserved = case
    p = place(demands, nodes, previous, reserved)
    check_valid(p, demands, nodes, previous, reserved)
    capacity = sum(c for _, c in nodes)
    if sum(demands.values()) > capacity:
        assert p.unplaced, "demand exceeds every GPU, yet nothing is reported unplaced"


@FAST
@given(scenarios(hetero=True))
def test_rules_hold_on_mixed_nodes(case):
    demands, nodes, previous, reserved = case
    p = place(demands, nodes, previous, reserved)
    check_valid(p, demands, nodes, previous, reserved)
    if sum(demands.values()) > sum(c for _, c in nodes):
        assert p.unplaced


@FAST
@given(scenarios(max_trials=32))
def test_same_inputs_move_nothing(case):
    demands, nodes, previous, reserved = case
    first = place(demands, nodes, previous, reserved)
    again = place(demands, nodes, first, reserved)
    assert again.moves(first) == ()
    assert again == first


@FAST
@given(scenarios(max_trials=40, change_nodes=False), st.data())
def test_shrinking_demands_keep_unchanged_trials(case, data):
    """Drop trials and shrink others: room always exists, so no unchanged trial moves."""
    _, nodes, previous, _ = case
    if previous is None:
        return
    demands = {}
    for t in previous.trials():
        m = len(previous.slots(t))
        action = data.draw(st.sampled_from(["keep", "drop", "shrink"]))
        if action == "keep" or (action == "shrink" and m == 1):
            demands[t] = m
        elif action == "shrink":
            demands[t] = data.draw(st.integers(1, m - 1))
    p = place(demands, nodes, previous)
    check_valid(p, demands, nodes, previous)
    assert p.unplaced == ()
    assert moved_unchanged(p, demands, nodes, previous) == 0


# --- optimal against brute force on small inputs -----------------------------------------

@FAST
@given(
    st.sampled_from((1, 4, 8)).flatmap(
        lambda g: st.tuples(
            st.just(g),
            st.integers(1, 12),
            st.lists(st.one_of(demand_sizes(g), awkward_sizes(g), awkward_sizes(g)), max_size=8),
        )
    )
)
def test_fresh_placement_uses_fewest_nodes(case):
    g, n_nodes, sizes = case
    nodes = [(f"n{i}", g) for i in range(n_nodes)]
    demands = {f"t{i}": m for i, m in enumerate(sizes)}
    p = place(demands, nodes)
    check_valid(p, demands, nodes)
    best = min_nodes_fresh(sizes, g, n_nodes)
    if best is None:
        assert p.unplaced
    else:
        assert p.unplaced == ()
        assert len(p.nodes_used()) == best
        # Fewest nodes, and the oldest ones: exactly the first `best` listed nodes.
        assert p.nodes_used() == {f"n{i}" for i in range(best)}


@SLOW
@given(st.one_of(scenarios(max_nodes=4, max_trials=5), scenarios(max_nodes=3, max_trials=6, node_sizes=(8,))))
def test_admission_moves_and_nodes_match_brute_force(case):
    demands, nodes, previous, reserved = case
    p = place(demands, nodes, previous, reserved)
    check_valid(p, demands, nodes, previous, reserved)
    admitted = brute_admitted(demands, nodes, previous, reserved)
    assert set(p.unplaced) == set(demands) - set(reserved) - set(admitted)
    moves, used = brute_best(admitted, demands, nodes, previous, reserved)
    assert moved_unchanged(p, demands, nodes, previous, reserved) == moves
    assert len(p.nodes_used()) == used


@FAST
@given(st.integers(1, 64), st.lists(st.sampled_from((1, 2, 4, 8, 16, 32)), max_size=300))
def test_power_of_two_sizes_pack_perfectly_at_scale(n_nodes, sizes):
    """Sizes that divide each other: best fit decreasing is optimal, even past the exact search."""
    nodes = [(i, 8) for i in range(n_nodes)]
    demands = dict(enumerate(sizes))
    p = place(demands, nodes)
    check_valid(p, demands, nodes)
    need = sum(m // 8 for m in sizes if m > 8) + math.ceil(sum(m for m in sizes if m <= 8) / 8)
    if need <= n_nodes:
        assert p.unplaced == ()
        assert p.nodes_used() == set(range(need))
    else:
        assert p.unplaced


def test_exact_search_finds_packings_best_fit_misses():
    # Best fit decreasing pairs 4 with 3 and then needs a third node; 4+2+2 | 3+3+2 fits two.
    nodes = [("a", 8), ("b", 8), ("c", 8)]
    demands = dict(zip("pqrstu", (4, 3, 3, 2, 2, 2)))
    p = place(demands, nodes)
    assert p.unplaced == () and p.nodes_used() == {"a", "b"}
    # With only two nodes best fit would leave a trial out although everything fits.
    assert place(demands, nodes[:2]).unplaced == ()


def test_displacement_moves_fewest_trials_on_large_inputs():
    # 17 trials: past the exact search. a, b and c are full; d and e hold two trials each.
    nodes = [(n, 4) for n in "abcde"]
    before = Placement({
        **{f"{n}{g}": ((n, g),) for n in "abc" for g in range(4)},
        **{f"{n}{g}": ((n, g),) for n in "de" for g in range(2)},
    })
    demands = {**dict.fromkeys(before.trials(), 1), "big": 4}
    after = place(demands, nodes, before)
    check_valid(after, demands, nodes, before)
    assert after.unplaced == ()
    # Clearing d (two trials, re-placed on e) beats repacking from scratch onto node a.
    assert sorted(after.moves(before)) == ["d0", "d1"]
    assert after.trials_on("d") == ("big",)


# --- worked examples ----------------------------------------------------------------------

def test_sha_run_32_10_3_1_on_eight_4gpu_nodes():
    nodes = [(f"n{i}", 4) for i in range(8)]
    stage0 = place({t: 1 for t in range(32)}, nodes)
    assert stage0.nodes_used() == {n for n, _ in nodes}
    assert stage0.releasable(nodes) == ()
    assert stage0.moves(None) == ()

    survivors = list(range(0, 30, 3))  # spread over every node, as SHA promotions would be
    stage1 = place({t: 2 for t in survivors}, nodes, stage0)
    assert sorted(stage1.moves(stage0)) == survivors  # 1 -> 2 GPUs: every survivor restarts
    assert stage1.nodes_used() == {"n0", "n1", "n2", "n3", "n4"}
    assert stage1.releasable(nodes) == ("n7", "n6", "n5")  # newest first

    # The executor released n5..n7; placing again on what is left changes nothing.
    nodes = nodes[:5]
    assert place({t: 2 for t in survivors}, nodes, stage1).moves(stage1) == ()

    stage2 = place({0: 4, 9: 4, 21: 4}, nodes, stage1)
    assert sorted(stage2.moves(stage1)) == [0, 9, 21]
    assert stage2.nodes_used() == {"n0", "n1", "n2"}
    assert stage2.releasable(nodes) == ("n4", "n3")
    for t in (0, 9, 21):
        assert len({n for n, _ in stage2.slots(t)}) == 1

    nodes = nodes[:3]
    stage3 = place({9: 8}, nodes, stage2)
    assert stage3.moves(stage2) == (9,)
    assert stage3.slots(9) == tuple((n, g) for n in ("n0", "n1") for g in range(4))
    assert stage3.releasable(nodes) == ("n2",)


def test_unchanged_trials_stay_while_a_resized_one_moves():
    nodes = [("a", 4), ("b", 4)]
    before = place({"x": 2, "y": 1, "z": 1}, nodes)
    after = place({"x": 2, "y": 1, "z": 2}, nodes, before)
    assert after.moves(before) == ("z",)
    assert after.slots("x") == before.slots("x") and after.slots("y") == before.slots("y")


def test_new_trials_are_starts_not_moves():
    nodes = [("a", 4)]
    before = place({"x": 1}, nodes)
    after = place({"x": 1, "new": 2}, nodes, before)
    assert after.moves(before) == ()
    assert len(after.slots("new")) == 2


def test_larger_trial_displaces_a_smaller_one():
    nodes = [("a", 4), ("b", 4)]
    before = Placement({"x": (("a", 0),), "y": (("b", 3),)})
    after = place({"x": 1, "y": 1, "big": 4}, nodes, before)
    assert after.unplaced == ()
    assert len(after.moves(before)) == 1  # one small trial makes way, the other stays


def test_reserved_trials_are_never_displaced():
    nodes = [("a", 4), ("b", 4)]
    before = Placement({"x": (("a", 0),), "y": (("b", 3),)})
    after = place({"x": 1, "y": 1, "big": 4}, nodes, before, reserved=("x", "y"))
    assert after.unplaced == ("big",)
    assert after.moves(before) == ()


def test_over_capacity_places_larger_trials_first():
    nodes = [("a", 4)]
    before = place({t: 1 for t in "pqrs"}, nodes)
    after = place({**{t: 1 for t in "pqrs"}, "big": 4}, nodes, before)
    assert after.trials() == ("big",)
    assert after.unplaced == tuple("pqrs")


def test_multi_node_trial_takes_whole_nodes_and_leaves_the_rest_idle():
    nodes = [(i, 4) for i in range(4)]
    p = place({"wide": 6, "small": 3}, nodes)
    assert p.slots("wide") == ((0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1))
    assert p.trials_on(1) == ("wide",)  # GPUs 2 and 3 of node 1 stay idle: no sharing
    assert p.slots("small") == ((2, 0), (2, 1), (2, 2))


def test_new_trials_fill_nodes_in_use_before_empty_ones():
    nodes = [("a", 4), ("b", 4), ("c", 4)]
    before = Placement({"x": (("b", 0), ("b", 1))})
    after = place({"x": 2, "y": 2}, nodes, before)
    assert after.slots("y") == (("b", 2), ("b", 3))
    assert after.releasable(nodes) == ("c", "a")


def test_no_nodes_leaves_everything_unplaced():
    p = place({"x": 1, "y": 9}, [])
    assert p.trials() == () and p.unplaced == ("x", "y")


# --- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_non_positive_or_non_integer_demand_is_rejected(bad):
    with pytest.raises(SpecError, match=r"demands\['t'\]"):
        place({"t": bad}, [("a", 4)])


@pytest.mark.parametrize(
    ("nodes", "match"),
    [
        ([("a", 4), ("a", 4)], "listed twice"),
        ([("a", 0)], "positive integer"),
        ([("a",)], "pairs"),
        (["ab"], "pairs"),
    ],
)
def test_bad_nodes_are_rejected(nodes, match):
    with pytest.raises(SpecError, match=match):
        place({"t": 1}, nodes)


def test_bad_reservations_are_rejected():
    nodes = [("a", 4), ("b", 4)]
    prev = Placement({"x": (("b", 0),)})
    with pytest.raises(SpecError, match="no slots in previous"):
        place({"x": 1, "y": 1}, nodes, prev, reserved=("y",))
    with pytest.raises(SpecError, match="not in demands"):
        place({"y": 1}, nodes, prev, reserved=("x",))
    with pytest.raises(SpecError, match="cannot be resized"):
        place({"x": 2}, nodes, prev, reserved=("x",))
    with pytest.raises(SpecError, match="no such GPU"):
        place({"x": 1}, [("a", 4)], prev, reserved=("x",))


def test_previous_must_be_a_placement():
    with pytest.raises(SpecError, match="previous"):
        place({"x": 1}, [("a", 4)], {"x": (("a", 0),)})


# --- the Placement value ------------------------------------------------------------------

def test_placement_is_an_immutable_value():
    p = Placement({"x": [("a", 0), ("a", 1)]}, ("y",))
    assert p.slots("x") == (("a", 0), ("a", 1))
    assert p.slots("y") == ()
    with pytest.raises(KeyError):
        p.slots("z")
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.unplaced = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.assignments["z"] = (("a", 2),)  # type: ignore[index]
    assert p == Placement({"x": (("a", 0), ("a", 1))}, ("y",))
    assert hash(p) == hash(Placement({"x": (("a", 0), ("a", 1))}, ("y",)))
    assert Placement.from_dict(p.to_dict()) == p
    assert p.to_dict() == {"assignments": {"x": [["a", 0], ["a", 1]]}, "unplaced": ["y"]}


@pytest.mark.parametrize(
    ("assignments", "unplaced", "match"),
    [
        ({"x": (("a", 0),), "y": (("a", 0),)}, (), "used|given to both"),
        ({"x": ()}, (), "at least one slot"),
        ({"x": (("a", -1),)}, (), "GPU index"),
        ({"x": ("a",)}, (), "pair"),
        ({"x": (("a", 0),)}, ("x",), "either placed or unplaced"),
    ],
)
def test_malformed_placements_are_rejected(assignments, unplaced, match):
    with pytest.raises(SpecError, match=match):
        Placement(assignments, unplaced)


def test_moves_ignore_new_and_stopped_trials_and_slot_order():
    old = Placement({"a": (("n", 0), ("n", 1)), "gone": (("n", 2),)})
    new = Placement({"a": (("n", 1), ("n", 0)), "fresh": (("n", 2),)})
    assert new.moves(old) == ()
    assert Placement({"a": (("n", 2), ("n", 3))}).moves(old) == ("a",)


# --- scale-down plans ---------------------------------------------------------------------

def check_plan(plan: ScaleDownPlan, before: Placement, nodes: list, target: int, reserved=()) -> None:
    ids = [n for n, _ in nodes]
    after = plan.placement
    assert set(plan.release) | set(plan.keep) == set(ids)
    assert not set(plan.release) & set(plan.keep)
    assert len(plan.keep) == min(target, len(ids))
    assert after.nodes_used() <= set(plan.keep)
    assert not after.nodes_used() & set(plan.release)
    assert set(after.trials()) == set(before.trials())
    assert after.unplaced == before.unplaced
    demands = {t: len(before.slots(t)) for t in before.trials()}
    check_valid(after, {**demands, **dict.fromkeys(after.unplaced, 1)}, nodes, before, reserved)
    assert plan.moved == after.moves(before)
    for t in reserved:
        assert t not in plan.moved


def brute_scale_down(before: Placement, nodes: list, target: int, reserved=()):
    """Fewest moves to fit every placed trial on ``target`` of ``nodes`` (or None)."""
    demands = {t: len(before.slots(t)) for t in before.trials()}
    best = None
    for keep in combinations(nodes, target):
        kept_ids = {n for n, _ in keep}
        if any(n not in kept_ids for t in reserved for n, _ in before.slots(t)):
            continue
        got = brute_best([t for t in demands if t not in reserved], demands, list(keep), before, reserved)
        if got is not None and (best is None or got[0] < best):
            best = got[0]
    return best


@SLOW
@given(scenarios(max_nodes=4, max_trials=5, change_nodes=False), st.integers(0, 4))
def test_scale_down_moves_fewest_trials(case, target):
    demands, nodes, previous, reserved = case
    before = place(demands, nodes, previous, reserved)
    before = Placement(before.assignments)  # scale-down packs what runs
    target = min(target, len(nodes))
    expected = brute_scale_down(before, nodes, target, reserved)
    if expected is None:
        with pytest.raises(InfeasiblePlacementError, match="cannot shrink"):
            scale_down_plan(before, nodes, target, reserved)
        return
    plan = scale_down_plan(before, nodes, target, reserved)
    check_plan(plan, before, nodes, target, reserved)
    assert len(plan.moved) == expected


@SLOW
@given(scenarios(max_nodes=12, max_trials=40, change_nodes=False), st.integers(0, 12))
def test_scale_down_plans_are_valid(case, slack):
    demands, nodes, previous, reserved = case
    before = place(demands, nodes, previous, reserved)
    anchor = Placement({t: before.slots(t) for t in reserved})
    packed = place({t: len(before.slots(t)) for t in before.trials()}, nodes, anchor, reserved)
    target = min(len(nodes), len(packed.nodes_used()) + slack % 3)
    plan = scale_down_plan(before, nodes, target, reserved)
    check_plan(plan, before, nodes, target, reserved)


def test_scale_down_packs_scattered_trials_onto_the_oldest_nodes():
    nodes = [(f"n{i}", 4) for i in range(8)]
    before = Placement({t: ((f"n{t}", 0),) for t in range(8)})
    plan = scale_down_plan(before, nodes, 2)
    assert plan.keep == ("n0", "n1")
    assert plan.release == ("n7", "n6", "n5", "n4", "n3", "n2")
    assert sorted(plan.moved) == [2, 3, 4, 5, 6, 7]
    assert len(plan.placement.trials_on("n0")) == 4 and len(plan.placement.trials_on("n1")) == 4


def test_scale_down_keeps_the_fullest_nodes():
    nodes = [("old", 4), ("mid", 4), ("new", 4)]
    before = Placement({"a": (("old", 0),), "b": (("new", 0),), "c": (("new", 1),), "d": (("new", 2),)})
    plan = scale_down_plan(before, nodes, 2)
    assert plan.moved == () and plan.release == ("mid",)
    plan = scale_down_plan(before, nodes, 1)
    assert plan.moved == ("a",) and plan.keep == ("new",)


def test_scale_down_to_current_size_is_a_no_op():
    nodes = [("a", 4), ("b", 4)]
    before = place({"x": 1}, nodes)
    plan = scale_down_plan(before, nodes, 2)
    assert plan == ScaleDownPlan(before, (), (), ("a", "b"))


def test_scale_down_below_what_the_trials_need_is_refused():
    nodes = [("a", 4), ("b", 4), ("c", 4)]
    before = place({"x": 4, "y": 3, "z": 1}, nodes)
    with pytest.raises(InfeasiblePlacementError, match="need at least 2"):
        scale_down_plan(before, nodes, 1)
    assert issubclass(InfeasiblePlacementError, ValueError)


def test_scale_down_rejects_bad_input():
    nodes = [("a", 4)]
    before = place({"x": 1}, nodes)
    with pytest.raises(SpecError, match="target_nodes"):
        scale_down_plan(before, nodes, -1)
    with pytest.raises(SpecError, match="does not list"):
        scale_down_plan(before, [("b", 4)], 1)
    with pytest.raises(SpecError, match="not placed"):
        scale_down_plan(before, nodes, 0, reserved=("nope",))
