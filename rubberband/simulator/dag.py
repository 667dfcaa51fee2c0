"""The plan's task graph (paper Figure 7): SCALE, INIT_INSTANCE, TRAIN and SYNC nodes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import networkx as nx

from rubberband.limits import check_dag
from rubberband.profiles.cloud import CloudCatalog, CloudProfile, Market
from rubberband.profiles.model import ModelProfile
from rubberband.simulator.engine import check_eager_on_demand, launches, layout, spot_layout, stage_clouds
from rubberband.simulator.model import StageShape, iter_latency
from rubberband.simulator.spot import trial_positions
from rubberband.spec.experiment import ExperimentSpec

SCALE, INIT_INSTANCE, TRAIN, SYNC = "SCALE", "INIT_INSTANCE", "TRAIN", "SYNC"
ON_DEMAND, SPOT = Market.ON_DEMAND.value, Market.SPOT.value


def dag_size(shapes: Sequence[StageShape], held: Sequence[int], spot: Sequence[int] | None = None,
             types: Sequence[str] | None = None) -> tuple[int, int]:
    """Nodes of a plan's task graph, and a bound on its edges, without building it: a stage's
    running trials each wait on every instance it launches (or on the SYNC before)."""
    nodes = edges = 0
    for shape, fresh in zip(shapes, launches(held, spot, types)):
        new = sum(fresh)
        nodes += shape.nodes + 1 + (new + 1 if new else 0)
        edges += shape.running * (new or 1) + 2 * shape.nodes + 2 * new
    return nodes, edges


def build_dag(spec: ExperimentSpec, allocation: Sequence[int], model: ModelProfile, cloud: CloudProfile | CloudCatalog,
              instances: Sequence[int] | None = None, spot_instances: Sequence[int] | None = None,
              trials_per_gpu: Sequence[int] | None = None, instance_types: Sequence[str] | None = None,
              fused_per_gpu: Sequence[int] | None = None) -> nx.DiGraph:
    """Build the inspectable task graph of a plan.

    Every node carries ``type`` (SCALE, INIT_INSTANCE, TRAIN, SYNC), ``stage`` and the
    distribution(s) its latency is drawn from; TRAIN nodes also carry ``trial``, ``gpu_slot``,
    ``gpus``, ``iters``, ``iter_latency`` and ``startup`` (latency = startup + iters * L),
    INIT_INSTANCE nodes carry ``instance`` (the instance's launch number in the job) and
    ``together_s`` (what instances launched together add to each INIT: ``init_contention_s``
    per other new instance of the scale-up, DESIGN §4).

    Markets (DESIGN §4.1): ``spot_instances`` is ``simulate``'s (how many of each stage's held
    instances are spot; default: all of them when ``cloud.market`` is spot, else none). The
    graph carries ``spot_instances`` and the market's ``preemption`` model; INIT_INSTANCE
    nodes carry ``market`` (``"spot"`` or ``"on-demand"``), SCALE nodes ``new_spot``, TRAIN
    nodes the ``market`` of the instances their GPU slot is on (on-demand ones come first, as
    the simulator lays them; ``"mixed"`` when a trial spans both). Reclaims are not in this
    graph: they are random events the simulator draws per Monte-Carlo sample, and each sample
    has its own. ``sample_timeline`` shows one sample's reclaims, lost work and replacements
    (its REPLACE: a new SCALE + INIT, then the TRAIN resumed from its last checkpoint).

    Packing and instance types are ``simulate``'s. The graph carries ``trials_per_gpu`` and
    ``instance_types`` (one per stage); SCALE and INIT_INSTANCE nodes carry the
    ``instance_type`` they launch (a change of type launches every instance of the stage);
    TRAIN nodes carry ``trials_per_gpu`` (``k``), ``gpu_slot`` (the running slot, ``k`` of
    them to a GPU), ``gpu`` (which GPU of the stage, ``gpu_slot // k``) and the packed
    ``iter_latency`` when ``k > 1``.

    Fusion is ``simulate``'s (DESIGN §4.5): the graph carries ``fused_per_gpu``; a fused stage
    has one TRAIN node per group (``trial`` is the group's number, ``members`` the trials it
    trains, ``fused_per_gpu`` its ``F``), with the group's ``iter_latency`` ``L_F``.

    Queued trials (allocation below the trial count) are chained per GPU slot in trial order
    (trial j after trial j - a): the graph of a deterministic run. With random latencies the
    simulator instead hands each freed GPU the next queued trial, as the executor does.

    An eager target stage (DESIGN §4.6; the graph's ``eager_transfer``) hangs off the SYNC ending
    its ``after_stage``: its SCALE launches all its instances, and its SYNC follows its TRAIN and
    the tuning's last SYNC. Its restart, like a reclaim, is a random event of each sample, not a node.

    Raises:
        SpecError: for an invalid allocation, instance or spot vector.
    """
    clouds = stage_clouds(cloud, instance_types, spec.validate().num_stages())
    shapes, held = layout(spec, allocation, model, clouds, instances, trials_per_gpu, fused_per_gpu)
    spot = spot_layout(held, clouds, spot_instances)
    check_eager_on_demand(spec, spot)
    types = [c.instance_type for c in clouds]
    check_dag(*dag_size(shapes, held, spot, types))
    first = next((c for c, n in zip(clouds, spot) if n), clouds[0])
    g = nx.DiGraph(allocation=tuple(s.allocation for s in shapes), instances=tuple(held),
                   instance_type=clouds[0].instance_type, gpus_per_instance=clouds[0].gpus_per_instance,
                   instance_types=tuple(types), trials_per_gpu=tuple(s.trials_per_gpu for s in shapes),
                   fused_per_gpu=tuple(s.fused_per_gpu for s in shapes),
                   spot_instances=tuple(spot), preemption=first.spot.to_dict().get("preemption") if any(spot) else None)
    eager = spec.eager
    if eager is not None:        # the target branches off (DESIGN §4.6); its restart is drawn per sample
        g.graph["eager_transfer"] = eager.to_dict()
    frontier: Sequence[tuple[object, ...]] = []
    launched = 0
    for shape, count, s, (new_o, new_s), c in zip(shapes, held, spot, launches(held, spot, types), clouds):
        i = shape.index
        if eager is not None and i == spec.target_stage:
            # An eager target launches all its instances at the SYNC ending ``after_stage`` and
            # ends after its TRAIN and the tuning's last SYNC.
            frontier, new_o, new_s = [(SYNC, eager.after_stage)], count, 0
        if new_o + new_s:
            scale = (SCALE, i)
            g.add_node(scale, type=SCALE, stage=i, latency=c.provision_latency_s, new_instances=new_o + new_s,
                       new_spot=new_s, instance_type=c.instance_type)
            g.add_edges_from((f, scale) for f in frontier)
            inits = []
            for j in range(new_o + new_s):
                node = (INIT_INSTANCE, i, j)
                g.add_node(node, type=INIT_INSTANCE, stage=i, instance=launched + j, latency=c.init_latency_s,
                           together_s=c.init_contention_s * (new_o + new_s - 1),
                           market=ON_DEMAND if j < new_o else SPOT, instance_type=c.instance_type)
                g.add_edge(scale, node)
                inits.append(node)
            launched += new_o + new_s
            frontier = inits
        lat = iter_latency(model, shape)
        sync = (SYNC, i)
        g.add_node(sync, type=SYNC, stage=i, latency=model.sync_s, instances_after=count, instance_type=c.instance_type)
        slot_markets = [_market(p, count - s) for p in trial_positions(shape, c.gpus_per_instance)]
        k = shape.trials_per_gpu
        F = shape.fused_per_gpu
        for t in range(shape.nodes):
            node = (TRAIN, i, t)
            slot = t % shape.running
            g.add_node(node, type=TRAIN, stage=i, trial=t, gpu_slot=slot, gpu=slot // k, gpus=shape.gpus_per_trial,
                       trials_per_gpu=k, iters=shape.iters, iter_latency=lat, startup=model.trial_startup_s,
                       market=slot_markets[slot], instance_type=c.instance_type, fused_per_gpu=F,
                       members=min(F, shape.num_trials - t * F))
            if t < shape.running:
                g.add_edges_from((f, node) for f in frontier)
            else:
                g.add_edge((TRAIN, i, t - shape.running), node)
            g.add_edge(node, sync)
        if eager is not None and i == spec.target_stage:
            g.add_edge((SYNC, i - 1), sync)
        frontier = [sync]
    return g


def _market(positions: Iterable[int], on_demand: int) -> str:
    """The market of a trial on instance ``positions``, on-demand ones being the first ``on_demand``."""
    markets = {ON_DEMAND if p < on_demand else SPOT for p in positions}
    return markets.pop() if len(markets) == 1 else "mixed"
