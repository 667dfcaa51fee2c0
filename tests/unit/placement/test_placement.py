"""Placement policy: rules, stability, optimality against the exhaustive oracle, scale-down plans."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

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
from rubberband.testing import placement_oracle as oracle

NODE_SIZES = (1, 4, 8)
FAST = settings(max_examples=75, deadline=None)
SLOW = settings(max_examples=40, deadline=None)


# --- checks -------------------------------------------------------------------------------

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


def moved_unchanged(p: Placement, demands: dict, nodes: list, previous: Placement | None, reserved=()) -> int:
    stay = oracle.unchanged(demands, nodes, previous, reserved)
    return sum(1 for t in p.moves(previous) if t in stay)


# --- strategies ---------------------------------------------------------------------------

def demand_sizes(largest: int):
    """Mostly single-node trials, sometimes multi-node ones."""
    return st.one_of(st.integers(1, largest), st.integers(1, largest), st.integers(largest + 1, 3 * largest))


def awkward_sizes(largest: int):
    """Single-node sizes that do not divide each other: where best fit can miss a packing."""
    return st.integers(2, max(2, largest // 2 + 1)) if largest >= 4 else st.integers(1, largest)


def dividing_sizes(largest: int):
    """Sizes that divide each other and the node size (powers of two on 1/4/8-GPU nodes, as
    successive halving produces), single- and multi-node."""
    return st.sampled_from([m for m in (1, 2, 4, 8) if m <= largest] + [2 * largest, 3 * largest])


def any_sizes(largest: int):
    return st.one_of(demand_sizes(largest), awkward_sizes(largest))


@st.composite
def scenarios(draw, max_nodes: int = 12, max_trials: int = 24, hetero: bool = False,
              change_nodes: bool = True, with_reserved: bool = True, node_sizes=NODE_SIZES, sizes_for=any_sizes):
    """``(demands, nodes, previous, reserved)``: maybe a former placement, then new demands."""
    if hetero:
        caps = draw(st.lists(st.sampled_from(node_sizes), min_size=1, max_size=max_nodes))
    else:
        caps = [draw(st.sampled_from(node_sizes))] * draw(st.integers(1, max_nodes))
    nodes0 = [(f"n{i}", c) for i, c in enumerate(caps)]
    sizes = sizes_for(max(caps))
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


@st.composite
def stages(draw, max_nodes: int = 4, max_trials: int = 5):
    """What the executor asks for: every trial of a stage wants the same GPUs, the survivors
    of the previous stage (all of one size) keep or change theirs, and nodes come and go."""
    g = draw(st.sampled_from(NODE_SIZES))
    m0 = draw(st.integers(1, 2 * g))
    m1 = draw(st.sampled_from([m0, draw(st.integers(1, 2 * g))]))
    nodes0 = [(f"n{i}", g) for i in range(draw(st.integers(1, max_nodes)))]
    first = {f"t{i}": m0 for i in range(draw(st.integers(0, max_trials)))}
    if not draw(st.booleans()):
        return first, nodes0, None, ()
    previous = place(first, nodes0)
    demands = {t: m1 for t in first if draw(st.booleans())}
    cut = draw(st.integers(0, len(nodes0) - 1))
    nodes = nodes0[: len(nodes0) - cut] + [(f"x{i}", g) for i in range(draw(st.integers(0, 2)))]
    return demands, nodes, previous, ()


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


# --- against the exhaustive oracle on small inputs ----------------------------------------

def fresh(sizes_for):
    return st.sampled_from(NODE_SIZES).flatmap(
        lambda g: st.tuples(st.just(g), st.integers(1, 12), st.lists(sizes_for(g), max_size=8))
    )


@FAST
@given(fresh(dividing_sizes))
def test_fresh_placement_of_dividing_sizes_uses_fewest_nodes(case):
    g, n_nodes, sizes = case
    nodes = [(f"n{i}", g) for i in range(n_nodes)]
    demands = {f"t{i}": m for i, m in enumerate(sizes)}
    p = place(demands, nodes)
    check_valid(p, demands, nodes)
    best = oracle.fewest_nodes(sizes, g)
    if best > n_nodes:
        assert p.unplaced
    else:
        assert p.unplaced == ()
        # Fewest nodes, and the oldest ones: exactly the first `best` listed nodes.
        assert p.nodes_used() == {f"n{i}" for i in range(best)}


@FAST
@given(fresh(any_sizes))
def test_fresh_placement_of_any_sizes_stays_within_the_best_fit_bound(case):
    """Best fit decreasing needs at most 11/9 OPT + 6/9 nodes (Dósa, 2007) for the trials that
    share nodes; multi-node trials take exactly their whole nodes."""
    g, n_nodes, sizes = case
    nodes = [(f"n{i}", g) for i in range(n_nodes)]
    demands = {f"t{i}": m for i, m in enumerate(sizes)}
    p = place(demands, nodes)
    check_valid(p, demands, nodes)
    best = oracle.fewest_nodes(sizes, g)
    whole = sum(math.ceil(m / g) for m in sizes if m > g)
    bound = whole + (11 * (best - whole) + 6) // 9
    if p.unplaced:
        assert bound > n_nodes, f"unplaced {p.unplaced} although {best} nodes hold everything"
    else:
        assert len(p.nodes_used()) <= bound
        assert p.nodes_used() == {f"n{i}" for i in range(len(p.nodes_used()))}


def check_against_oracle(case) -> None:
    demands, nodes, previous, reserved = case
    p = place(demands, nodes, previous, reserved)
    check_valid(p, demands, nodes, previous, reserved)
    admitted = oracle.admitted(demands, nodes, previous, reserved)
    assert set(p.unplaced) == set(demands) - set(reserved) - set(admitted)
    moves, used = oracle.best(admitted, demands, nodes, previous, reserved)
    assert moved_unchanged(p, demands, nodes, previous, reserved) == moves
    assert len(p.nodes_used()) == used


@SLOW
@given(stages())
def test_stage_placements_match_the_oracle(case):
    """The executor's case, over capacity included: admission, moves and nodes are optimal."""
    check_against_oracle(case)


@SLOW
@given(st.one_of(scenarios(max_nodes=4, max_trials=5, sizes_for=dividing_sizes),
                 scenarios(max_nodes=3, max_trials=6, node_sizes=(8,), sizes_for=dividing_sizes)))
def test_dividing_sizes_match_the_oracle_when_everything_fits(case):
    demands, nodes, previous, reserved = case
    if len(oracle.admitted(demands, nodes, previous, reserved)) + len(reserved) < len(demands):
        assert place(demands, nodes, previous, reserved).unplaced
        return
    check_against_oracle(case)


@FAST
@given(st.integers(1, 64), st.lists(st.sampled_from((1, 2, 4, 8, 16, 32)), max_size=300))
def test_power_of_two_sizes_pack_perfectly_at_scale(n_nodes, sizes):
    """Sizes that divide each other: best fit decreasing is optimal at any scale (no oracle needed)."""
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


def test_best_fit_can_use_a_node_more_than_the_oracle_on_awkward_sizes():
    # Best fit decreasing pairs 4 with 3 and then needs a third node; 4+2+2 | 3+3+2 fits two.
    nodes = [("a", 8), ("b", 8), ("c", 8)]
    sizes = (4, 3, 3, 2, 2, 2)
    p = place(dict(zip("pqrstu", sizes)), nodes)
    assert p.unplaced == () and p.nodes_used() == {"a", "b", "c"}
    assert oracle.fewest_nodes(sizes, 8) == 2


def test_displacement_moves_fewest_trials_on_large_inputs():
    # 17 trials. a, b and c are full; d and e hold two trials each.
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

def check_plan(plan: ScaleDownPlan, before: Placement, nodes: list, target: int) -> None:
    ids = [n for n, _ in nodes]
    after = plan.placement
    assert plan.keep == tuple(ids[:target])                 # the oldest stay,
    assert plan.release == tuple(reversed(ids[target:]))    # the newest go, newest first
    assert after.nodes_used() <= set(plan.keep)
    assert set(after.trials()) == set(before.trials())
    assert after.unplaced == before.unplaced
    demands = {t: len(before.slots(t)) for t in before.trials()}
    check_valid(after, {**demands, **dict.fromkeys(after.unplaced, 1)}, nodes, before)
    assert plan.moved == after.moves(before)
    kept = set(plan.keep)
    stayed = [t for t in before.trials() if all(n in kept for n, _ in before.slots(t)) and t not in plan.moved]
    assert all(after.slots(t) == before.slots(t) for t in stayed)


def running(case) -> Placement:
    demands, nodes, previous, reserved = case
    return Placement(place(demands, nodes, previous, reserved).assignments)  # scale-down packs what runs


@SLOW
@given(st.one_of(stages(), scenarios(max_nodes=4, max_trials=5, change_nodes=False, sizes_for=dividing_sizes)),
       st.integers(0, 4))
def test_scale_down_moves_fewest_trials(case, target):
    nodes = case[1]
    before = running(case)
    target = min(target, len(nodes))
    expected = oracle.fewest_moves_to_shrink(before, nodes, target)
    if expected is None:
        with pytest.raises(InfeasiblePlacementError, match=f"cannot shrink to {target} nodes"):
            scale_down_plan(before, nodes, target)
        return
    plan = scale_down_plan(before, nodes, target)
    check_plan(plan, before, nodes, target)
    assert len(plan.moved) == expected


@SLOW
@given(scenarios(max_nodes=12, max_trials=40, change_nodes=False), st.integers(0, 12))
def test_scale_down_plans_are_valid(case, slack):
    nodes = case[1]
    before = running(case)
    packed = place({t: len(before.slots(t)) for t in before.trials()}, nodes)
    target = min(len(nodes), len(packed.nodes_used()) + slack % 3)
    plan = scale_down_plan(before, nodes, target)      # best fit packs it onto the oldest nodes
    check_plan(plan, before, nodes, target)


def test_scale_down_packs_scattered_trials_onto_the_oldest_nodes():
    nodes = [(f"n{i}", 4) for i in range(8)]
    before = Placement({t: ((f"n{t}", 0),) for t in range(8)})
    plan = scale_down_plan(before, nodes, 2)
    assert plan.keep == ("n0", "n1")
    assert plan.release == ("n7", "n6", "n5", "n4", "n3", "n2")
    assert sorted(plan.moved) == [2, 3, 4, 5, 6, 7]
    assert len(plan.placement.trials_on("n0")) == 4 and len(plan.placement.trials_on("n1")) == 4


def test_scale_down_releases_the_newest_nodes_and_moves_only_their_trials():
    nodes = [("old", 4), ("mid", 4), ("new", 4)]
    before = Placement({"a": (("old", 0),), "b": (("new", 0),), "c": (("new", 1),), "d": (("mid", 2),)})
    plan = scale_down_plan(before, nodes, 2)
    assert plan.release == ("new",) and plan.keep == ("old", "mid")
    assert sorted(plan.moved) == ["b", "c"]
    assert plan.placement.slots("a") == (("old", 0),) and plan.placement.slots("d") == (("mid", 2),)
    # Best fit: a node in use with the least room, ties to the one listed first (the oldest).
    assert {n for t in "bc" for n, _ in plan.placement.slots(t)} == {"old"}


def test_scale_down_to_current_size_is_a_no_op():
    nodes = [("a", 4), ("b", 4)]
    before = place({"x": 1}, nodes)
    plan = scale_down_plan(before, nodes, 2)
    assert plan == ScaleDownPlan(before, (), (), ("a", "b"))


def test_scale_down_below_what_the_trials_need_is_refused():
    nodes = [("a", 4), ("b", 4), ("c", 4)]
    before = place({"x": 4, "y": 3, "z": 1}, nodes)
    with pytest.raises(InfeasiblePlacementError, match="need at least 2 nodes"):
        scale_down_plan(before, nodes, 1)
    assert issubclass(InfeasiblePlacementError, ValueError)


def test_scale_down_rejects_bad_input():
    nodes = [("a", 4)]
    before = place({"x": 1}, nodes)
    with pytest.raises(SpecError, match="target_nodes"):
        scale_down_plan(before, nodes, -1)
    with pytest.raises(SpecError, match="does not list"):
        scale_down_plan(before, [("b", 4)], 1)


def test_the_oracle_counts_a_trial_on_a_released_node_as_moved():
    # Found by hypothesis: t2 sits alone on the newest node; shrinking to one node moves it.
    before = Placement({"t0": (("n0", 0),), "t1": (("n0", 1),), "t2": (("n1", 0),)})
    nodes = [("n0", 4), ("n1", 4)]
    assert oracle.fewest_moves_to_shrink(before, nodes, 1) == 1
    assert scale_down_plan(before, nodes, 1).moved == ("t2",)
