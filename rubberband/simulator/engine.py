"""Monte-Carlo simulation of a plan's JCT and cost (DESIGN §4, spot reclaims §4.1 in ``spot.py``), vectorised over samples."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rubberband.errors import SpecError
from rubberband.limits import check_samples_seed, check_simulation
from rubberband.profiles.by_gpu import model_of
from rubberband.profiles.cloud import Billing, BillingModel, CloudCatalog, CloudProfile, Market
from rubberband.profiles.model import ModelProfile
from rubberband.schema import did_you_mean
from rubberband.simulator.model import (
    StageDraws,
    StageShape,
    billed_seconds,
    redone_iters,
    stage_shape,
)
from rubberband.simulator.result import SimResult, StageStats
from rubberband.simulator.spot import (
    PositionSchedule,
    SpotBill,
    bill_window,
    check_trace_cap,
    grant_times,
    run_stage,
    trace_offsets,
)
from rubberband.spec.experiment import ExperimentSpec


def layout(spec: ExperimentSpec, allocation: Sequence[int], model: ModelProfile | Sequence[ModelProfile],
           cloud: CloudProfile | Sequence[CloudProfile], instances: Sequence[int] | None = None,
           trials_per_gpu: Sequence[int] | None = None,
           fused_per_gpu: Sequence[int] | None = None,
           redone: Sequence[int] | None = None) -> tuple[list[StageShape], list[int]]:
    """Validate an allocation vector and return each stage's shape and held instance count.

    ``cloud`` is one profile, or one per stage (``stage_clouds``): a stage's instances are
    counted in its own type; ``model`` likewise (``stage_models``). ``trials_per_gpu`` packs
    stages and ``fused_per_gpu`` fuses them (default: 1 everywhere). ``redone`` gives each
    stage's iterations trained again on resuming (default: ``redone_iters(spec, model)``; a
    re-plan's remaining stages pass the job's, which counts the stages before them).

    Raises:
        SpecError: wrong length, non-integers, zero or out-of-profile allocations, an explicit
            instance count below what a stage needs, or trials per GPU a stage cannot pack.
    """
    spec.validate()
    if isinstance(allocation, (str, bytes)) or not isinstance(allocation, Sequence | np.ndarray):
        raise SpecError(f"allocation: expected one GPU count per stage, got {allocation!r}")
    if len(allocation) != spec.num_stages():
        raise SpecError(
            f"allocation: has {len(allocation)} entries but the experiment has {spec.num_stages()} stages "
            f"({spec.describe()}); give one GPU count per stage"
        )
    clouds = [cloud] * len(allocation) if isinstance(cloud, CloudProfile) else list(cloud)
    packing = _per_stage(trials_per_gpu, "trials_per_gpu", len(clouds), "trials per GPU") or [1] * len(clouds)
    fusion = _per_stage(fused_per_gpu, "fused_per_gpu", len(clouds), "trials fused per GPU") or [1] * len(clouds)
    models = [model] * len(clouds) if isinstance(model, ModelProfile) else list(model)
    redo = list(redone) if redone is not None else list(redone_iters(spec, models))
    if len(redo) != len(clouds):
        raise SpecError(f"redone: expected {len(clouds)} counts of redone iterations, one per stage, got {len(redo)}")
    shapes = [stage_shape(i, s.num_trials, s.iters, allocation[i], m, c, k, f, int(r))
              for i, (s, c, k, m, f, r) in enumerate(zip(spec.stages, clouds, packing, models, fusion, redo))]
    if instances is None:
        held = [s.instances_needed for s in shapes]
    else:
        if isinstance(instances, (str, bytes)) or not isinstance(instances, Sequence | np.ndarray) or len(instances) != len(shapes):
            raise SpecError(f"instances: expected {len(shapes)} instance counts, one per stage, got {instances!r}")
        held = []
        for shape, count, c in zip(shapes, instances, clouds):
            if isinstance(count, float) and float(count).is_integer():
                count = int(count)
            if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < shape.instances_needed:
                raise SpecError(
                    f"instances[{shape.index}]: {count!r} cannot hold stage {shape.index}; it needs at least "
                    f"{shape.instances_needed} {c.instance_type} instances for {shape.allocation} GPUs"
                )
            held.append(int(count))
    for shape, count, c in zip(shapes, held, clouds):
        G = c.gpus_per_instance
        # floor(a / n) GPUs per trial can leave GPUs over that no instance holds (33 GPUs for
        # 32 one-GPU trials on eight 4-GPU instances): the plan would show GPUs it never pays for.
        if shape.allocation > count * G:
            packed = f" at {shape.trials_per_gpu} per GPU" if shape.trials_per_gpu > 1 else \
                f" in groups of {shape.fused_per_gpu} fused" if shape.fused_per_gpu > 1 else ""
            raise SpecError(
                f"allocation[{shape.index}]: {shape.allocation} GPUs do not fit on the {count} {c.instance_type} "
                f"instances ({count * G} GPUs) that hold stage {shape.index}'s {shape.running} running trials of "
                f"{shape.gpus_per_trial} GPU(s){packed}; give {shape.gpus_used} GPUs, or hold more instances"
            )
    return shapes, held


def _per_stage(values: Sequence[Any] | np.ndarray | None, name: str, stages: int, what: str) -> list[Any] | None:
    """A per-stage vector's entries (``None`` stays ``None``), or one error naming ``name``."""
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence | np.ndarray) or len(values) != stages:
        raise SpecError(f"{name}: expected {stages} {what}, one per stage, got {values!r}")
    return list(values)


def stage_clouds(cloud: CloudProfile | CloudCatalog | Mapping[str, CloudProfile], instance_types: Sequence[str] | None,
                 stages: int) -> list[CloudProfile]:
    """Each stage's instance type profile: ``cloud`` itself, or ``instance_types[i]`` looked up
    in ``cloud`` (a ``CloudCatalog``, on-demand, or a mapping of type name to profile).

    Raises:
        SpecError: naming ``instance_types[i]`` for a type ``cloud`` does not have, or when a
            catalog comes without ``instance_types``.
    """
    types = _per_stage(instance_types, "instance_types", stages, "instance type names")
    if types is None:
        if not isinstance(cloud, CloudProfile):
            raise SpecError("instance_types: a catalog of instance types needs the type of each stage, "
                            "e.g. instance_types=['p3.2xlarge', 'p3.8xlarge']")
        return [cloud] * stages
    if isinstance(cloud, CloudProfile):
        known: Mapping[str, Any] = {cloud.instance_type: cloud}
    elif isinstance(cloud, CloudCatalog):
        known = dict.fromkeys(cloud.instance_types)
    else:
        known = cloud
    profiles: dict[str, CloudProfile] = {}    # one profile object per type: same type, same pools
    for i, name in enumerate(types):
        if not isinstance(name, str) or name not in known:
            raise SpecError(f"instance_types[{i}]: {name!r} is not a known instance type"
                            f"{did_you_mean(str(name), list(known))}; known: {', '.join(known)}")
        if name not in profiles:
            profiles[name] = cloud.get(name) if isinstance(cloud, CloudCatalog) else known[name]
            if profiles[name].instance_type != name:
                raise SpecError(f"instance_types[{i}]: {name!r} maps to a profile of {profiles[name].instance_type}; "
                                "key each profile by its own instance type")
    return [profiles[name] for name in types]


def stage_models(model: ModelProfile | Mapping[str, ModelProfile], clouds: Sequence[CloudProfile],
                 per_stage_types: bool, spec: ExperimentSpec | None = None,
                 target_model: ModelProfile | Mapping[str, ModelProfile] | None = None,
                 _first: int = 0) -> list[ModelProfile]:
    """Each stage's model profile: ``model`` itself, or (a mapping of GPU model to profile)
    the profile of its type's GPU model (``model_of``). A target stage of ``spec``
    (surrogate tuning, DESIGN §4.6) runs by ``target_model`` instead, the same way.

    Raises:
        SpecError: naming ``instance_types[i]`` (``per_stage_types``) or ``instance_type``
            for a type whose GPU model has no profile; naming ``target_model`` when ``spec``
            has a target stage and no ``target_model`` is given, or one is given without one.
    """
    target = spec.target_stage if spec is not None else None
    if target is None and target_model is not None:
        raise SpecError("target_model: the job has no target stage to run it; give target_model only with "
                        "a job that ends in one (ExperimentSpec.with_target)")
    if target is not None:
        if target_model is None:
            raise SpecError(f"target_model: stage {target} is the target stage (the full-width training); give "
                            "the target model's profile, target_model=...")
        return (stage_models(model, clouds[:target], per_stage_types)
                + stage_models(target_model, clouds[target:], per_stage_types, _first=target))
    if isinstance(model, ModelProfile):
        return [model] * len(clouds)
    if not isinstance(model, Mapping) or not model:
        raise SpecError(f"model: expected a ModelProfile or a mapping of GPU model to ModelProfile, got {model!r}")
    return [model_of(model, c, f"instance_types[{i}]" if per_stage_types else "instance_type")
            for i, c in enumerate(clouds, _first)]


@dataclass(frozen=True)
class HeldInstances:
    """Instances a job already holds, up and initialised, when it starts (t = 0): ``count`` of
    type ``instance_type`` (``None``: stage 0's type), ``spot`` of them spot, the rest on-demand.

    ``simulate(..., held_at_start=...)`` starts stage 0 from them (``docs/model.md``): stage 0
    keeps up to what it holds of each market and launches only the rest; the held instances it
    does not keep are released at t = 0, billed nothing more (their minimum charge is taken as
    paid already); instances of another type than stage 0's are all released so.
    """

    count: int
    spot: int = 0
    instance_type: str | None = None

    @classmethod
    def of(cls, value: HeldInstances | int | None) -> HeldInstances | None:
        """``value`` checked (an int: that many on-demand instances of stage 0's type); ``None``
        for nothing held.

        Raises:
            SpecError: naming ``held_at_start`` and the field that is wrong.
        """
        if value is None:
            return None
        if not isinstance(value, HeldInstances):
            value = cls(value)
        for name in ("count", "spot"):
            n = getattr(value, name)
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
                raise SpecError(f"held_at_start.{name}: expected a whole number of instances >= 0, got {n!r}")
        if value.spot > value.count:
            raise SpecError(f"held_at_start.spot: {value.spot} spot instances of {value.count} held; "
                            f"at most {value.count}")
        if value.instance_type is not None and not isinstance(value.instance_type, str):
            raise SpecError(f"held_at_start.instance_type: expected an instance type name, got {value.instance_type!r}")
        return cls(int(value.count), int(value.spot), value.instance_type) if value.count else None

    def of_type(self, instance_type: str) -> tuple[int, int]:
        """The (on-demand, spot) instances held of ``instance_type``: none of another type."""
        if self.instance_type not in (None, instance_type):
            return 0, 0
        return self.count - self.spot, self.spot

    def check_type(self, cloud: CloudProfile | CloudCatalog | Mapping[str, CloudProfile]) -> None:
        """Refuse a held type that a region's ``CloudCatalog`` does not know: a typo would plan as
        if nothing were held. With one profile, or a mapping of the types a plan uses, another
        type is legitimately one the plan does not use (released at t = 0)."""
        if self.instance_type is None or not isinstance(cloud, CloudCatalog):
            return
        known = list(cloud.types)
        if self.instance_type not in known:
            raise SpecError(f"held_at_start.instance_type: {self.instance_type!r} is not a type of the cloud"
                            f"{did_you_mean(self.instance_type, known)}; name one of {', '.join(sorted(known))}")

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "spot": self.spot, "instance_type": self.instance_type}


def launches(held: Sequence[int], spot: Sequence[int] | None = None,
             types: Sequence[str | None] | None = None, start: tuple[int, int] = (0, 0)) -> list[tuple[int, int]]:
    """New (on-demand, spot) instances per stage: each market keeps what it held before (the
    simulator's two pools), so a stage that changes market launches what it switches to, and
    a stage that changes instance type launches all it holds. ``start``: the (on-demand, spot)
    instances of stage 0's type held before it (``HeldInstances``)."""
    spot = spot or [0] * len(held)
    types = types or [None] * len(held)
    out, (prev_o, prev_s), prev_t = [], start, types[0] if types else None
    for count, s, t in zip(held, spot, types):
        if t != prev_t:
            prev_o = prev_s = 0
        o = count - s
        out.append((max(0, o - prev_o), max(0, s - prev_s)))
        prev_o, prev_s, prev_t = o, s, t
    return out


def simulate(spec: ExperimentSpec, allocation: Sequence[int], model: ModelProfile | Mapping[str, ModelProfile],
             cloud: CloudProfile | CloudCatalog | Mapping[str, CloudProfile],
             samples: int = 1000, seed: int = 0, instances: Sequence[int] | None = None,
             draws: Sequence[StageDraws] | None = None, spot_instances: Sequence[int] | None = None,
             trials_per_gpu: Sequence[int] | None = None, instance_types: Sequence[str] | None = None,
             held_at_start: HeldInstances | int | None = None,
             fused_per_gpu: Sequence[int] | None = None,
             target_model: ModelProfile | Mapping[str, ModelProfile] | None = None,
             redone: Sequence[int] | None = None) -> SimResult:
    """Simulate one plan ``samples`` times and return per-sample JCT and cost.

    Packing (``trials_per_gpu[i] = k > 1``; ``docs/model.md``): only a stage whose trials get
    1 GPU each packs. Its ``n`` trials on ``a`` GPUs run up to ``a * k`` at once, ``k`` to a
    GPU (running slot ``j`` on GPU ``j // k``, so ``k * G`` slots to an instance), the rest
    queued, each freed slot taking the next queued trial (list scheduling, as unpacked). Every
    TRAIN of the stage lasts ``startup + iters * L`` with ``L`` drawn from
    ``model.packed_latency(k)`` (row j of the stage's TRAIN stream, as unpacked), whether or
    not its GPU is full at the time. The stage holds ``ceil(min(n, a * k) / (k * G))``
    instances at least, and ``a`` may not exceed the GPUs its instances hold. ``k`` must have
    a packed latency and fit the type's ``gpu_memory_gb`` (``max_trials_per_gpu``).
    Per-function billing charges a packed TRAIN ``duration * price / (k * G)``. On spot, a
    reclaim interrupts every trial on the instance, packed ones included. ``k = 1`` is the
    unpacked model exactly.

    Fusion (``fused_per_gpu[i] = F > 1``; DESIGN §4.5): only a stage whose trials get 1 GPU
    each, and that does not pack, fuses. Its ``n`` trials form ``ceil(n / F)`` groups of ``F``
    in trial order (the last may be smaller), each one program on one GPU: one TRAIN per group,
    ``startup + iters * L_F`` with ``L_F`` drawn from ``model.fused_latency(F)`` (row j of the
    stage's TRAIN stream for group j), the last group's too. Groups run and queue as 1-GPU
    trials do, one to a GPU; per-function billing charges a group its GPU (``1 / F`` of it per
    member). ``F`` must have a fused latency and fit the type's ``gpu_memory_gb``
    (``ModelProfile.fused_fits``). ``F = 1`` is the unfused model exactly.

    Instance types (``instance_types[i]``, with ``cloud`` a ``CloudCatalog`` or a mapping of
    type name to ``CloudProfile``): stage ``i`` runs on its type — GPUs per instance, prices,
    billing, SCALE/INIT latencies, data cost and spot market — and ``instances[i]`` and
    ``spot_instances[i]`` count instances of that type. Consecutive stages of one type are
    the one-type model exactly. At a change of type, every instance of the old type (both
    markets) is released at the SYNC before the new stage, billed to the stage before
    (rounded up, at least the minimum, as any release), and the new stage launches all its
    instances: one SCALE, an INIT each, the data cost per launch, on the new type. No
    instance carries over a change; a later return to a type launches afresh.

    Held instances (``held_at_start``, ``docs/model.md``): the job starts holding instances
    already up and initialised at t = 0 (a re-plan mid-job). Stage 0 keeps, per market, up to
    what it holds of its own type, most recently launched released first, and launches only
    the rest: it waits for one SCALE and the INITs of those, or for nothing when it needs no
    more than it holds, and the new ones are billed from their SCALE end. The kept instances
    are billed from t = 0; those released at t = 0 (stage 0 needs fewer, another market or
    another type) are billed nothing more: their minimum charge is taken as paid already, and
    a kept one is billed as if launched ``minimum_s`` before t = 0 (no new minimum; its time
    from there rounded up to the granularity). Held spot instances are reclaimed as any spot
    instance alive at a stage's start (lifetimes from t = 0, or the zone's trace). Nothing
    held is exactly the model without it, bit for bit.

    Args:
        spec: the job's stages.
        allocation: GPUs per stage.
        model: the model profile (iteration latency by GPUs per trial, start-up, SYNC), or
            a mapping of GPU model to profile: each stage runs by its type's GPU model's.
        cloud: the instance type's profile (GPUs, price, billing, latencies, data cost), or
            a ``CloudCatalog`` / mapping of type name to profile with ``instance_types``.
        samples: Monte-Carlo samples.
        seed: root seed; the same seed gives the same result, and plans simulated with the
            same seed share their random numbers stage by stage.
        instances: optional instances to hold per stage (at least what each stage needs),
            e.g. the same count in every stage for a static cluster.
        draws: per-stage random streams to reuse (the planner passes its own).
        spot_instances: how many of each stage's held instances are spot, the rest on-demand
            (DESIGN §4.1); default: all of them when the stage's type is a spot market, else none.
        trials_per_gpu: trials sharing one GPU per stage (default: 1, no packing).
        fused_per_gpu: trials fused into one program per GPU per stage (default: 1, no fusion).
        instance_types: the instance type of each stage (default: ``cloud``'s one type).
        held_at_start: instances held at t = 0 (``HeldInstances``; an int: that many
            on-demand ones of stage 0's type); default none.
        target_model: the profile (or profiles by GPU model) the target stage of a surrogate
            job runs by (DESIGN §4.6): needed when ``spec`` ends in one, refused otherwise;
            every other stage runs by ``model`` (the surrogate's).
        redone: iterations each TRAIN of stage ``i`` trains again on resuming (default: the
            model's ``checkpoint_every`` over ``spec``, ``simulator.model.redone_iters``).

    Returns:
        A ``SimResult`` with ``jct_s`` and ``cost_usd`` arrays and a per-stage breakdown.

    Raises:
        SpecError: for an invalid allocation, instance, spot, packing or type vector, or a
            type whose GPU model ``model`` has no profile for.
    """
    check_samples_seed(samples, seed)
    clouds = stage_clouds(cloud, instance_types, spec.validate().num_stages())
    models = stage_models(model, clouds, instance_types is not None, spec, target_model)
    shapes, held = layout(spec, allocation, models, clouds, instances, trials_per_gpu, fused_per_gpu, redone)
    spot = spot_layout(held, clouds, spot_instances)
    types = [c.instance_type for c in clouds]
    held_now = HeldInstances.of(held_at_start)
    if held_now is not None:
        held_now.check_type(cloud)
    held_od, held_sp = held_now.of_type(types[0]) if held_now is not None else (0, 0)
    check_simulation(spec.trials, [s.allocation for s in shapes],
                     max(sum(n) for n in launches(held, spot, types, (held_od, held_sp))), samples)
    if draws is None:
        draws = [StageDraws(seed, i, samples) for i in range(len(shapes))]
    for i, (c, n_spot) in enumerate(zip(clouds, spot)):
        check_trace_cap(c.spot, [n_spot], stages=[i])
        if n_spot and not spot_billable(c):
            raise SpecError("billing: per-function billing has no spot market to reclaim from; "
                            "use per_instance billing or spot_instances=0")

    # An eager target stage (DESIGN §4.6) branches off the chain: its own instances, from the
    # SYNC ending stage ``after_stage``, after the tuning's stages are simulated.
    eager, target = spec.eager, spec.target_stage
    check_eager_on_demand(spec, spot)
    chain = shapes[:target] if eager is not None else shapes
    hand_over = None
    now = np.zeros(samples)
    stage_cost = np.zeros((len(shapes), samples))
    stage_duration = np.zeros((len(shapes), samples))
    reclaims = np.zeros((len(shapes), samples))
    launched = [0] * len(shapes)           # new instances per stage (both markets)
    prev = clouds[0]
    od, sp = _pools(prev)
    offsets = trace_offsets(prev.spot, seed, samples)
    # Held at the start: launched minimum_s before t = 0, so that no minimum is billed again.
    for pool, n in ((od, held_od), (sp, held_sp)):
        if n:
            pool.push(n, np.full(samples, -float(prev.billing.minimum_s)))
    for shape, count, s, c, model in zip(chain, held, spot, clouds, models):
        i, d = shape.index, draws[shape.index]
        per_instance = c.billing.model is BillingModel.PER_INSTANCE
        if c.instance_type != prev.instance_type:
            if prev.billing.model is BillingModel.PER_INSTANCE:
                # A change of type releases every old instance at the SYNC before this stage.
                stage_cost[i - 1] += od.release(od.count, now, prev.billing) + sp.release(sp.count, now, prev.billing)
            od, sp = _pools(c)
            offsets = trace_offsets(c.spot, seed, samples)
        prev = c
        data_usd = c.data.usd_per_launch
        start = now.copy()
        o = count - s
        for pool, keep in ((od, o), (sp, s)):    # scale down at the previous SYNC, newest first
            if keep < pool.count:
                surcharge = pool.release(pool.count - keep, now, c.billing)
                if i:        # before stage 0: instances held at the start, released at once for free
                    stage_cost[i - 1] += surcharge if per_instance else 0.0
        old_o, old_s = od.count, sp.count
        new_o, new_s = o - old_o, s - old_s
        new = new_o + new_s
        launched[i] = new
        if s and c.spot.at_risk:
            now, busy, bill = _spot_stage(d, model, c, shape, now, od, sp, new_o, new_s, offsets, seed)
            stage_cost[i] += new * data_usd + bill.launches * data_usd
            stage_cost[i] += sp.usd_per_s * (bill.instance_seconds + bill.rounding_s)
            if o:
                stage_cost[i] += od.held_usd(old_o, new_o, start, od.stack[-1][1] if new_o else None, now)
            reclaims[i] = bill.reclaims
        else:
            if new:
                scale_end = now + d.scale(c)
                for pool, fresh in ((od, new_o), (sp, new_s)):
                    if fresh:
                        pool.push(fresh, scale_end)
                now = scale_end + d.init_max(c, new)
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
            stage_cost[i] += busy * shape.gpu_share * usd / c.gpus_per_instance
        stage_duration[i] = now - start
        if eager is not None and i == eager.after_stage:
            hand_over = now
    if prev.billing.model is BillingModel.PER_INSTANCE:
        stage_cost[len(chain) - 1] += od.release(od.count, now, prev.billing) + sp.release(sp.count, now, prev.billing)
    if eager is not None and target is not None and hand_over is not None:
        end, stage_cost[target] = eager_target(draws[target], models[target], clouds[target], shapes[target],
                                               held[target], hand_over, now, eager.restart_probability)
        stage_duration[target], launched[target], now = end - now, held[target], end
    jct = now
    cost = stage_cost.sum(axis=0)
    several = len(set(types)) > 1 or instance_types is not None
    stats = tuple(
        StageStats(s.index, s.num_trials, s.own_iters, s.allocation, s.gpus_per_trial, h, launched[s.index],
                   float(stage_duration[s.index].mean()), float(stage_cost[s.index].mean()),
                   spot_instances=n_spot, mean_reclaims=float(reclaims[s.index].mean()),
                   trials_per_gpu=s.trials_per_gpu, instance_type=c.instance_type, fused_per_gpu=s.fused_per_gpu,
                   redone=s.redone)
        for s, h, n_spot, c in zip(shapes, held, spot, clouds)
    )
    return SimResult(jct, cost, tuple(s.allocation for s in shapes), tuple(held), stats, int(seed),
                     spot_instances=tuple(spot), trials_per_gpu=tuple(s.trials_per_gpu for s in shapes),
                     instance_types=tuple(types) if several else (),
                     fused_per_gpu=tuple(s.fused_per_gpu for s in shapes))


def check_eager_on_demand(spec: ExperimentSpec, spot: Sequence[int]) -> None:
    """A job whose target starts early (DESIGN §4.6) runs on on-demand instances only.

    Raises:
        SpecError: naming ``spot_instances``.
    """
    if spec.eager is not None and any(spot):
        raise SpecError(f"spot_instances: a job whose target starts early (eager_transfer) runs on on-demand "
                        f"instances, and {list(spot)} are spot; give 0 in every stage, or drop eager_transfer")


def eager_target(d: StageDraws, model: ModelProfile, cloud: CloudProfile, shape: StageShape, count: int,
                 hand_over: np.ndarray, tuning_end: np.ndarray, restart_probability: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """An eager target stage (DESIGN §4.6), per sample: its end and its cost.

    At the hand-over (the SYNC ending stage ``after_stage``) it launches its ``count`` on-demand
    instances (one SCALE, an INIT each: the target stage's draws), which it holds to its end.
    Its first TRAIN (row 0 of its TRAIN stream) starts when they are all ready. At the tuning's
    end (its last SYNC) it restarts with ``restart_probability`` (``StageDraws.restarts``): a
    second TRAIN from scratch (row 1), from the tuning's end or when its instances are ready if
    later, the first one cut. Else it keeps its first TRAIN, however long after the tuning's end
    it runs. Its SYNC (the stage's one draw) follows whichever TRAIN counts, once the tuning is
    over. Per-instance billing bills each instance from its SCALE end to that end (rounded up, at
    least the minimum); per-function billing, the TRAIN work done (a cut first TRAIN up to the cut).
    """
    scale_end = hand_over + d.scale(cloud)
    ready = scale_end + d.init_max(cloud, count)
    runs = d.train_durations(model, replace(shape, num_trials=2, running=2))
    first, again = runs[0], runs[1]
    restart = d.restarts(restart_probability)
    begin_again = np.maximum(tuning_end, ready)
    end = np.where(restart, begin_again + again, np.maximum(tuning_end, ready + first)) + d.sync(model)
    usd = np.full(end.shape, count * cloud.data.usd_per_launch)
    if cloud.billing.model is BillingModel.PER_INSTANCE:
        usd += count * cloud.price_usd_per_hour / 3600.0 * billed_seconds(end - scale_end, cloud.billing)
    else:
        worked = np.where(restart, np.clip(tuning_end - ready, 0.0, first) + again, first)
        usd += worked * shape.gpu_share * cloud.price_usd_per_hour / 3600.0 / cloud.gpus_per_instance
    return end, usd


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


def spot_layout(held: Sequence[int], cloud: CloudProfile | Sequence[CloudProfile],
                spot_instances: Sequence[int] | None) -> list[int]:
    """Spot instances per stage: as given (each between 0 and the stage's held count), or by
    the cloud's market (``cloud``: one profile, or one per stage). Raises ``SpecError`` naming
    the stage, or when a stage's type has no spot price."""
    clouds = [cloud] * len(held) if isinstance(cloud, CloudProfile) else list(cloud)
    if spot_instances is None:
        return [h if c.market is Market.SPOT else 0 for h, c in zip(held, clouds)]
    if isinstance(spot_instances, (str, bytes)) or not isinstance(spot_instances, Sequence | np.ndarray) \
            or len(spot_instances) != len(held):
        raise SpecError(f"spot_instances: expected {len(held)} counts, one per stage, got {spot_instances!r}")
    out = []
    for i, (count, h) in enumerate(zip(spot_instances, held)):
        if isinstance(count, float) and float(count).is_integer():
            count = int(count)
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 0 <= count <= h:
            raise SpecError(f"spot_instances[{i}]: expected a whole number of the stage's {h} instances "
                            f"(0..{h}), got {count!r}")
        out.append(int(count))
    for count, c in zip(out, clouds):
        if count and c.spot_price_usd_per_hour is None:
            raise SpecError(f"spot_instances: {c.instance_type} has no spot_price_usd_per_hour; "
                            f"add one to the cloud profile or plan on-demand only")
    return out


def _pools(cloud: CloudProfile) -> tuple[_Pool, _Pool]:
    """A type's two pools, each released most recently launched first: on-demand and spot."""
    return _Pool(cloud.price_usd_per_hour / 3600.0), _Pool((cloud.spot_price_usd_per_hour or 0.0) / 3600.0)


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
        return np.asarray(self.usd_per_s * (old * (now - start) + (fresh * (now - launched) if fresh else 0.0)))

    def positions(self, samples: int) -> tuple[np.ndarray, np.ndarray]:
        """Per instance, oldest first: SCALE end and ready time, ``(count, samples)`` each."""
        starts = [np.broadcast_to(launched, (n, samples)) for n, launched, _ in self.stack]
        ready = [np.broadcast_to(launched if r is None else r, (n, samples)) for n, launched, r in self.stack]
        empty = np.empty((0, samples))
        return (np.concatenate(starts) if starts else empty), (np.concatenate(ready) if ready else empty)

    def release(self, count: int, now: np.ndarray, billing: Billing) -> np.ndarray:
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
                od: _Pool, sp: _Pool, new_o: int, new_s: int, offsets: np.ndarray, seed: int
                ) -> tuple[np.ndarray, np.ndarray, SpotBill]:
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
    carried = np.arange(len(start)) < n_od + len(old_start)
    schedule = PositionSchedule(cloud, cloud.spot, seed, shape.index, now, start, up, is_spot, offsets, held=carried)
    latency, startup = d.train_parts(model, shape)
    trained, busy = run_stage(schedule, shape, cloud.gpus_per_instance, ready, latency, startup)
    end = trained + d.sync(model)
    rows = np.flatnonzero(is_spot)
    bill = bill_window(schedule, rows, now, end, cloud.billing, carried)
    # Carry each spot position's incarnation alive (or provisioning) at the SYNC.
    current_start, current_ready = schedule.current(rows, end)
    sp.stack = [(1, current_start[j], current_ready[j]) for j in range(len(rows))]
    return end, busy, bill
