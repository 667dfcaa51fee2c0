"""Monte-Carlo simulation of a plan's JCT and cost (DESIGN §4), vectorised over samples."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rubberband.errors import SpecError
from rubberband.limits import check_samples_seed, check_simulation
from rubberband.profiles.cloud import BillingModel, CloudProfile
from rubberband.profiles.model import ModelProfile
from rubberband.simulator.model import StageDraws, StageShape, stage_shape
from rubberband.simulator.result import SimResult, StageStats
from rubberband.spec.experiment import ExperimentSpec


def layout(spec: ExperimentSpec, allocation: Sequence[int], model: ModelProfile, cloud: CloudProfile,
           instances: Sequence[int] | None = None) -> tuple[list[StageShape], list[int]]:
    """Validate an allocation vector and return each stage's shape and held instance count.

    Raises:
        SpecError: wrong length, non-integers, zero or out-of-profile allocations, or an
            explicit instance count below what a stage needs.
    """
    spec.validate()
    if isinstance(allocation, (str, bytes)) or not isinstance(allocation, Sequence | np.ndarray):
        raise SpecError(f"allocation: expected one GPU count per stage, got {allocation!r}")
    if len(allocation) != spec.num_stages():
        raise SpecError(
            f"allocation: has {len(allocation)} entries but the experiment has {spec.num_stages()} stages "
            f"({spec.describe()}); give one GPU count per stage"
        )
    shapes = [stage_shape(i, s.num_trials, s.iters, allocation[i], model, cloud) for i, s in enumerate(spec.stages)]
    if instances is None:
        held = [s.instances_needed for s in shapes]
    else:
        if isinstance(instances, (str, bytes)) or not isinstance(instances, Sequence | np.ndarray) or len(instances) != len(shapes):
            raise SpecError(f"instances: expected {len(shapes)} instance counts, one per stage, got {instances!r}")
        held = []
        for shape, count in zip(shapes, instances):
            if isinstance(count, float) and count.is_integer():
                count = int(count)
            if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < shape.instances_needed:
                raise SpecError(
                    f"instances[{shape.index}]: {count!r} cannot hold stage {shape.index}; it needs at least "
                    f"{shape.instances_needed} {cloud.instance_type} instances for {shape.allocation} GPUs"
                )
            held.append(int(count))
    G = cloud.gpus_per_instance
    for shape, count in zip(shapes, held):
        # floor(a / n) GPUs per trial can leave GPUs over that no instance holds (33 GPUs for
        # 32 one-GPU trials on eight 4-GPU instances): the plan would show GPUs it never pays for.
        if shape.allocation > count * G:
            used = shape.running * shape.gpus_per_trial
            raise SpecError(
                f"allocation[{shape.index}]: {shape.allocation} GPUs do not fit on the {count} {cloud.instance_type} "
                f"instances ({count * G} GPUs) that hold stage {shape.index}'s {shape.running} running trials of "
                f"{shape.gpus_per_trial} GPU(s); give {used} GPUs, or hold more instances"
            )
    return shapes, held


def billed_seconds(lifetime, billing):
    """Billed seconds of instances alive ``lifetime`` seconds: rounded up to the billing
    granularity, and at least the billing minimum (DESIGN §4)."""
    g = billing.granularity_s
    rounded = np.ceil(np.round(np.asarray(lifetime, dtype=float) / g, 9)) * g
    return np.maximum(rounded, billing.minimum_s)


def simulate(spec: ExperimentSpec, allocation: Sequence[int], model: ModelProfile, cloud: CloudProfile,
             samples: int = 1000, seed: int = 0, instances: Sequence[int] | None = None,
             draws: Sequence[StageDraws] | None = None) -> SimResult:
    """Simulate one plan ``samples`` times and return per-sample JCT and cost.

    Args:
        spec: the job's stages.
        allocation: GPUs per stage.
        model: the model profile (iteration latency by GPUs per trial, start-up, SYNC).
        cloud: the instance type's profile (GPUs, price, billing, latencies, data cost).
        samples: Monte-Carlo samples.
        seed: root seed; the same seed gives the same result, and plans simulated with the
            same seed share their random numbers stage by stage.
        instances: optional instances to hold per stage (at least what each stage needs),
            e.g. the same count in every stage for a static cluster.
        draws: per-stage random streams to reuse (the planner passes its own).

    Returns:
        A ``SimResult`` with ``jct_s`` and ``cost_usd`` arrays and a per-stage breakdown.

    Raises:
        SpecError: for an invalid allocation or instance vector.
    """
    check_samples_seed(samples, seed)
    shapes, held = layout(spec, allocation, model, cloud, instances)
    launches = [max(0, h - p) for h, p in zip(held, [0, *held])]
    check_simulation(spec.trials, [s.allocation for s in shapes], max(launches), samples)
    if draws is None:
        draws = [StageDraws(seed, i, samples) for i in range(len(shapes))]
    per_instance = cloud.billing.model is BillingModel.PER_INSTANCE
    usd_per_s = cloud.usd_per_second
    data_usd = cloud.data.usd_per_launch

    now = np.zeros(samples)
    stack: list[tuple[int, np.ndarray]] = []     # (count, launch time) groups, oldest first
    stage_cost = np.zeros((len(shapes), samples))
    stage_duration = np.zeros((len(shapes), samples))
    previous = 0
    for shape, count in zip(shapes, held):
        i, d = shape.index, draws[shape.index]
        start = now.copy()
        new = max(0, count - previous)
        if count < previous:                     # scale down at the previous SYNC, newest first
            stage_cost[i - 1] += _release(stack, previous - count, now, cloud) if per_instance else 0.0
        if new:
            scale_end = now + d.scale(cloud)
            stack.append((new, scale_end))
            now = scale_end + d.init_max(cloud, new)
            stage_cost[i] += new * data_usd
        makespan, busy = d.train(model, shape)
        now = now + makespan + d.sync(model)
        if per_instance:
            # Bill instance-seconds of this stage; rounding is added when instances are released.
            old = min(previous, count)
            stage_cost[i] += usd_per_s * (old * (now - start) + (new * (now - scale_end) if new else 0.0))
        else:
            stage_cost[i] += busy * shape.gpus_per_trial * usd_per_s / cloud.gpus_per_instance
        stage_duration[i] = now - start
        previous = count
    if per_instance:
        stage_cost[-1] += _release(stack, previous, now, cloud)
    jct = now
    cost = stage_cost.sum(axis=0)
    stats = tuple(
        StageStats(s.index, s.num_trials, s.iters, s.allocation, s.gpus_per_trial, h,
                   max(0, h - (held[s.index - 1] if s.index else 0)),
                   float(stage_duration[s.index].mean()), float(stage_cost[s.index].mean()))
        for s, h in zip(shapes, held)
    )
    return SimResult(jct, cost, tuple(s.allocation for s in shapes), tuple(held), stats, int(seed))


def _release(stack: list[tuple[int, np.ndarray]], count: int, now: np.ndarray, cloud: CloudProfile) -> np.ndarray:
    """Release ``count`` instances, most recently launched first; return the rounding surcharge.

    The instance-seconds themselves are billed stage by stage; what is added here is the
    difference between the billed time (rounded up, at least the minimum) and the lifetime.
    """
    extra = np.zeros_like(now)
    while count > 0:
        group, launched = stack.pop()
        take = min(group, count)
        lifetime = now - launched
        extra += take * (billed_seconds(lifetime, cloud.billing) - lifetime) * cloud.usd_per_second
        if group > take:
            stack.append((group - take, launched))
        count -= take
    return extra
