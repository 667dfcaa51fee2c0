"""Benchmark the placement policy on a SHA job of 1024 trials over 256 nodes of 8 GPUs.

Run with ``.venv/bin/python benchmarks/bench_place.py``. Prints three plain-text tables:

1. SHA(1024, eta=2) where each stage halves the trials and doubles their GPUs (1024x1,
   512x2, ..., 1x1024 — always 1024 of the cluster's 2048 GPUs): placement time, moves and
   releasable nodes per stage.
2. The same SHA job with a fixed 1 GPU per trial, where survivors keep their slots and end
   up scattered, followed at each stage by ``scale_down_plan`` to the fewest nodes that hold
   them: it packs them onto the oldest nodes and releases the newest, as the executor does
   at a SYNC (pack before release); moves and release counts with their times.
3. The first placement timed over several repeats (the target is under 100 ms).
4. Packing (``place_packed``, Worst-Fit-Decreasing): occupancy — the compute placed, as a
   share of what the exact search (``rubberband.testing.packing_oracle.most_packed``) places —
   on small HyperSack-like random cases (``hypersack_case``: what it draws is in its
   docstring; 1 node of 2 or 4 GPUs, or 2 nodes of 2, at most 12 trials), the target being
   within 3% of the exact search; then the time of one packed placement of 1,024 trials on
   256 nodes of 8 GPUs (target < 100 ms), for a SHA stage packed 4 per GPU and for
   HyperSack-like mixed demands.

Survivors are drawn with a seeded ``numpy.random.Generator`` so runs are reproducible.
"""

from __future__ import annotations

import math
import time

import numpy as np

from rubberband.placement import GpuNode, PackedDemand, place, place_packed, scale_down_plan
from rubberband.testing.packing_oracle import hypersack_case, most_packed

NUM_TRIALS = 1024
NUM_NODES = 256
GPUS_PER_NODE = 8
ETA = 2
SEED = 0
REPEATS = 5
OCCUPANCY_CASES = 300


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.1f}"


def _survivors(rng: np.random.Generator, alive: list[int]) -> list[int]:
    """The trials SHA promotes: a random 1/eta of those alive, kept in id order."""
    keep = rng.choice(len(alive), size=len(alive) // ETA, replace=False)
    return [alive[i] for i in sorted(keep)]


def growing_trials(nodes: list[tuple[str, int]]) -> None:
    rng = np.random.default_rng(SEED)
    capacity = NUM_NODES * GPUS_PER_NODE
    print(f"SHA({NUM_TRIALS} trials, eta={ETA}) on {NUM_NODES} nodes x {GPUS_PER_NODE} GPUs; "
          "each stage halves the trials and doubles GPUs per trial")
    print(f"{'stage':>5} {'trials':>6} {'GPUs/trial':>10} {'place ms':>8} {'moves':>6} "
          f"{'nodes used':>10} {'releasable':>10} {'unplaced':>8}")
    alive, gpus, previous, stage = list(range(NUM_TRIALS)), 1, None, 0
    while alive and len(alive) * gpus <= capacity:
        demands = dict.fromkeys(alive, gpus)
        start = time.perf_counter()
        p = place(demands, nodes, previous)
        took = time.perf_counter() - start
        print(f"{stage:>5} {len(alive):>6} {gpus:>10} {_ms(took)} {len(p.moves(previous)):>6} "
              f"{len(p.nodes_used()):>10} {len(p.releasable(nodes)):>10} {len(p.unplaced):>8}")
        if len(alive) == 1:
            break
        alive, gpus, previous, stage = _survivors(rng, alive), gpus * ETA, p, stage + 1
    print()


def fixed_trials(nodes: list[tuple[str, int]]) -> None:
    rng = np.random.default_rng(SEED)
    print("Same SHA job with 1 GPU per trial: survivors stay put, then scale_down_plan packs "
          "them onto the oldest nodes before the newest are released")
    print(f"{'stage':>5} {'trials':>6} {'place ms':>8} {'moves':>6} {'nodes used':>10} "
          f"{'plan ms':>8} {'target':>6} {'moved':>6} {'released':>8}")
    alive, previous, stage = list(range(NUM_TRIALS)), None, 0
    current = list(nodes)
    while alive:
        demands = dict.fromkeys(alive, 1)
        start = time.perf_counter()
        p = place(demands, current, previous)
        took = time.perf_counter() - start
        target = math.ceil(len(alive) / GPUS_PER_NODE)
        start = time.perf_counter()
        plan = scale_down_plan(p, current, target)
        planned = time.perf_counter() - start
        print(f"{stage:>5} {len(alive):>6} {_ms(took)} {len(p.moves(previous)):>6} "
              f"{len(p.nodes_used()):>10} {_ms(planned)} {target:>6} {len(plan.moved):>6} "
              f"{len(plan.release):>8}")
        if len(alive) == 1:
            break
        # The executor releases the planned nodes; the next stage starts from the packed placement.
        current = [n for n in current if n[0] in set(plan.keep)]
        alive, previous, stage = _survivors(rng, alive), plan.placement, stage + 1
    print()


def first_placement(nodes: list[tuple[str, int]]) -> None:
    demands = dict.fromkeys(range(NUM_TRIALS), 1)
    runs = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        place(demands, nodes)
        runs.append(time.perf_counter() - start)
    print(f"First placement, {NUM_TRIALS} x 1 GPU on {NUM_NODES} x {GPUS_PER_NODE}: "
          f"best {min(runs) * 1e3:.1f} ms, median {sorted(runs)[len(runs) // 2] * 1e3:.1f} ms "
          f"over {REPEATS} runs (target < 100 ms)")


def packing_occupancy() -> None:
    rng = np.random.default_rng(SEED)
    ratios, exact_s, wfd_s = [], [], []
    while len(ratios) < OCCUPANCY_CASES:
        n_nodes = int(rng.integers(1, 3))
        demands, nodes = hypersack_case(rng, n_nodes, 2 if n_nodes == 2 else int(rng.choice([2, 4])))
        if len(demands) > 12:
            continue
        start = time.perf_counter()
        best, _ = most_packed(demands, nodes)
        exact_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        placed = place_packed(demands, nodes).compute_placed()
        wfd_s.append(time.perf_counter() - start)
        ratios.append(placed / best)
    r = np.array(ratios)
    print(f"Packing occupancy on {OCCUPANCY_CASES} small HyperSack-like cases (Worst-Fit-Decreasing / exact search, "
          "compute placed):")
    print(f"  mean {r.mean():.2%}, median {np.median(r):.2%}, 10th percentile {np.quantile(r, 0.1):.2%}, "
          f"worst {r.min():.2%}; {np.mean(r >= 0.97):.0%} of cases within 3%, {np.mean(r >= 1 - 1e-9):.0%} optimal "
          "(target: mean within 3%)")
    print(f"  time per case: WFD {np.mean(wfd_s) * 1e3:.3f} ms, exact search {np.mean(exact_s) * 1e3:.1f} ms (mean)")


def packed_placement() -> None:
    nodes = [GpuNode(f"node{i:03d}", GPUS_PER_NODE, 40.0, 96) for i in range(NUM_NODES)]
    rng = np.random.default_rng(SEED)
    cases = {
        "a SHA stage at 4 per GPU": dict.fromkeys(range(NUM_TRIALS), PackedDemand(4, 9.0, 2)),
        "HyperSack-like mixed demands": {t: PackedDemand(int(rng.choice([1, 2, 4], p=[0.2, 0.4, 0.4])),
                                                         round(float(rng.uniform(0.5, 1.3)) * 40 / 4, 2),
                                                         float(rng.choice([1, 2, 4, 6]))) for t in range(NUM_TRIALS)},
    }
    for label, demands in cases.items():
        runs = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            p = place_packed(demands, nodes)
            runs.append(time.perf_counter() - start)
        print(f"Packed placement, {label}: {NUM_TRIALS} trials on {NUM_NODES} x {GPUS_PER_NODE} GPUs (40 GB, 96 vCPUs): "
              f"best {min(runs) * 1e3:.1f} ms, median {sorted(runs)[len(runs) // 2] * 1e3:.1f} ms over {REPEATS} runs "
              f"(target < 100 ms); {len(p.gpus_used())} GPUs used, {len(p.unplaced)} unplaced")


def main() -> None:
    nodes = [(f"node{i:03d}", GPUS_PER_NODE) for i in range(NUM_NODES)]
    growing_trials(nodes)
    fixed_trials(nodes)
    first_placement(nodes)
    print()
    packing_occupancy()
    packed_placement()


if __name__ == "__main__":
    main()
