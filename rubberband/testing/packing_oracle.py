"""Exact packing search and HyperSack-like random cases: the reference for ``place_packed``.

``most_packed`` finds, by branch and bound, the largest compute (sum of ``1/k``) that packed
1-GPU trials can place on a set of nodes under the three constraints of
``rubberband.placement.packing`` (compute and memory per GPU, vCPUs per node) — the exact
optimum that HyperSack compares its Worst-Fit-Decreasing with (their MIP). Exponential: small
cases only (a dozen trials on a handful of GPUs).

``hypersack_case`` draws random cases shaped after HyperSack's setting (what it draws is in
its docstring), at any size: cut down for the exact search, full size for the benchmark.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np

from rubberband.placement.packing import GpuNode, PackedDemand

#: Instance shapes: (name, GPUs, GB per GPU, vCPUs) — p4d.24xlarge, p5.48xlarge, g5.12xlarge, p3.8xlarge.
NODE_TYPES = (("p4d", 8, 40.0, 96), ("p5", 8, 80.0, 192), ("g5", 4, 24.0, 48), ("p3", 4, 16.0, 32))


def most_packed(demands: dict[Hashable, PackedDemand], nodes: Sequence[GpuNode]) -> tuple[float, int]:
    """The most compute (GPUs' worth) and, among packings placing that much, the most trials
    that fit on ``nodes`` — every GPU within compute and memory, every node within vCPUs."""
    trials = sorted(demands.values(), key=lambda d: (d.trials_per_gpu, -d.gpu_memory_gb, -d.vcpus))
    unit = math.lcm(*(d.trials_per_gpu for d in trials)) if trials else 1
    need = [unit // d.trials_per_gpu for d in trials]
    gpus = [(i, g) for i, n in enumerate(nodes) for g in range(n.gpus)]
    compute = [unit] * len(gpus)
    mem = [math.inf if (m := nodes[i].gpu_memory_gb) is None else m for i, _ in gpus]
    cpu = [n.vcpus if n.vcpus is not None else math.inf for n in nodes]
    capacity = unit * len(gpus)
    left = [sum(need[j:]) for j in range(len(trials) + 1)]
    best = [(0, 0)]

    def rec(j: int, units: int, count: int) -> None:
        if (units, count) > best[0]:
            best[0] = (units, count)
        if j == len(trials):
            return
        bound = min(units + left[j], capacity)
        if (bound, count + len(trials) - j) <= best[0]:
            return
        d = trials[j]
        seen = set()
        for x, (i, _) in enumerate(gpus):
            # GPUs in the same state on the same node, or fresh GPUs on fresh identical nodes,
            # are interchangeable: try one of each.
            fresh_node = cpu[i] == (nodes[i].vcpus if nodes[i].vcpus is not None else math.inf) and all(
                compute[y] == unit for y, (k, _) in enumerate(gpus) if k == i)
            key = ("fresh", nodes[i].gpus, nodes[i].gpu_memory_gb, nodes[i].vcpus) if fresh_node else \
                (i, compute[x], mem[x])
            if key in seen:
                continue
            seen.add(key)
            if compute[x] >= need[j] and mem[x] + 1e-9 >= d.gpu_memory_gb and cpu[i] + 1e-9 >= d.vcpus:
                compute[x] -= need[j]
                mem[x] -= d.gpu_memory_gb
                cpu[i] -= d.vcpus
                rec(j + 1, units + need[j], count + 1)
                compute[x] += need[j]
                mem[x] += d.gpu_memory_gb
                cpu[i] += d.vcpus
        rec(j + 1, units, count)     # or leave trial j out

    rec(0, 0, 0)
    return best[0][0] / unit, best[0][1]


def hypersack_case(rng: np.random.Generator, n_nodes: int, gpus_per_node: int | None = None,
                   load: tuple[float, float] = (0.8, 1.5)) -> tuple[dict[str, PackedDemand], list[GpuNode]]:
    """A random packing case shaped after HyperSack's (an approximation of their workloads).

    Draws: one instance shape from ``NODE_TYPES`` for all ``n_nodes`` nodes (a stage's cluster
    is homogeneous); with ``gpus_per_node`` given, nodes are cut down to that many GPUs with
    the same memory per GPU and the same vCPUs per GPU (small cases for the exact search).
    Then trials until their compute reaches ``U(load)`` times the GPUs (over-subscribed, so the
    packing must choose): each is one of a tuning job's configurations, packed ``k`` per GPU
    with ``k`` from {1, 2, 4} (probabilities 0.2, 0.4, 0.4), peak memory ``U(0.5, 1.3) / k``
    of a GPU's (so memory sometimes, not always, caps ``k``), and 1, 2, 4 or 6 vCPUs for data
    loading (uniformly; a p4d has 12 per GPU, so CPUs bind when 4 hungry trials share one).

    Returns:
        ``(demands, nodes)`` for ``place_packed`` and ``most_packed``.
    """
    _, gpus, mem, vcpus = NODE_TYPES[int(rng.integers(len(NODE_TYPES)))]
    if gpus_per_node is not None:
        vcpus, gpus = vcpus * gpus_per_node // gpus, gpus_per_node
    nodes = [GpuNode(f"n{i}", gpus, mem, vcpus) for i in range(n_nodes)]
    target = rng.uniform(*load) * gpus * n_nodes
    demands: dict[str, PackedDemand] = {}
    total = 0.0
    while total < target:
        k = int(rng.choice([1, 2, 4], p=[0.2, 0.4, 0.4]))
        demands[f"t{len(demands)}"] = PackedDemand(k, round(float(rng.uniform(0.5, 1.3)) * mem / k, 2),
                                                   float(rng.choice([1, 2, 4, 6])))
        total += 1 / k
    return demands, nodes
