"""The plan's task graph (paper Figure 7): SCALE, INIT_INSTANCE, TRAIN and SYNC nodes."""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from rubberband.limits import check_dag
from rubberband.profiles.cloud import CloudProfile
from rubberband.profiles.model import ModelProfile
from rubberband.simulator.engine import layout
from rubberband.simulator.model import StageShape
from rubberband.spec.experiment import ExperimentSpec

SCALE, INIT_INSTANCE, TRAIN, SYNC = "SCALE", "INIT_INSTANCE", "TRAIN", "SYNC"


def dag_size(shapes: Sequence[StageShape], held: Sequence[int]) -> tuple[int, int]:
    """Nodes of a plan's task graph, and a bound on its edges, without building it: a stage's
    running trials each wait on every instance it launches (or on the SYNC before)."""
    nodes = edges = 0
    previous = 0
    for shape, count in zip(shapes, held):
        new = max(0, count - previous)
        nodes += shape.num_trials + 1 + (new + 1 if new else 0)
        edges += shape.running * (new or 1) + 2 * shape.num_trials + 2 * new
        previous = count
    return nodes, edges


def build_dag(spec: ExperimentSpec, allocation: Sequence[int], model: ModelProfile, cloud: CloudProfile,
              instances: Sequence[int] | None = None) -> nx.DiGraph:
    """Build the inspectable task graph of a plan.

    Every node carries ``type`` (SCALE, INIT_INSTANCE, TRAIN, SYNC), ``stage`` and the
    distribution(s) its latency is drawn from; TRAIN nodes also carry ``trial``, ``gpu_slot``,
    ``gpus``, ``iters``, ``iter_latency`` and ``startup`` (latency = startup + iters * L),
    INIT_INSTANCE nodes carry ``instance`` (the instance's launch number in the job).

    Queued trials (allocation below the trial count) are chained per GPU slot in trial order
    (trial j after trial j - a): the graph of a deterministic run. With random latencies the
    simulator instead hands each freed GPU the next queued trial, as the executor does.

    Raises:
        SpecError: for an invalid allocation or instance vector.
    """
    shapes, held = layout(spec, allocation, model, cloud, instances)
    check_dag(*dag_size(shapes, held))
    g = nx.DiGraph(allocation=tuple(s.allocation for s in shapes), instances=tuple(held),
                   instance_type=cloud.instance_type, gpus_per_instance=cloud.gpus_per_instance)
    frontier: list = []
    previous, launched = 0, 0
    for shape, count in zip(shapes, held):
        i = shape.index
        if count > previous:
            scale = (SCALE, i)
            g.add_node(scale, type=SCALE, stage=i, latency=cloud.provision_latency_s, new_instances=count - previous)
            g.add_edges_from((f, scale) for f in frontier)
            inits = []
            for j in range(count - previous):
                node = (INIT_INSTANCE, i, j)
                g.add_node(node, type=INIT_INSTANCE, stage=i, instance=launched + j, latency=cloud.init_latency_s)
                g.add_edge(scale, node)
                inits.append(node)
            launched += count - previous
            frontier = inits
        lat = model.latency(shape.gpus_per_trial)
        sync = (SYNC, i)
        g.add_node(sync, type=SYNC, stage=i, latency=model.sync_s, instances_after=count)
        for t in range(shape.num_trials):
            node = (TRAIN, i, t)
            g.add_node(node, type=TRAIN, stage=i, trial=t, gpu_slot=t % shape.running, gpus=shape.gpus_per_trial,
                       iters=shape.iters, iter_latency=lat, startup=model.trial_startup_s)
            if t < shape.running:
                g.add_edges_from((f, node) for f in frontier)
            else:
                g.add_edge((TRAIN, i, t - shape.running), node)
            g.add_edge(node, sync)
        frontier = [sync]
        previous = count
    return g
