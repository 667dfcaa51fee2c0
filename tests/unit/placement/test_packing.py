"""Packed placement: capacity in every dimension, co-location, stability, occupancy against the exact search."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rubberband.errors import SpecError
from rubberband.placement import GpuNode, PackedDemand, PackedPlacement, check_packed, place_packed
from rubberband.testing.packing_oracle import hypersack_case, most_packed

FAST = settings(max_examples=80, deadline=None)


# --- strategies ---------------------------------------------------------------------------

@st.composite
def clusters(draw, max_nodes: int = 6):
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    mem = draw(st.sampled_from([None, 16.0, 40.0]))
    vcpus = draw(st.sampled_from([None, 4 * gpus, 12 * gpus]))
    return [GpuNode(f"n{i}", gpus, mem, vcpus) for i in range(draw(st.integers(1, max_nodes)))]


def demands_for(nodes, max_trials: int = 40):
    mem = nodes[0].gpu_memory_gb or 40.0
    one = st.builds(PackedDemand, st.sampled_from([1, 2, 3, 4, 8]), st.floats(0, 0.7 * mem), st.sampled_from([0, 1, 2, 6]))
    return st.lists(one, max_size=max_trials).map(lambda ds: {f"t{i}": d for i, d in enumerate(ds)})


@st.composite
def scenarios(draw):
    """``(demands, nodes, previous)``: maybe a former placement, then trials kept, dropped,
    re-sized and added, on the same nodes or fewer or more."""
    nodes0 = draw(clusters())
    d0 = draw(demands_for(nodes0))
    if not draw(st.booleans()):
        return d0, nodes0, None
    previous = place_packed(d0, nodes0)
    demands = {}
    for t, d in d0.items():
        action = draw(st.sampled_from(["keep", "keep", "drop", "resize"]))
        if action == "keep":
            demands[t] = d
        elif action == "resize":
            demands[t] = PackedDemand(draw(st.sampled_from([1, 2, 4])), d.gpu_memory_gb, d.vcpus)
    demands.update({f"new{i}": d for i, d in enumerate(draw(demands_for(nodes0, 8)).values())})
    cut = draw(st.integers(0, len(nodes0) - 1))
    more = [GpuNode(f"x{i}", nodes0[0].gpus, nodes0[0].gpu_memory_gb, nodes0[0].vcpus) for i in range(draw(st.integers(0, 2)))]
    return demands, nodes0[: len(nodes0) - cut] + more, previous


def fits_somewhere(d: PackedDemand, p: PackedPlacement, nodes: list[GpuNode]) -> bool:
    """Whether ``d`` would still fit on some GPU of ``p``."""
    for n in nodes:
        cpu = sum(p.demands[t].vcpus for t, (nid, _) in p.assignments.items() if nid == n.id)
        for g in range(n.gpus):
            on = [p.demands[t] for t in p.trials_on((n.id, g))]
            share = sum(1 / x.trials_per_gpu for x in on) + 1 / d.trials_per_gpu
            mem = sum(x.gpu_memory_gb for x in on) + d.gpu_memory_gb
            if (share <= 1 + 1e-9 and (n.gpu_memory_gb is None or mem <= n.gpu_memory_gb + 1e-6)
                    and (n.vcpus is None or cpu + d.vcpus <= n.vcpus + 1e-6)):
                return True
    return False


# --- laws ---------------------------------------------------------------------------------

@FAST
@given(scenarios())
def test_no_gpu_or_node_is_over_capacity_and_only_what_cannot_fit_is_unplaced(case):
    demands, nodes, previous = case
    p = place_packed(demands, nodes, previous)
    assert check_packed(p, nodes) == []
    assert set(p.trials()) | set(p.unplaced) == set(demands) and not set(p.trials()) & set(p.unplaced)
    assert dict(p.demands) == demands
    # Room only falls while placing: a trial left out fits nowhere in the end either.
    for t in p.unplaced:
        assert not fits_somewhere(demands[t], p, nodes), f"{t} was left out but fits"


@FAST
@given(scenarios())
def test_same_inputs_move_nothing(case):
    demands, nodes, previous = case
    first = place_packed(demands, nodes, previous)
    again = place_packed(demands, nodes, first)
    assert again.moves(first) == () and again == first


@FAST
@given(scenarios())
def test_unchanged_trials_keep_their_gpu_and_their_gpu_mates(case):
    """Stability and co-location: a trial with the demand it had, whose GPU is still there,
    stays on it whatever else changed — and so trials packed together stay together."""
    demands, nodes, previous = case
    if previous is None:
        return
    ids = {n.id: n.gpus for n in nodes}
    p = place_packed(demands, nodes, previous)
    unchanged = [t for t, (nid, g) in previous.assignments.items()
                 if t in demands and demands[t] == previous.demands[t] and nid in ids]
    for t in unchanged:
        assert p.assignments[t] == previous.assignments[t], f"unchanged {t} moved"
    for t in unchanged:
        mates = {u for u in previous.trials_on(previous.assignments[t]) if u in unchanged}
        assert mates <= set(p.trials_on(p.assignments[t]))


@FAST
@given(st.integers(1, 8), st.integers(1, 16), st.sampled_from([1, 2, 4]), st.data())
def test_a_stage_at_k_per_gpu_fits_k_trials_on_every_gpu_and_spreads_fewer(n_nodes, gpus, k, data):
    """What the planner asks for: n trials at k per GPU on GPUs that hold them all."""
    nodes = [GpuNode(i, gpus, 80.0, 12 * gpus) for i in range(n_nodes)]
    n = data.draw(st.integers(0, n_nodes * gpus * k))
    p = place_packed(dict.fromkeys(range(n), PackedDemand(k, 80.0 / k, 12 / k)), nodes)
    assert p.unplaced == ()
    per_gpu = [len(p.trials_on((i, g))) for i in range(n_nodes) for g in range(gpus)]
    assert max(per_gpu) - min(per_gpu) <= 1     # worst fit: as even as it gets
    assert max(per_gpu) <= k


# --- against the exact search --------------------------------------------------------------

def test_occupancy_is_within_3_percent_of_the_exact_search_on_hypersack_like_cases():
    rng = np.random.default_rng(7)
    ratios = []
    while len(ratios) < 60:
        n_nodes = int(rng.integers(1, 3))
        demands, nodes = hypersack_case(rng, n_nodes, 2 if n_nodes == 2 else int(rng.choice([2, 4])))
        if len(demands) > 12:
            continue
        best, _ = most_packed(demands, nodes)
        placed = place_packed(demands, nodes).compute_placed()
        assert placed <= best + 1e-9
        ratios.append(placed / best)
    assert np.mean(ratios) >= 0.97
    assert np.quantile(ratios, 0.1) >= 0.85


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 2), st.integers(1, 2), st.lists(
    st.builds(PackedDemand, st.sampled_from([1, 2, 4]), st.sampled_from([0.0, 5.0, 9.0]), st.sampled_from([0, 2, 3])),
    max_size=6))
def test_the_exact_search_agrees_with_plain_enumeration(n_nodes, gpus, ds):
    """Its pruning and symmetry breaking lose nothing: every assignment, tried one by one."""
    nodes = [GpuNode(i, gpus, 16.0, 4 * gpus) for i in range(n_nodes)]
    demands = {f"t{i}": d for i, d in enumerate(ds)}
    slots = [None] + [(i, g) for i in range(n_nodes) for g in range(gpus)]
    best = (0.0, 0)
    for combo in itertools.product(slots, repeat=len(ds)):
        placed = {t: s for t, s in zip(demands, combo) if s is not None}
        p = PackedPlacement(placed, demands, tuple(t for t in demands if t not in placed))
        if not check_packed(p, nodes):
            best = max(best, (round(p.compute_placed(), 9), len(placed)))
    found = most_packed(demands, nodes)
    assert (round(found[0], 9), found[1]) == best


def test_the_exact_search_finds_what_greedy_orders_miss():
    # One 16 GB GPU: two half-GPU trials of 8 GB fill it; taking the 10 GB one first would not.
    nodes = [GpuNode("a", 1, 16.0)]
    demands = {"big": PackedDemand(2, 10.0), "x": PackedDemand(2, 8.0), "y": PackedDemand(2, 8.0)}
    assert most_packed(demands, nodes) == (1.0, 2)
    p = place_packed(demands, nodes)
    assert set(p.trials()) == {"x", "y"} and p.unplaced == ("big",)   # the leaner first
    assert most_packed({"cpu": PackedDemand(4, 1.0, 5)}, [GpuNode("a", 2, 16.0, 4)]) == (0.0, 0)


def test_hypersack_cases_are_reproducible_and_over_subscribed():
    a = hypersack_case(np.random.default_rng(1), 3)
    b = hypersack_case(np.random.default_rng(1), 3)
    assert a == b
    demands, nodes = a
    gpus = sum(n.gpus for n in nodes)
    assert 0.8 * gpus <= sum(1 / d.trials_per_gpu for d in demands.values()) < 1.5 * gpus + 1
    small = hypersack_case(np.random.default_rng(1), 2, gpus_per_node=2)[1]
    assert all(n.gpus == 2 for n in small) and small[0].vcpus * nodes[0].gpus == nodes[0].vcpus * 2


# --- worked examples ----------------------------------------------------------------------

def test_memory_caps_trials_on_a_gpu_and_vcpus_cap_a_node():
    by_mem = place_packed(dict.fromkeys(range(4), PackedDemand(4, 12.0)), [("a", 1, 40.0)])
    assert len(by_mem.trials()) == 3 and by_mem.unplaced == (3,)          # 4 x 12 GB > 40 GB
    by_cpu = place_packed(dict.fromkeys(range(8), PackedDemand(4, 1.0, 4)), [("a", 2, 40.0, 12)])
    assert len(by_cpu.trials()) == 3                                       # 12 vCPUs / 4 each


def test_worst_fit_spreads_and_a_whole_gpu_trial_is_alone():
    nodes = [GpuNode("a", 2), GpuNode("b", 2)]
    p = place_packed({"w": 1, **{f"h{i}": 2 for i in range(4)}}, nodes)
    assert p.assignments["w"] == ("a", 0) and p.trials_on(("a", 0)) == ("w",)
    assert sorted(len(p.trials_on(s)) for s in [("a", 1), ("b", 0), ("b", 1)]) == [1, 1, 2]


def test_a_trial_whose_demand_changed_is_placed_again():
    nodes = [GpuNode("a", 1), GpuNode("b", 1)]
    before = place_packed({"x": 2, "y": 2}, nodes)
    assert before.assignments == {"x": ("a", 0), "y": ("b", 0)}
    after = place_packed({"x": 2, "y": 1, "z": 2}, nodes, before)
    # y now wants a whole GPU: it is placed again, worst fit, on the GPU with most room (its own).
    assert after.assignments == {"x": ("a", 0), "y": ("b", 0), "z": ("a", 0)}
    moved = place_packed({"x": 1, "y": 2}, nodes, before)     # x now wants all of a GPU: a is all its own
    assert moved.assignments == {"y": ("b", 0), "x": ("a", 0)} and moved.moves(before) == ()
    squeezed = place_packed({"x": 2, "y": 2}, [GpuNode("b", 1)], before)   # a is gone
    assert squeezed.assignments == {"y": ("b", 0), "x": ("b", 0)} and squeezed.moves(before) == ("x",)


# --- bad input and the value --------------------------------------------------------------

@pytest.mark.parametrize(("bad", "match"), [
    (0, r"demands\['t'\]\.trials_per_gpu: expected a whole number of trials per GPU of at least 1, got 0"),
    (1.5, r"demands\['t'\]\.trials_per_gpu: .* got 1\.5"),
    (True, r"demands\['t'\]\.trials_per_gpu"),
])
def test_a_bad_trials_per_gpu_is_one_line_naming_the_field(bad, match):
    with pytest.raises(SpecError, match=match):
        place_packed({"t": bad}, [("a", 1)])


def test_bad_demands_and_nodes_are_rejected():
    with pytest.raises(SpecError, match=r"^gpu_memory_gb: expected a number of at least 0, got -1"):
        PackedDemand(2, -1)
    with pytest.raises(SpecError, match=r"^nodes\['a'\]\.gpus: expected a positive integer"):
        place_packed({"t": 2}, [("a", 0)])
    with pytest.raises(SpecError, match=r"^nodes\['a'\]\.gpu_memory_gb: expected a number greater than 0"):
        place_packed({"t": 2}, [("a", 1, 0)])
    with pytest.raises(SpecError, match="listed twice"):
        place_packed({"t": 2}, [("a", 1), ("a", 2)])
    with pytest.raises(SpecError, match="previous: expected a PackedPlacement"):
        place_packed({"t": 2}, [("a", 1)], {"t": ("a", 0)})


def test_the_packed_placement_is_a_value_that_round_trips():
    p = place_packed({"x": PackedDemand(2, 4.0, 1), "y": 2, "z": PackedDemand(1, 20.0)}, [("a", 1, 16.0, 8)])
    assert p.unplaced == ("z",) and p.trials_on(("a", 0)) == ("x", "y")
    assert p.compute_placed() == 1.0 and p.gpus_used() == {("a", 0)} and p.nodes_used() == {"a"}
    assert PackedPlacement.from_dict(p.to_dict()) == p
    with pytest.raises(SpecError, match=r"demands\['q'\]: every placed or unplaced trial needs a PackedDemand"):
        PackedPlacement({"q": ("a", 0)})
    assert check_packed(PackedPlacement({"x": ("a", 0), "y": ("a", 0)}, {"x": PackedDemand(1), "y": PackedDemand(2)}),
                        [("a", 1)]) == ["GPU ('a', 0) runs 1.500 GPUs of compute"]
