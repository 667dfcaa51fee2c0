"""The plan's task graph (paper Figure 7): SCALE, INIT_INSTANCE, TRAIN and SYNC nodes."""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from rubberband.limits import check_dag
from rubberband.profiles.cloud import CloudProfile, Market
from rubberband.profiles.model import ModelProfile
from rubberband.simulator.engine import layout, spot_layout
from rubberband.simulator.model import StageShape
from rubberband.simulator.spot import trial_positions
from rubberband.spec.experiment import ExperimentSpec

SCALE, INIT_INSTANCE, TRAIN, SYNC = "SCALE", "INIT_INSTANCE", "TRAIN", "SYNC"
ON_DEMAND, SPOT = Market.ON_DEMAND.value, Market.SPOT.value


def launches(held: Sequence[int], spot: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """New (on-demand, spot) instances per stage: each market keeps what it held before (the
    simulator's two pools), so a stage that changes market launches what it switches to."""
    spot = spot or [0] * len(held)
    out, prev_o, prev_s = [], 0, 0
    for count, s in zip(held, spot):
        o = count - s
        out.append((max(0, o - prev_o), max(0, s - prev_s)))
        prev_o, prev_s = o, s
    return out


def dag_size(shapes: Sequence[StageShape], held: Sequence[int], spot: Sequence[int] | None = None) -> tuple[int, int]:
    """Nodes of a plan's task graph, and a bound on its edges, without building it: a stage's
    running trials each wait on every instance it launches (or on the SYNC before)."""
    nodes = edges = 0
    for shape, fresh in zip(shapes, launches(held, spot)):
        new = sum(fresh)
        nodes += shape.num_trials + 1 + (new + 1 if new else 0)
        edges += shape.running * (new or 1) + 2 * shape.num_trials + 2 * new
    return nodes, edges


def build_dag(spec: ExperimentSpec, allocation: Sequence[int], model: ModelProfile, cloud: CloudProfile,
              instances: Sequence[int] | None = None, spot_instances: Sequence[int] | None = None) -> nx.DiGraph:
    """Build the inspectable task graph of a plan.

    Every node carries ``type`` (SCALE, INIT_INSTANCE, TRAIN, SYNC), ``stage`` and the
    distribution(s) its latency is drawn from; TRAIN nodes also carry ``trial``, ``gpu_slot``,
    ``gpus``, ``iters``, ``iter_latency`` and ``startup`` (latency = startup + iters * L),
    INIT_INSTANCE nodes carry ``instance`` (the instance's launch number in the job).

    Markets (DESIGN §4.1): ``spot_instances`` is ``simulate``'s (how many of each stage's held
    instances are spot; default: all of them when ``cloud.market`` is spot, else none). The
    graph carries ``spot_instances`` and the market's ``preemption`` model; INIT_INSTANCE
    nodes carry ``market`` (``"spot"`` or ``"on-demand"``), SCALE nodes ``new_spot``, TRAIN
    nodes the ``market`` of the instances their GPU slot is on (on-demand ones come first, as
    the simulator lays them; ``"mixed"`` when a trial spans both). Reclaims are not in this
    graph: they are random events the simulator draws per Monte-Carlo sample, and each sample
    has its own. ``sample_timeline`` shows one sample's reclaims, lost work and replacements
    (its REPLACE: a new SCALE + INIT, then the TRAIN resumed from its last checkpoint).

    Queued trials (allocation below the trial count) are chained per GPU slot in trial order
    (trial j after trial j - a): the graph of a deterministic run. With random latencies the
    simulator instead hands each freed GPU the next queued trial, as the executor does.

    Raises:
        SpecError: for an invalid allocation, instance or spot vector.
    """
    shapes, held = layout(spec, allocation, model, cloud, instances)
    spot = spot_layout(held, cloud, spot_instances)
    check_dag(*dag_size(shapes, held, spot))
    g = nx.DiGraph(allocation=tuple(s.allocation for s in shapes), instances=tuple(held),
                   instance_type=cloud.instance_type, gpus_per_instance=cloud.gpus_per_instance,
                   spot_instances=tuple(spot), preemption=cloud.spot.to_dict().get("preemption") if any(spot) else None)
    frontier: list = []
    launched = 0
    for shape, count, s, (new_o, new_s) in zip(shapes, held, spot, launches(held, spot)):
        i = shape.index
        if new_o + new_s:
            scale = (SCALE, i)
            g.add_node(scale, type=SCALE, stage=i, latency=cloud.provision_latency_s, new_instances=new_o + new_s,
                       new_spot=new_s)
            g.add_edges_from((f, scale) for f in frontier)
            inits = []
            for j in range(new_o + new_s):
                node = (INIT_INSTANCE, i, j)
                g.add_node(node, type=INIT_INSTANCE, stage=i, instance=launched + j, latency=cloud.init_latency_s,
                           market=ON_DEMAND if j < new_o else SPOT)
                g.add_edge(scale, node)
                inits.append(node)
            launched += new_o + new_s
            frontier = inits
        lat = model.latency(shape.gpus_per_trial)
        sync = (SYNC, i)
        g.add_node(sync, type=SYNC, stage=i, latency=model.sync_s, instances_after=count)
        slot_markets = [_market(p, count - s) for p in trial_positions(shape, cloud.gpus_per_instance)]
        for t in range(shape.num_trials):
            node = (TRAIN, i, t)
            g.add_node(node, type=TRAIN, stage=i, trial=t, gpu_slot=t % shape.running, gpus=shape.gpus_per_trial,
                       iters=shape.iters, iter_latency=lat, startup=model.trial_startup_s,
                       market=slot_markets[t % shape.running])
            if t < shape.running:
                g.add_edges_from((f, node) for f in frontier)
            else:
                g.add_edge((TRAIN, i, t - shape.running), node)
            g.add_edge(node, sync)
        frontier = [sync]
    return g


def _market(positions, on_demand: int) -> str:
    """The market of a trial on instance ``positions``, on-demand ones being the first ``on_demand``."""
    markets = {ON_DEMAND if p < on_demand else SPOT for p in positions}
    return markets.pop() if len(markets) == 1 else "mixed"
