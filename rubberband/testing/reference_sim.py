"""A plain per-sample reference implementation of the execution and cost model (DESIGN §4).

It walks the stages of one sampled run with Python lists, drawing every latency as it
goes, and is written straight from DESIGN §4 without reusing the simulator's code. It is
slow on purpose and exists so that tests and benchmarks can check the vectorised
simulator against an independent reading of the model. Its random streams are laid out
differently from ``rubberband.simulator.StageDraws``: compare it with the simulator in
distribution (means, spreads), not sample by sample.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rubberband.profiles.cloud import BillingModel, CloudProfile
from rubberband.profiles.distributions import Distribution
from rubberband.profiles.model import ModelProfile
from rubberband.spec.experiment import ExperimentSpec


@dataclass(frozen=True)
class ReferenceRun:
    """One sampled run of a plan.

    ``compute_usd`` is instance time (per-instance billing) or TRAIN work (per-function
    billing); ``data_usd`` is what the dataset downloads cost. ``nodes`` counts the task
    graph's nodes by type (SCALE, INIT_INSTANCE, TRAIN, SYNC).
    """

    jct_s: float
    compute_usd: float
    data_usd: float
    stage_durations_s: tuple[float, ...]
    instances: tuple[int, ...]
    launches: int
    nodes: dict[str, int]

    @property
    def cost_usd(self) -> float:
        return self.compute_usd + self.data_usd


def _draw(dist: Distribution, rng: np.random.Generator) -> float:
    return float(dist.sample(rng, 1)[0])


def _billed_seconds(lifetime: float, granularity_s: float, minimum_s: float) -> float:
    # Rounding to 9 decimals first keeps 120.00000000000001 s from billing a whole extra unit.
    return max(granularity_s * math.ceil(round(lifetime / granularity_s, 9)), minimum_s)


def run_once(spec: ExperimentSpec, allocation: Sequence[int], model: ModelProfile,
             cloud: CloudProfile | Sequence[CloudProfile], rng: np.random.Generator,
             instances: Sequence[int] | None = None, trials_per_gpu: Sequence[int] | None = None,
             fused_per_gpu: Sequence[int] | None = None,
             target_model: ModelProfile | None = None) -> ReferenceRun:
    """Sample one run of the plan ``allocation`` (GPUs per stage) and return its JCT and cost.

    Args:
        spec: the job's stages.
        allocation: GPUs per stage; assumed valid (the simulator validates, this does not).
        model: the model profile.
        cloud: the instance type's profile, or one per stage: where the type changes, every
            instance of the old type is released at the SYNC and the stage launches anew.
        rng: where every latency is drawn from.
        instances: optional instances held per stage (at least what each stage needs).
        trials_per_gpu: optional trials sharing a GPU per stage (packing, 1-GPU trials only):
            ``a * k`` slots, every TRAIN at ``packed_latency(k)``.
        fused_per_gpu: optional trials fused into one program per GPU per stage (DESIGN §4.5,
            1-GPU trials only): ``ceil(n / F)`` groups, each one TRAIN of ``startup + iters * L_F``
            on its own GPU (the last, smaller group at ``L_F`` too), queued as trials are,
            billed per function one GPU per group.
        target_model: the profile a target stage (surrogate tuning, DESIGN §4.6) runs by:
            its start-up, latencies and SYNC; every other stage runs by ``model``.

    A stage that resumes its trials (any but a bracket's first) trains each of them ``iters +
    r`` iterations, ``r`` those done since its latest checkpoint: with ``c =
    model.checkpoint_every`` and ``D`` what it trained before in its bracket, checkpoints are at
    ``c, 2c, ...``, the latest at ``c * floor(D / c)``, so ``r = D - c * floor(D / c)``; with no
    checkpoint at all (``c`` is ``None``) it starts over, ``r = D``.

    Returns:
        A ``ReferenceRun``.
    """
    clouds = [cloud] * spec.num_stages() if isinstance(cloud, CloudProfile) else list(cloud)
    packing = list(trials_per_gpu) if trials_per_gpu is not None else [1] * spec.num_stages()
    fusion = list(fused_per_gpu) if fused_per_gpu is not None else [1] * spec.num_stages()
    cloud = clouds[0]

    now = 0.0
    alive: list[float] = []          # billing start (end of the launching SCALE), oldest first
    compute = data = 0.0
    launches = 0
    durations_per_stage: list[float] = []
    held_per_stage: list[int] = []
    nodes = {"SCALE": 0, "INIT_INSTANCE": 0, "TRAIN": 0, "SYNC": 0}

    def release(count: int, cloud: CloudProfile) -> float:
        usd = 0.0
        for _ in range(count):
            launched = alive.pop()   # the most recently launched goes first
            if cloud.billing.model is BillingModel.PER_INSTANCE:
                usd += _billed_seconds(now - launched, cloud.billing.granularity_s, cloud.billing.minimum_s) \
                    * cloud.hourly_usd / 3600.0
        return usd

    trained = 0                      # iterations each trial trained before this stage, in its bracket
    hand_over = 0.0                  # an eager target's start (DESIGN §4.6): the SYNC ending its after_stage
    for i, stage in enumerate(spec.stages):
        if stage.eager is not None:
            compute += release(len(alive), cloud)         # the tuning's instances go at its last SYNC
            if target_model is None:
                raise ValueError("target_model: the job ends in a target stage; give its profile")
            end, usd, new = _eager_target(stage, int(allocation[i]), clouds[i], target_model, rng, hand_over, now,
                                          None if instances is None else int(instances[i]))
            compute += usd
            data += new * clouds[i].data.dataset_gb * clouds[i].data.price_usd_per_gb
            launches += new
            nodes["SCALE"] += 1
            nodes["INIT_INSTANCE"] += new
            nodes["TRAIN"] += 1           # the TRAIN that counts (a restart's cut one is none of the graph's)
            nodes["SYNC"] += 1
            durations_per_stage.append(end - now)
            held_per_stage.append(new)
            now = end
            break
        if i in spec.bracket_starts:
            trained = 0
        every = model.checkpoint_every
        last_checkpoint = 0 if every is None else every * (trained // every)
        redo = trained - last_checkpoint
        trained += stage.iters
        if clouds[i].instance_type != cloud.instance_type:
            compute += release(len(alive), cloud)      # a new type: nothing carries over
            cloud = clouds[i]
        G = cloud.gpus_per_instance
        usd_per_s = cloud.hourly_usd / 3600.0
        per_instance = cloud.billing.model is BillingModel.PER_INSTANCE
        n, k, a, pack, fuse = stage.num_trials, stage.iters + redo, int(allocation[i]), packing[i], fusion[i]
        groups = math.ceil(n / fuse)         # TRAIN nodes: the trials, or their fused groups
        if a >= n:
            m, running = a // n, groups
        else:
            m, running = 1, min(groups, a * pack)
        if m <= G:
            need = math.ceil(running / (G // m * pack))
        else:
            need = running * math.ceil(m / G)
        held = need if instances is None else int(instances[i])
        stage_start = now

        # Scale down happens at the previous SYNC, i.e. now.
        if held < len(alive):
            compute += release(len(alive) - held, cloud)
        if held > len(alive):
            new = held - len(alive)
            nodes["SCALE"] += 1
            nodes["INIT_INSTANCE"] += new
            scale_end = now + _draw(cloud.provision_latency_s, rng)
            # Instances launched together that share one machine initialise slower (DESIGN §4).
            ready = max(scale_end + _draw(cloud.init_latency_s, rng) for _ in range(new)) + cloud.init_contention_s * (new - 1)
            alive.extend([scale_end] * new)
            launches += new
            data += new * cloud.data.dataset_gb * cloud.data.price_usd_per_gb
            now = ready

        prof = model
        if stage.target:
            if target_model is None:
                raise ValueError("target_model: the job ends in a target stage; give its profile")
            prof = target_model
        if fuse > 1:
            latency = prof.fused_latency(fuse)          # one iteration of the whole group
        else:
            latency = prof.packed_latency(pack) if pack > 1 else prof.latency(m)
        trains = [_draw(prof.trial_startup_s, rng) + k * _draw(latency, rng) for _ in range(groups)]
        nodes["TRAIN"] += groups
        # Each of the `running` GPU slots takes the next queued trial as soon as it is free.
        slots = [(now, g) for g in range(running)]
        for duration in trains:
            free_at, g = heapq.heappop(slots)
            heapq.heappush(slots, (free_at + duration, g))
        now = max(t for t, _ in slots) + _draw(prof.sync_s, rng)
        nodes["SYNC"] += 1
        if not per_instance:
            compute += sum(trains) * m * usd_per_s / (G * pack)
        durations_per_stage.append(now - stage_start)
        held_per_stage.append(held)
        if spec.eager is not None and i == spec.eager.after_stage:
            hand_over = now

    compute += release(len(alive), cloud)
    return ReferenceRun(now, compute, data, tuple(durations_per_stage), tuple(held_per_stage), launches, nodes)


def _eager_target(stage, allocation: int, cloud: CloudProfile, model: ModelProfile, rng: np.random.Generator,
                  hand_over: float, tuning_end: float, instances: int | None) -> tuple[float, float, int]:
    """One run of an eager target stage (DESIGN §4.6), told event by event: its end, its compute
    cost and its instance count. It launches its instances at the hand-over and trains once they
    are all up; at the tuning's end it starts over with ``restart_probability`` (the first run
    cut, the second from then, or from when its instances are up); its SYNC comes once the run
    that counts is over and so is the tuning."""
    G = cloud.gpus_per_instance
    held = (1 if allocation <= G else math.ceil(allocation / G)) if instances is None else instances
    scale_end = hand_over + _draw(cloud.provision_latency_s, rng)
    ready = max(scale_end + _draw(cloud.init_latency_s, rng) for _ in range(held)) + cloud.init_contention_s * (held - 1)
    latency = model.latency(allocation)
    first, again = (_draw(model.trial_startup_s, rng) + stage.iters * _draw(latency, rng) for _ in range(2))
    if rng.random() < stage.eager.restart_probability:
        train_end = max(tuning_end, ready) + again
        worked = min(max(tuning_end - ready, 0.0), first) + again
    else:
        train_end = max(tuning_end, ready + first)
        worked = first
    end = train_end + _draw(model.sync_s, rng)
    if cloud.billing.model is BillingModel.PER_INSTANCE:
        usd = held * _billed_seconds(end - scale_end, cloud.billing.granularity_s, cloud.billing.minimum_s) \
            * cloud.hourly_usd / 3600.0
    else:
        usd = worked * allocation * cloud.hourly_usd / 3600.0 / G
    return end, usd, held


def reference_simulate(spec: ExperimentSpec, allocation: Sequence[int], model: ModelProfile,
                       cloud: CloudProfile | Sequence[CloudProfile], samples: int, seed: int = 0,
                       instances: Sequence[int] | None = None,
                       trials_per_gpu: Sequence[int] | None = None,
                       fused_per_gpu: Sequence[int] | None = None,
                       target_model: ModelProfile | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Run ``run_once`` ``samples`` times from one seeded generator.

    Returns:
        ``(jct_s, cost_usd)``: numpy arrays with one value per sample.
    """
    rng = np.random.default_rng(seed)
    runs = [run_once(spec, allocation, model, cloud, rng, instances, trials_per_gpu, fused_per_gpu, target_model)
            for _ in range(samples)]
    return np.array([r.jct_s for r in runs]), np.array([r.cost_usd for r in runs])
