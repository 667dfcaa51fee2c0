"""Monte-Carlo simulation of a plan's JCT and cost (DESIGN §4, spot reclaims §4.1 in ``spot.py``), vectorised over samples."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rubberband.errors import SpecError
from rubberband.limits import check_samples_seed, check_simulation
from rubberband.profiles.cloud import BillingModel, CloudProfile, Market
from rubberband.profiles.model import ModelProfile
from rubberband.simulator.model import StageDraws, StageShape, billed_seconds, stage_shape
from rubberband.simulator.result import SimResult, StageStats
from rubberband.simulator.spot import (
    PositionSchedule,
    bill_window,
    check_trace_cap,
    grant_times,
    run_stage,
    trace_offsets,
)
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


def simulate(spec: ExperimentSpec, allocation: Sequence[int], model: ModelProfile, cloud: CloudProfile,
             samples: int = 1000, seed: int = 0, instances: Sequence[int] | None = None,
             draws: Sequence[StageDraws] | None = None, spot_instances: Sequence[int] | None = None) -> SimResult:
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
        spot_instances: how many of each stage's held instances are spot, the rest on-demand
            (DESIGN §4.1); default: all of them when ``cloud.market`` is spot, else none.

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
    spot = spot_layout(held, cloud, spot_instances)
    check_trace_cap(cloud.spot, spot)
    per_instance = cloud.billing.model is BillingModel.PER_INSTANCE
    if any(spot) and not spot_billable(cloud):
        raise SpecError("billing: per-function billing has no spot market to reclaim from; "
                        "use per_instance billing or spot_instances=0")
    data_usd = cloud.data.usd_per_launch
    # Two pools, each released most recently launched first: on-demand and spot instances.
    od, sp = _Pool(cloud.price_usd_per_hour / 3600.0), _Pool((cloud.spot_price_usd_per_hour or 0.0) / 3600.0)
    offsets = trace_offsets(cloud.spot, seed, samples)

    now = np.zeros(samples)
    stage_cost = np.zeros((len(shapes), samples))
    stage_duration = np.zeros((len(shapes), samples))
    reclaims = np.zeros((len(shapes), samples))
    launched = [0] * len(shapes)           # new instances per stage (both markets)
    for shape, count, s in zip(shapes, held, spot):
        i, d = shape.index, draws[shape.index]
        start = now.copy()
        o = count - s
        for pool, keep in ((od, o), (sp, s)):    # scale down at the previous SYNC, newest first
            if keep < pool.count:
                surcharge = pool.release(pool.count - keep, now, cloud.billing)
                stage_cost[i - 1] += surcharge if per_instance else 0.0
        old_o, old_s = od.count, sp.count
        new_o, new_s = o - old_o, s - old_s
        new = new_o + new_s
        launched[i] = new
        if s and cloud.spot.at_risk:
            now, busy, bill = _spot_stage(d, model, cloud, shape, now, od, sp, new_o, new_s, offsets, seed)
            stage_cost[i] += new * data_usd + bill.launches * data_usd
            stage_cost[i] += sp.usd_per_s * (bill.instance_seconds + bill.rounding_s)
            if o:
                stage_cost[i] += od.held_usd(old_o, new_o, start, od.stack[-1][1] if new_o else None, now)
            reclaims[i] = bill.reclaims
        else:
            if new:
                scale_end = now + d.scale(cloud)
                for pool, fresh in ((od, new_o), (sp, new_s)):
                    if fresh:
                        pool.push(fresh, scale_end)
                now = scale_end + d.init_max(cloud, new)
                stage_cost[i] += new * data_usd
            makespan, busy = d.train(model, shape)
            now = now + makespan + d.sync(model)
            if per_instance:
                # Bill instance-seconds of this stage; rounding is added when instances are released.
                for pool, old, fresh in ((od, old_o, new_o), (sp, old_s, new_s)):
                    if old or fresh:
                        stage_cost[i] += pool.held_usd(old, fresh, start, scale_end if fresh else None, now)
        if not per_instance:
            # TRAIN work at the stage's market price (its instances' share of each, when mixed).
            usd = mixed_usd_per_s(o, s, od.usd_per_s, sp.usd_per_s)
            stage_cost[i] += busy * shape.gpus_per_trial * usd / cloud.gpus_per_instance
        stage_duration[i] = now - start
    if per_instance:
        stage_cost[-1] += od.release(od.count, now, cloud.billing) + sp.release(sp.count, now, cloud.billing)
    jct = now
    cost = stage_cost.sum(axis=0)
    stats = tuple(
        StageStats(s.index, s.num_trials, s.iters, s.allocation, s.gpus_per_trial, h, launched[s.index],
                   float(stage_duration[s.index].mean()), float(stage_cost[s.index].mean()),
                   spot_instances=n_spot, mean_reclaims=float(reclaims[s.index].mean()))
        for s, h, n_spot in zip(shapes, held, spot)
    )
    return SimResult(jct, cost, tuple(s.allocation for s in shapes), tuple(held), stats, int(seed),
                     spot_instances=tuple(spot))


def mixed_usd_per_s(on_demand: int, spot: int, on_demand_usd: float, spot_usd: float) -> float:
    """A stage's price per instance-second when it holds ``on_demand`` and ``spot`` instances
    (per-function billing charges TRAIN work at its instances' share of each market)."""
    if spot == 0:
        return on_demand_usd
    if on_demand == 0:
        return spot_usd
    return (on_demand * on_demand_usd + spot * spot_usd) / (on_demand + spot)


def spot_billable(cloud: CloudProfile) -> bool:
    """Whether spot instances can be simulated on ``cloud``: per-function billing has no
    instances to reclaim, so a reclaim model there is refused."""
    return cloud.billing.model is BillingModel.PER_INSTANCE or not cloud.spot.at_risk


def spot_layout(held: Sequence[int], cloud: CloudProfile, spot_instances: Sequence[int] | None) -> list[int]:
    """Spot instances per stage: as given (each between 0 and the stage's held count), or by
    the cloud's market. Raises ``SpecError`` naming the stage, or when the type has no spot price."""
    if spot_instances is None:
        return [h if cloud.market is Market.SPOT else 0 for h in held]
    if isinstance(spot_instances, (str, bytes)) or not isinstance(spot_instances, Sequence | np.ndarray) \
            or len(spot_instances) != len(held):
        raise SpecError(f"spot_instances: expected {len(held)} counts, one per stage, got {spot_instances!r}")
    out = []
    for i, (count, h) in enumerate(zip(spot_instances, held)):
        if isinstance(count, float) and count.is_integer():
            count = int(count)
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 0 <= count <= h:
            raise SpecError(f"spot_instances[{i}]: expected a whole number of the stage's {h} instances "
                            f"(0..{h}), got {count!r}")
        out.append(int(count))
    if any(out) and cloud.spot_price_usd_per_hour is None:
        raise SpecError(f"spot_instances: {cloud.instance_type} has no spot_price_usd_per_hour; "
                        f"add one to the cloud profile or plan on-demand only")
    return out


class _Pool:
    """Instances of one market held across stages, oldest first: groups of ``(count, SCALE end,
    ready)``; a group of one per spot instance once reclaims make them differ."""

    def __init__(self, usd_per_s: float):
        self.usd_per_s = usd_per_s
        self.stack: list[tuple[int, np.ndarray, np.ndarray | None]] = []

    @property
    def count(self) -> int:
        return sum(g[0] for g in self.stack)

    def push(self, count: int, launched: np.ndarray, ready: np.ndarray | None = None) -> None:
        self.stack.append((count, launched, ready))

    def held_usd(self, old: int, fresh: int, start: np.ndarray, launched: np.ndarray | None,
                 now: np.ndarray) -> np.ndarray:
        """Instance-seconds of a stage from ``start`` to ``now``: ``old`` instances held into it
        and ``fresh`` ones billed from their SCALE end ``launched`` (rounding is added at release)."""
        return self.usd_per_s * (old * (now - start) + (fresh * (now - launched) if fresh else 0.0))

    def positions(self, samples: int) -> tuple[np.ndarray, np.ndarray]:
        """Per instance, oldest first: SCALE end and ready time, ``(count, samples)`` each."""
        starts = [np.broadcast_to(launched, (n, samples)) for n, launched, _ in self.stack]
        ready = [np.broadcast_to(launched if r is None else r, (n, samples)) for n, launched, r in self.stack]
        empty = np.empty((0, samples))
        return (np.concatenate(starts) if starts else empty), (np.concatenate(ready) if ready else empty)

    def release(self, count: int, now: np.ndarray, billing) -> np.ndarray:
        """Release ``count`` instances, most recently launched first; return the rounding surcharge.

        The instance-seconds themselves are billed stage by stage; what is added here is the
        difference between the billed time (rounded up, at least the minimum) and the lifetime.
        A replacement still provisioning (SCALE ends after ``now``) is cancelled, never billed.
        """
        extra = np.zeros_like(now)
        while count > 0:
            group, launched, ready = self.stack.pop()
            take = min(group, count)
            lifetime = now - launched
            surcharge = take * (billed_seconds(lifetime, billing) - lifetime) * self.usd_per_s
            extra += surcharge if ready is None else np.where(launched < now, surcharge, 0.0)
            if group > take:
                self.stack.append((group - take, launched, ready))
            count -= take
        return extra


def _spot_stage(d: StageDraws, model: ModelProfile, cloud: CloudProfile, shape: StageShape, now: np.ndarray,
                od: _Pool, sp: _Pool, new_o: int, new_s: int, offsets: np.ndarray, seed: int):
    """One stage whose spot instances may be reclaimed (``simulator/spot.py``): launch the new
    instances, run the TRAIN nodes on instance positions (on-demand first, then spot, oldest
    first), SYNC; bill the spot positions' incarnations and carry them into the next stage.

    Returns the stage's end, its summed TRAIN time and the spot positions' bill."""
    samples = now.shape[0]
    new = new_o + new_s
    ready = now
    new_od_ready = new_sp_start = new_sp_ready = np.empty((0, samples))
    if new:
        scale = d.scale(cloud)
        inits = d.init_each(cloud, new)
        if new_o:
            od.push(new_o, now + scale)
            new_od_ready = now + scale + inits[:new_o]
        if new_s:
            # A first spot request waits for capacity like a replacement does (trace markets).
            granted = grant_times(cloud.spot, now, offsets, np.arange(sp.count, sp.count + new_s))
            new_sp_start = granted + scale
            new_sp_ready = new_sp_start + inits[new_o:]
        ready = np.max(np.concatenate([new_od_ready, new_sp_ready]), axis=0)
    old_start, old_ready = sp.positions(samples)
    n_od = od.count
    start = np.concatenate([np.full((n_od, samples), -np.inf), old_start, new_sp_start])
    up = np.concatenate([np.full((n_od - new_o, samples), -np.inf), new_od_ready, old_ready, new_sp_ready])
    is_spot = np.arange(len(start)) >= n_od
    schedule = PositionSchedule(cloud, cloud.spot, seed, shape.index, now, start, up, is_spot, offsets)
    latency, startup = d.train_parts(model, shape)
    trained, busy = run_stage(schedule, shape, cloud.gpus_per_instance, ready, latency, startup)
    end = trained + d.sync(model)
    rows = np.flatnonzero(is_spot)
    carried = np.arange(len(start)) < n_od + len(old_start)
    bill = bill_window(schedule, rows, now, end, cloud.billing, carried)
    # Carry each spot position's incarnation alive (or provisioning) at the SYNC.
    current_start, current_ready = schedule.current(rows, end)
    sp.stack = [(1, current_start[j], current_ready[j]) for j in range(len(rows))]
    return end, busy, bill
