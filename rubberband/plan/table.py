"""Per-stage means of every candidate allocation, from common random numbers.

Stages are separated by barriers, so a plan's mean JCT is the sum of its stages' mean
durations, and (ignoring the rounding of billed time) its mean cost is the sum of per-stage
costs. ``StageTable`` computes those per-stage quantities once for every valid allocation,
from the same ``StageDraws`` that ``simulate`` uses, so the planner can score thousands of
plans with table look-ups and every number it adds up is exactly what a full simulation
with the same seed would average.

Stage ``i``'s mean duration and surrogate cost, holding ``H`` instances after holding
``H'`` in the stage before (``Δ = max(0, H - H')`` new instances):

    D_i(a, Δ) = [Δ > 0] (E[SCALE] + E[max of Δ INIT]) + E[makespan_i(a)] + E[SYNC]
    C_i(a, H, Δ) = p (H · (D_i(a, Δ) + R_i(a)) − Δ · E[SCALE]) + (Δ + H · L_i(a)) · data_usd   (per instance)
    C_i(a)       = p / G · m · E[sum of TRAIN durations_i(a)] + Δ · data_usd                 (per function)

with ``p`` the price per instance-second. The count held before stage 0 is ``H' = 0``, or with
instances held at the start (``held_at_start``, ``start_state``) those of the table's type on
stage 0's market: stage 0 launches only what it needs beyond them, and the ones it does not
keep cost nothing (the simulator releases them at t = 0). ``R`` and ``L`` are 0 unless the stage's spot
instances may be reclaimed: then they are what each instance is billed beyond the stage's
span (replacement overlaps and gaps) and relaunched, from the spot kernel (``StageEntry``).
The true per-instance cost also rounds each instance's billed lifetime up to the granularity
and to at least the minimum, which only adds (at most ``max(granularity_s, minimum_s)`` per
launch): on-demand, the surrogate is a lower bound. ``stage_bounds`` bounds a stage from
below without list scheduling its queue or running the spot kernel, which is what lets the
search (``rubberband.plan.search``) skip most of them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rubberband.errors import SpecError
from rubberband.limits import check_samples_seed, check_table
from rubberband.plan.queue import list_schedule
from rubberband.profiles.cloud import BillingModel, CloudProfile, Market
from rubberband.profiles.model import ModelProfile
from rubberband.simulator.engine import HeldInstances, simulate, stage_models
from rubberband.simulator.model import (
    StageDraws,
    StageShape,
    instances_needed,
    iter_latency,
    redone_iters,
    stage_shape,
)
from rubberband.simulator.result import SimResult
from rubberband.simulator.spot import PositionSchedule, bill_window, run_stage, trace_offsets
from rubberband.spec.experiment import ExperimentSpec


def valid_allocations(num_trials: int, model: ModelProfile, gpus_per_instance: int | None = None) -> list[int]:
    """Allocations that divide a stage's trials fairly (paper §4.3), ascending.

    Factors of ``n`` (trials queue, one GPU each) when the profile has 1 GPU per trial, and
    multiples ``n * m`` for every ``m`` in the profiled range. With ``gpus_per_instance``
    ``G``, queueing on whole instances (``k * G < n`` GPUs) is valid too: those are the
    allocations a static cluster of ``k`` instances gives, so the search covers static plans.
    """
    out = set(_one_gpu_slots(num_trials, gpus_per_instance)) if model.min_gpus == 1 else set()
    out.update(num_trials * m for m in range(model.min_gpus, model.max_gpus + 1))
    return sorted(out)


def _one_gpu_slots(num_trials: int, slots_per_instance: int | None) -> set[int]:
    """Slot counts (1-GPU trials running at once) that divide a stage's trials fairly: the
    factors of ``n``, and for each number of rounds the fewest whole instances that run ``n``
    trials in that many rounds (more slots in the same rounds cost more instances for almost
    no time)."""
    out = {d for d in range(1, num_trials + 1) if num_trials % d == 0}
    if slots_per_instance:
        for rounds in range(2, num_trials + 1):
            a = -(-num_trials // rounds)
            a = -(-a // slots_per_instance) * slots_per_instance
            if a < num_trials:
                out.add(a)
    return out


def fused_allocations(num_trials: int, gpus_per_instance: int, fused_per_gpu: int) -> list[int]:
    """Allocations of a stage whose 1-GPU trials run fused ``F = fused_per_gpu`` to a GPU,
    ascending: the fair slot counts of its ``ceil(n / F)`` groups, one to a GPU (a group is a
    1-GPU trial to the layout, DESIGN §4.5)."""
    return sorted(_one_gpu_slots(-(-num_trials // fused_per_gpu), gpus_per_instance))


def packed_allocations(num_trials: int, gpus_per_instance: int, trials_per_gpu: int) -> list[int]:
    """Allocations of a stage whose 1-GPU trials run ``k = trials_per_gpu`` to a GPU, ascending:
    the fair slot counts of ``k * G`` slots per instance, on ``ceil(slots / k)`` GPUs."""
    slots = _one_gpu_slots(num_trials, gpus_per_instance * trials_per_gpu)
    return sorted({-(-r // trials_per_gpu) for r in slots})


def check_table_size(spec: ExperimentSpec, model: ModelProfile, cloud: CloudProfile,
                     candidates: Sequence[Sequence[int]] | None, samples: int) -> None:
    """Refuse a table too large for memory or time before anything is drawn
    (``rubberband.limits``): every GPU count of the profile caches each stage's TRAIN
    durations, and the widest allocation draws INIT latencies for all its instances. Call it
    with ``candidates=None`` before listing them (a huge profile has millions)."""
    widest = max(instances_needed(s.num_trials, s.num_trials * model.max_gpus, cloud.gpus_per_instance)
                 for s in spec.stages)
    check_table(spec.trials, candidates, model.max_gpus - model.min_gpus + 1, widest, samples)


@dataclass
class StageEntry:
    """Means of one stage under one allocation."""

    allocation: int
    gpus_per_trial: int
    need: int                 # fewest instances
    train_s: float            # E[makespan]
    busy_usd: float           # per-function TRAIN cost, E[m * sum(durations)] * price / G
    # Spot stages that may be reclaimed, per instance held: instance-seconds alive beyond the
    # stage's TRAIN + SYNC (a replacement launched at the notice overlaps the instance it
    # replaces; one that is still provisioning leaves a gap), and replacement launches.
    reclaim_s: float = 0.0
    relaunches: float = 0.0


class StageTable:
    """Per-stage candidate allocations with their mean durations and costs.

    Args:
        spec, model, cloud: the job and its profiles.
        samples, seed: Monte-Carlo samples and root seed (common random numbers).
        allocations: optional candidate allocations per stage (default: ``valid_allocations``,
            ``packed_allocations`` when packed).
        trials_per_gpu: ``k`` 1-GPU trials share each GPU in every stage (packing; 1: none).
        fused_per_gpu: ``F`` 1-GPU trials fused into one program per GPU in every stage (DESIGN
            §4.5; 1: none; not with ``trials_per_gpu``). The stage's groups stand for its trials
            everywhere below (``StageShape.nodes``).
        draws: the random streams of another table with the same seed and samples, to share.
        held_at_start: instances already held when the job starts (``HeldInstances``); every
            plan is weighed, and simulated, starting from them.
        markets: the market of each stage (default: the cloud's market for every stage). A
            stage on a spot market with a reclaim rate has its mean TRAIN makespan from the
            spot kernel (``simulator/spot.py``), on instances fresh at the stage's start, and
            its cost bills the stage's window as the simulator does (replacements that overlap
            or leave gaps, relaunches; ``StageEntry.reclaim_s``): a surrogate within a stated
            tolerance of the full simulation — mean JCT within 2%, mean cost within 3% at
            notices up to 120 s and within 15% at 600 s (fresh instances cut short the notices
            of a stage's first reclaims, so the overlap of a replacement with the instance it
            replaces is undercounted: 7% to 12% at 2 reclaims per hour) — which ``choose`` runs
            on every plan it keeps; on a traced market the stage means are those without
            reclaims. A stage on another market than the one before it
            launches all its instances (the old ones are released at the SYNC).
        max_instances: the most instances of the table's type a stage may hold (``None``: no
            limit): allocations that need more are no candidates, and ``holds`` tells the search
            which held counts it may carry to a later stage.
        target_model: the profile the target stage of a surrogate job runs by (DESIGN §4.6;
            ``model`` is then the surrogate's): its candidates, means and simulations use it.
    """

    # Held counts are plain counts here (``TypeTable`` encodes a type in them).
    state_types = 1

    def __init__(self, spec: ExperimentSpec, model: ModelProfile, cloud: CloudProfile, samples: int = 200,
                 seed: int = 0, allocations: Sequence[Sequence[int]] | None = None,
                 markets: Sequence[Market] | None = None, trials_per_gpu: int = 1,
                 draws: Sequence[StageDraws] | None = None, held_at_start: HeldInstances | int | None = None,
                 max_instances: int | None = None, fused_per_gpu: int = 1,
                 target_model: ModelProfile | None = None, redone: Sequence[int] | None = None):
        self.spec, self.model, self.cloud = spec.validate(), model, cloud
        self.target_model = target_model
        # Each stage's profile: the target stage's is ``target_model`` (``simulate`` checks the pair).
        self.models = stage_models(model, [cloud] * spec.num_stages(), False, spec, target_model)
        # Each stage's TRAIN work is ``iters + redone`` by the simulator's own rule (one function
        # for both, so the table's means are the simulation's: the search stays exact).
        self.redone = tuple(int(r) for r in redone) if redone is not None else redone_iters(spec, self.models)
        self.max_instances = max_instances
        self.held_at_start = HeldInstances.of(held_at_start)
        self.k = int(trials_per_gpu)
        self.fused = int(fused_per_gpu)
        if self.k > 1 and self.fused > 1:
            raise SpecError("fused_per_gpu: a table packs (trials_per_gpu) or fuses, not both; fused and packed "
                            "are exclusive per stage")
        self._shapes: dict[tuple[int, int], StageShape] = {}    # (stage, allocation) -> layout (``shape``)
        check_samples_seed(samples, seed)
        self._check_size(None, samples)
        G = cloud.gpus_per_instance
        base = [allocations[i] if allocations is not None else
                fused_allocations(s.num_trials, G, self.fused) if self.fused > 1 else
                valid_allocations(s.num_trials, self.models[i], G) if self.k == 1 else
                packed_allocations(s.num_trials, G, self.k) for i, s in enumerate(spec.stages)]
        self._candidates: list[list[int]] = []
        for i, stage in enumerate(spec.stages):
            if stage.num_trials < max(self.k, self.fused):
                # Fewer trials than fill one GPU share nothing: such a "packed" stage is only
                # slower, and per-function billing would charge its lone trials 1/k of a GPU.
                # Likewise a "fused" group of fewer than F runs at L_F (DESIGN §4.5): a smaller
                # F, where profiled, is its own variant.
                self._candidates.append([])
                continue
            cands = set(base[i])
            if allocations is None and self.models[i].min_gpus == 1:
                # Queue on exactly as many instances as a neighbouring stage holds: keeping (or
                # pre-launching) them can beat the fewest instances for the rounds.
                for j in (i - 1, i + 1):
                    if 0 <= j < len(base):
                        n_j = spec.stages[j].num_trials
                        cands.update(h * G for h in {self._need(n_j, a) for a in base[j]}
                                     if h * G * self.k < -(-stage.num_trials // self.fused))
            self._candidates.append(sorted(int(a) for a in cands))
        if max_instances is not None:
            self._fit_candidates(max_instances)
        self._check_size(self._candidates, samples)   # before anything is drawn
        self.samples, self.seed = int(samples), int(seed)
        # Another table's streams of the same seed and samples (the same numbers, drawn once).
        self.draws = list(draws) if draws is not None else [StageDraws(seed, i, samples) for i in range(spec.num_stages())]
        self.per_instance = cloud.billing.model is BillingModel.PER_INSTANCE
        self.usd_per_s = cloud.usd_per_second
        self.data_usd = cloud.data.usd_per_launch
        # Stage means per market, shared by every table ``for_markets`` derives from this one.
        self._entries_by_market: dict[Market, list[dict[int, StageEntry]]] = {m: [{} for _ in spec.stages] for m in Market}
        self._bounds_by_market: dict[Market, list[dict[int, tuple[float, float]]]] = {m: [{} for _ in spec.stages] for m in Market}
        self._bound_entries: dict[Market, list[dict[int, StageEntry]]] = {m: [{} for _ in spec.stages] for m in Market}
        self.sync_s = [float(d.sync(m).mean()) for d, m in zip(self.draws, self.models)]
        self.scale_s = [float(d.scale(cloud).mean()) for d in self.draws]
        self._init_cache: dict[tuple[int, int], float] = {}
        self._init_arrays: dict[int, np.ndarray] = {}     # per stage: init_s for 0, 1, 2, ... (init_means)
        # Per (stage, GPUs per trial): the slowest and the summed TRAIN duration, per sample.
        self._work_stats: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        # Full simulations by (markets, allocation, held), shared by every table derived from this one.
        self._simulations: dict[tuple, SimResult] = {}
        self._queue_bounds: dict[tuple[int, int], float] = {}     # market-free: shared too
        self._longest_means: dict[tuple[int, int], float] = {}    # train_s without reclaims, per (stage, GPUs per trial)
        self._set_markets(tuple(markets) if markets is not None else (cloud.market,) * spec.num_stages())

    def _check_size(self, candidates: Sequence[Sequence[int]] | None, samples: int) -> None:
        """``check_table_size`` for the tuning stages by ``model`` and the target stage by its own."""
        target = self.spec.target_stage
        if target is None:
            check_table_size(self.spec, self.model, self.cloud, candidates, samples)
            return
        cands = [None, None] if candidates is None else [candidates[:target], candidates[target:]]
        if target:
            check_table_size(self.spec.tuning, self.model, self.cloud, cands[0], samples)
        check_table_size(ExperimentSpec(self.spec.stages[target:]), self.models[target], self.cloud, cands[1], samples)

    def _fit_candidates(self, cap: int) -> None:
        """Keep the candidates whose fewest instances fit ``cap``; one line when a stage has none left."""
        for i, cands in enumerate(self._candidates):
            fit = [a for a in cands if self.need(i, a) <= cap]
            if cands and not fit:
                least = min(self.need(i, a) for a in cands)
                raise SpecError(f"max_instances: stage {i} ({self.spec.stages[i].num_trials} trials) needs at least "
                                f"{least} {self.cloud.instance_type} instances, more than the {cap} allowed; "
                                "allow more instances of the type (e.g. the cluster's max_workers)")
            self._candidates[i] = fit

    def holds(self, count: int) -> bool:
        """Whether a stage may hold ``count`` instances of the table's type (``max_instances``)."""
        return self.max_instances is None or count <= self.max_instances

    def _set_markets(self, markets: tuple[Market, ...]) -> None:
        cloud = self.cloud
        if len(markets) != self.spec.num_stages():
            raise SpecError(f"markets: expected {self.spec.num_stages()} markets, one per stage, got {len(markets)}")
        if Market.SPOT in markets and cloud.spot_price_usd_per_hour is None:
            raise SpecError(f"market: {cloud.instance_type} has no spot_price_usd_per_hour; plan on-demand only")
        self.markets = markets
        prices = {Market.ON_DEMAND: cloud.price_usd_per_hour / 3600.0,
                  Market.SPOT: (cloud.spot_price_usd_per_hour or 0.0) / 3600.0}
        # Per stage: the price per instance-second, and whether its instances may be reclaimed.
        self.stage_usd_per_s = [cloud.usd_per_second if m is cloud.market else prices[m] for m in markets]
        # A zone's trace is replayed from the job's start, so one stage alone has no fair
        # start in it: stages on a traced market take the no-reclaim means (optimistic), and
        # ``choose`` judges every plan it keeps in full simulation.
        self.reclaimed = [m is Market.SPOT and cloud.spot.at_risk and cloud.spot.trace is None for m in markets]
        self.entries: list[dict[int, StageEntry]] = [self._entries_by_market[m][i] for i, m in enumerate(markets)]
        self._optimistic = False
        self.fast_s: list[float] = []     # per stage: a lower bound on its mean TRAIN + SYNC (no queue)
        for i in range(self.spec.num_stages()):
            parallel = [a for a in self._candidates[i] if self.parallel(i, a)] or self._candidates[i]
            self._longest_together(i, parallel)
            self.fast_s.append(min((self._duration_bound(i, a) for a in parallel), default=math.inf))

    def _duration_bound(self, i: int, allocation: int) -> float:
        """``stage_bounds(i, allocation)[0]``, without building the entry of an allocation that
        runs every trial at once (``train_s``: the same number)."""
        if self._shared_makespan(i, allocation):
            return self.train_s(i, allocation) + self.sync_s[i]
        return self.stage_bounds(i, allocation)[0]

    def _shared_makespan(self, i: int, allocation: int) -> bool:
        """Whether stage ``i``'s mean makespan under ``allocation`` is still to come, and comes
        from the slowest trial alone: every trial at once, on instances never reclaimed."""
        return allocation not in self.entries[i] and self.parallel(i, allocation) and not self.reclaimed[i]

    def _longest_together(self, i: int, allocations: Sequence[int]) -> None:
        """``train_s`` of the allocations of stage ``i`` that run every trial at once, formed
        together (``StageDraws.train_longest_many``: the same numbers) and kept."""
        shapes = {}
        for a in allocations:
            if self._shared_makespan(i, a):
                shape = self.shape(i, a)
                if (i, shape.gpus_per_trial) not in self._longest_means:
                    shapes[shape.gpus_per_trial] = shape
        if len(shapes) > 1:
            for shape, longest in zip(shapes.values(),
                                      self.draws[i].train_longest_many(self.models[i], list(shapes.values()))):
                self._longest_means[(i, shape.gpus_per_trial)] = float(longest.mean())

    def train_s(self, i: int, allocation: int) -> float:
        """``entry(i, allocation).train_s``. Where every trial runs at once on instances never
        reclaimed, without building the entry: the mean of the slowest trial's duration per
        sample (``StageDraws.train_longest``, the numbers ``entry`` takes the mean of), with no
        pass over the trials — what lets ``stage_options`` under per-instance billing, which
        compares makespans alone, skip the summed durations of the allocations it drops."""
        if not self._shared_makespan(i, allocation):
            return self.entry(i, allocation).train_s
        shape = self.shape(i, allocation)
        key = (i, shape.gpus_per_trial)
        if key not in self._longest_means:
            self._longest_means[key] = float(self.draws[i].train_longest(self.models[i], shape).mean())
        return self._longest_means[key]

    def train_s_cheap(self, i: int, allocation: int) -> bool:
        """Whether ``train_s(i, allocation)`` is known or cheap: no queue to list schedule and no
        spot kernel to run (an optimistic view takes those at their bounds)."""
        return self._optimistic or self.simulated_cheaply(i, allocation)

    def train_bound(self, i: int, allocation: int) -> float:
        """A lower bound on ``train_s(i, allocation)`` without list scheduling a queue or running
        the spot kernel (``_train_bounds``: per sample, the slowest trial and the work per slot)."""
        return self._train_bounds(i, self.shape(i, allocation))[0]

    def simulate(self, allocation: Sequence[int], held: Sequence[int]) -> SimResult:
        """The full simulation of a plan on this table's random numbers and markets (once)."""
        key = (self.markets, tuple(int(a) for a in allocation), tuple(int(h) for h in held))
        if key not in self._simulations:
            self._simulations[key] = simulate(self.spec, key[1], self.model, self.cloud, samples=self.samples,
                                              seed=self.seed, instances=key[2], draws=self.draws,
                                              spot_instances=self.spot_instances(key[2]),
                                              trials_per_gpu=(self.k,) * self.num_stages if self.k > 1 else None,
                                              held_at_start=self.held_at_start,
                                              fused_per_gpu=(self.fused,) * self.num_stages if self.fused > 1 else None,
                                              target_model=self.target_model, redone=self.redone)
        return self._simulations[key]

    def simulated(self, allocation: Sequence[int], held: Sequence[int]) -> SimResult | None:
        """The full simulation of a plan if ``simulate`` ran it already, else ``None``."""
        return self._simulations.get((self.markets, tuple(int(a) for a in allocation), tuple(int(h) for h in held)))

    def for_markets(self, markets: Sequence[Market]) -> StageTable:
        """This table with other markets per stage, sharing its random numbers and stage means."""
        other = copy.copy(self)
        other._set_markets(tuple(markets))
        return other

    @property
    def num_stages(self) -> int:
        return len(self.entries)

    def candidates(self, stage: int, deadline_s: float = float("inf")) -> list[int]:
        """The valid allocations of a stage, ascending; with a deadline, without queued
        allocations that cannot meet it even if every other stage ran at its fastest
        (their queues are never simulated)."""
        if deadline_s == float("inf"):
            return self._candidates[stage]
        others = sum(self.fast_s) - self.fast_s[stage]
        return [a for a in self._candidates[stage]
                if self.parallel(stage, a) or a in self.entries[stage]
                or self.queue_bound_s_stage(stage, a) + others <= deadline_s]

    def parallel(self, stage: int, allocation: int) -> bool:
        """Whether every trial (or fused group) of the stage runs at once under ``allocation`` (no queue)."""
        return allocation * self.k >= -(-self.spec.stages[stage].num_trials // self.fused)

    def shape(self, i: int, allocation: int):
        """Stage ``i``'s layout under ``allocation`` (and the table's trials per GPU), laid out once:
        it depends on the stage, the allocation, the model, the cloud and ``k`` alone, all fixed
        for a table (``tail`` with another model builds a table, and a cache, of its own)."""
        key = (i, int(allocation))
        shape = self._shapes.get(key)
        if shape is None:
            stage = self.spec.stages[i]
            shape = self._shapes[key] = stage_shape(i, stage.num_trials, stage.iters, key[1], self.models[i],
                                                    self.cloud, self.k, self.fused, self.redone[i])
        return shape

    def queue_bound_s_stage(self, i: int, allocation: int) -> float:
        """Lower bound on stage ``i``'s mean duration, without simulating it: its average load
        per GPU slot, ``nodes * E[duration] / slots``, plus the SYNC (nodes: trials or fused groups)."""
        key = (i, int(allocation))
        if key not in self._queue_bounds:
            self._queue_bounds[key] = self._queue_bound(i, allocation)
        return self._queue_bounds[key]

    def _queue_bound(self, i: int, allocation: int) -> float:
        shape = self.shape(i, allocation)
        slots = shape.running
        model = self.models[i]
        duration = model.trial_startup_s.mean + shape.iters * iter_latency(model, shape).mean
        return shape.nodes * duration / slots + self.sync_s[i]

    def tail(self, first: int, held_at_start: HeldInstances | int | None = None,
             model: ModelProfile | None = None) -> StageTable:
        """The table of stages ``first..`` alone, for a re-plan at the SYNC ending stage
        ``first - 1`` while ``held_at_start`` is held: exactly what a table built from scratch for
        the remaining stages is with this table's random numbers of them,

            StageTable(remaining, model, cloud, samples, seed, markets=markets[first:],
                       trials_per_gpu=k, draws=self.draws[first:], held_at_start=held_at_start,
                       max_instances=max_instances, fused_per_gpu=F, redone=redone[first:])

        (``remaining``: stages ``first..`` with their brackets; ``redone``: this table's, counted
        over the whole job, so a trial resumed at ``first`` redoes what it would), built so, but warm: it reads this
        table's draws (its TRAIN normals, INIT maxima, SCALE and SYNC, never drawn again) and, on
        the same ``model``, shares its stage means, bounds and TRAIN statistics of those stages
        (the same numbers, as they depend on a stage's draws, shape and market alone, never on
        what is held), so no queue this table list scheduled is scheduled again. A corrected
        ``model`` (other latencies) shares the draws only: every normal latency still reads the
        stage's one draw of standard normals. Stage means of a market whose instances may be
        reclaimed are not shared (the spot kernel's streams follow a stage's index in its job).

        The closed loop's ``Replanner`` (``rubberband.scheduler``) calls it at the SYNC ending
        stage ``s``, on the table the running plan was compiled on::

            sub = table.tail(s + 1, HeldInstances(instances[s], spot[s], type), model=corrected)
            plan = plan_on_table(sub, deadline_s - now, policy, confidence)

        and keeps ``sub`` for the next SYNC (``sub.tail(1, ...)``). Its numbers are then those of
        the job's own stages, not of a fresh seed: the same distribution, and one stream per stage
        for the whole run.
        """
        n = self.num_stages
        if isinstance(first, bool) or not isinstance(first, (int, np.integer)) or not 0 <= first < n:
            raise SpecError(f"first: expected a stage index in 0..{n - 1} to re-plan from, got {first!r}")
        first, spec = int(first), self.spec
        remaining = ExperimentSpec(spec.stages[first:], tuple(b - first for b in spec.bracket_starts if b > first),
                                   spec.eta)
        same = model is None or model == self.model
        out = StageTable(remaining, self.model if same else model, self.cloud, self.samples, self.seed,
                         markets=self.markets[first:], trials_per_gpu=self.k, draws=self.draws[first:],
                         held_at_start=held_at_start, max_instances=self.max_instances, fused_per_gpu=self.fused,
                         target_model=self.target_model if remaining.target_stage is not None else None,
                         redone=self.redone[first:])
        if same:
            at_risk = self.cloud.spot.at_risk and self.cloud.spot.trace is None
            for market in Market:
                if market is Market.SPOT and at_risk:
                    continue
                for shared in ("_entries_by_market", "_bounds_by_market", "_bound_entries"):
                    mine, theirs = getattr(self, shared)[market], getattr(out, shared)[market]
                    for j in range(len(theirs)):
                        mine[first + j].update(theirs[j])      # anything the new table has already
                        theirs[j] = mine[first + j]           # one dict, grown by both
            out._work_stats.update({(i - first, m): v for (i, m), v in self._work_stats.items() if i >= first})
            out._longest_means.update({(i - first, m): v for (i, m), v in self._longest_means.items() if i >= first})
            out._set_markets(out.markets)       # its entries are the shared dicts now
        return out

    def optimistic(self) -> StageTable:
        """This table with every allocation that is not ``simulated_cheaply`` taken at its lower
        bounds (``stage_bounds``) instead of being simulated: a first, cheap pass of a search
        (its plans are real plans; only their table values are optimistic)."""
        view = copy.copy(self)
        view.entries = [dict(e) for e in self.entries]
        view._optimistic = True
        return view

    def entry(self, i: int, allocation: int) -> StageEntry:
        """Means of stage ``i`` under ``allocation`` (any valid GPU count; computed once)."""
        entry = self.entries[i].get(allocation)
        if entry is None and self._optimistic and not self.simulated_cheaply(i, allocation):
            bounds = self._bound_entries[self.markets[i]][i]     # shared by every optimistic view
            entry = bounds.get(allocation)
            if entry is None:
                shape = self.shape(i, allocation)
                train, busy = self._train_bounds(i, shape)
                entry = bounds[int(allocation)] = StageEntry(int(allocation), shape.gpus_per_trial,
                                                             shape.instances_needed, train, busy)
            self.entries[i][int(allocation)] = entry
        if entry is None:
            shape = self.shape(i, allocation)
            reclaim_s = relaunches = 0.0
            if self.reclaimed[i]:
                makespan, total, reclaim_s, relaunches = self._spot_train(i, shape)
            elif self.parallel(i, allocation):
                # Every trial at once: the slowest trial, from the stage's shared draws (train_stats).
                makespan, total = self._stats(i, shape)
            else:
                # StageDraws.train's numbers, with a queue list scheduled a round at a time.
                durations = self.draws[i].train_durations(self.models[i], shape)
                total = durations.sum(axis=0)
                makespan = list_schedule(durations, shape.running)
            busy = float(total.mean()) * shape.gpu_share * self.stage_usd_per_s[i] / self.cloud.gpus_per_instance
            entry = StageEntry(int(allocation), shape.gpus_per_trial, shape.instances_needed, float(makespan.mean()), busy,
                               reclaim_s, relaunches)
            self.entries[i][int(allocation)] = entry
            self._entries_by_market[self.markets[i]][i][int(allocation)] = entry   # shared (an optimistic view's are copies)
        return entry

    def _spot_train(self, i: int, shape) -> tuple[np.ndarray, np.ndarray, float, float]:
        """TRAIN makespan and summed TRAIN time of stage ``i`` on spot instances that may be
        reclaimed, started together and fresh at the stage's start, with what its instances
        are billed beyond ``instances * (TRAIN + SYNC)`` and relaunched, per instance (see
        ``StageEntry``): the stage's window billed as the simulator bills it."""
        samples = self.samples
        need = shape.instances_needed
        zeros = np.zeros((need, samples))
        schedule = PositionSchedule(self.cloud, self.cloud.spot, self.seed, i, np.zeros(samples), zeros, zeros,
                                    np.ones(need, dtype=bool), trace_offsets(self.cloud.spot, self.seed, samples),
                                    held=np.full(need, i > 0))        # stage 0 launches its instances; later ones hold them
        latency, startup = self.draws[i].train_parts(self.models[i], shape)
        makespan, total = run_stage(schedule, shape, self.cloud.gpus_per_instance, np.zeros(samples), latency, startup,
                                    rounds=True)
        end = makespan + self.draws[i].sync(self.models[i])
        bill = bill_window(schedule, np.arange(need), np.zeros(samples), end, self.cloud.billing, np.zeros(need, dtype=bool))
        return (makespan, total, float((bill.instance_seconds - need * end).mean()) / need,
                float(bill.launches.mean()) / need)

    @property
    def start_state(self) -> int:
        """The count held before stage 0 that it may keep: the instances held at the start of
        this table's type on stage 0's market (0 when none)."""
        if self.held_at_start is None:
            return 0
        on_demand, spot = self.held_at_start.of_type(self.cloud.instance_type)
        return spot if self.markets[0] is Market.SPOT else on_demand

    def previous_held(self, i: int, previous):
        """What stage ``i`` keeps of the instances held before it: nothing across a market switch."""
        if i > 0 and self.markets[i] != self.markets[i - 1]:
            return previous * 0
        return previous

    def plan_fields(self, allocation: Sequence[int], held: Sequence[int]) -> dict:
        """A plan's ``Plan`` fields: allocation, instances, cloud, spot instances, trials per GPU,
        trials fused per GPU."""
        return {"allocation": tuple(int(a) for a in allocation), "instances": tuple(int(h) for h in held),
                "cloud": self.cloud, "spot_instances": self.spot_instances(held),
                "trials_per_gpu": (self.k,) * self.num_stages if self.k > 1 else (),
                "fused_per_gpu": (self.fused,) * self.num_stages if self.fused > 1 else ()}

    def spot_instances(self, held: Sequence[int]) -> tuple[int, ...]:
        """Spot instances per stage of a plan holding ``held`` on this table's markets."""
        return tuple(h if m is Market.SPOT else 0 for h, m in zip(held, self.markets))

    def need(self, stage: int, allocation: int) -> int:
        """Fewest instances stage ``stage`` needs under ``allocation``."""
        return self._need(self.spec.stages[stage].num_trials, allocation)

    def _need(self, num_trials: int, allocation: int) -> int:
        return instances_needed(num_trials, allocation, self.cloud.gpus_per_instance, self.k, self.fused)

    def init_s(self, stage: int, new: int) -> float:
        """E[max of ``new`` INIT draws] of a stage (0 when nothing is launched)."""
        if new <= 0:
            return 0.0
        key = (stage, new)
        if key not in self._init_cache:
            self._init_cache[key] = float(self.draws[stage].init_max(self.cloud, new).mean())
        return self._init_cache[key]

    def init_means(self, stage: int, upto: int) -> np.ndarray:
        """``init_s(stage, n)`` for every ``n`` from 0 to ``upto``, as one array (the same numbers:
        each row's mean, taken for all rows at once). Grown on demand and kept."""
        have = self._init_arrays.get(stage, np.zeros(1))
        if len(have) <= upto:
            draws, count = self.draws[stage], upto + 1 - len(have)
            if self.cloud.init_latency_s.is_constant:       # every count's row is a constant
                means = np.array([float(draws.init_max(self.cloud, n).mean()) for n in range(len(have), upto + 1)])
            else:
                draws.init_max(self.cloud, upto)        # the most rows first: a larger count draws them all again
                means = np.array([draws.init_max(self.cloud, n) for n in range(len(have), upto + 1)]).mean(axis=1)
            have = self._init_arrays[stage] = np.r_[have, means]
        return have

    def stage(self, i: int, allocation: int, held: int, previous: int) -> tuple[float, float]:
        """Mean duration and surrogate cost of stage ``i`` (see the module docstring)."""
        train_s, reclaim_s, relaunches, busy_usd = self._terms(i, allocation)
        new = max(0, held - self.previous_held(i, previous))
        duration = train_s + self.sync_s[i]
        if new:
            duration += self.scale_s[i] + self.init_s(i, new)
        if self.per_instance:
            cost = self.stage_usd_per_s[i] * (held * (duration + reclaim_s) - new * self.scale_s[i])
        else:
            cost = busy_usd
        return duration, cost + (new + held * relaunches) * self.data_usd

    def _terms(self, i: int, allocation: int) -> tuple[float, float, float, float]:
        """What ``stage`` reads of ``entry(i, allocation)``: ``train_s``, ``reclaim_s``,
        ``relaunches`` and ``busy_usd``. Under per-instance billing on a stage never reclaimed
        only ``train_s`` counts (the others are 0, ``busy_usd`` unused), and ``train_s`` gives it
        without summing the TRAIN durations where every trial runs at once: the same number
        (``train_s``'s docstring), so every value is the entry's."""
        if self.per_instance and not self.reclaimed[i]:
            return self.train_s(i, allocation), 0.0, 0.0, math.nan
        entry = self.entry(i, allocation)
        return entry.train_s, entry.reclaim_s, entry.relaunches, entry.busy_usd

    def stage_grid(self, i: int, allocations: np.ndarray, held: np.ndarray,
                   previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``stage`` for many plans at once: rows are the ``previous`` held counts, columns
        the options (``allocations[j]`` holding ``held[j]`` instances)."""
        return self.stage_many(i, allocations[None, :], held[None, :], previous[:, None])

    def stage_many(self, i: int, allocations: np.ndarray, held: np.ndarray,
                   previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``stage`` for arrays of plans, broadcast together: the same formulas, in the same
        order, so every value equals ``stage``'s."""
        distinct, column = np.unique(np.ravel(allocations), return_inverse=True)
        column = column.reshape(np.shape(allocations))
        terms = np.array([self._terms(i, int(a)) for a in distinct]).reshape(len(distinct), 4).T
        new = np.maximum(0, held - self.previous_held(i, previous))
        init = self.init_means(i, int(new.max()))
        duration = terms[0][column] + self.sync_s[i]
        duration = duration + np.where(new > 0, self.scale_s[i] + init[new], 0.0)
        # A term that is 0 everywhere is left out: adding (or multiplying by) it would change no
        # number (every value is finite), only cost a pass over the (states x options) grid.
        if self.per_instance:
            billed = duration + terms[1][column] if terms[1].any() else duration
            cost = self.stage_usd_per_s[i] * (held * billed - new * self.scale_s[i])
        else:
            cost = np.broadcast_to(terms[3][column], duration.shape)
        if self.data_usd == 0.0:
            return duration, cost + 0.0
        launches = new + held * terms[2][column] if terms[2].any() else new
        return duration, cost + launches * self.data_usd

    def evaluate_many(self, allocations: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``evaluate`` for many plans, one per row of ``allocations`` and ``held`` (same values)."""
        jct = np.zeros(len(allocations))
        cost = np.zeros(len(allocations))
        previous = np.full(len(allocations), self.start_state, dtype=np.int64)
        for i in range(self.num_stages):
            d, c = self.stage_many(i, allocations[:, i], held[:, i], previous)
            jct = jct + d
            cost = cost + c
            previous = held[:, i]
        return jct, cost

    def cost_floor(self, allocation: Sequence[int], held: Sequence[int]) -> float:
        """A lower bound on the mean billed cost of a plan's full simulation, at least its
        surrogate: the surrogate plus, per instance launched, what the billing minimum adds to
        its mean life (``cost_floors`` for one plan)."""
        return float(self.cost_floors(np.array([allocation], dtype=np.int64), np.array([held], dtype=np.int64))[0])

    def cost_floors(self, allocations: np.ndarray, held: np.ndarray) -> np.ndarray:
        """``cost_floor`` of many plans, one per row of ``allocations`` and ``held``.

        An instance is billed ``max(minimum_s, ceil(L))`` for a life ``L`` (the end of the SCALE
        that launched it to the end of the SYNC after which it is released, newest first), so
        ``E[billed] >= max(minimum_s, E[L]) = E[L] + max(0, minimum_s - E[L])`` (Jensen: ``max``
        is convex; rounding up only adds). The surrogate (``evaluate_many``'s cost) bills exactly
        ``E[L]`` per instance, and ``E[L]`` is a sum of stage means from the table: the launching
        stage's mean duration less its mean SCALE, plus every later stage's while the instance
        is held. Instances held at the start are billed as launched ``minimum_s`` earlier:
        nothing is added for them. Where a stage's spot instances may be reclaimed
        (incarnations, waits for capacity) or billing is per function, it is the surrogate alone."""
        allocations, held = np.asarray(allocations, dtype=np.int64), np.asarray(held, dtype=np.int64)
        plans, n = held.shape
        durations, kept = np.zeros((n, plans)), np.zeros((n, plans), dtype=np.int64)
        cost = np.zeros(plans)
        previous = np.full(plans, self.start_state, dtype=np.int64)
        for i in range(n):          # evaluate_many, keeping each stage's duration
            d, c = self.stage_many(i, allocations[:, i], held[:, i], previous)
            durations[i], kept[i] = d, np.minimum(self.previous_held(i, previous), held[:, i])
            cost = cost + c
            previous = held[:, i]
        minimum = self.cloud.billing.minimum_s
        at_risk = self.cloud.spot.at_risk and Market.SPOT in self.markets
        if not self.per_instance or at_risk or minimum <= 0:
            return cost
        topup = np.zeros(plans)
        for j in range(n):
            first, top = kept[j], held[:, j].copy()      # stage j launches positions first..top-1
            life = durations[j] - self.scale_s[j]
            for r in range(j, n):
                if r + 1 < n and self.markets[r + 1] is self.markets[r]:
                    still = np.maximum(first, np.minimum(top, held[:, r + 1]))
                else:
                    still = first        # a market switch or the end releases every one
                gone = top - still       # released at stage r's SYNC
                topup += np.where(gone > 0, gone * self.stage_usd_per_s[j] * np.maximum(0.0, minimum - life), 0.0)
                top = still
                if r + 1 < n:
                    life = life + durations[r + 1]
        return cost + topup

    def evaluate(self, allocation: Sequence[int], held: Sequence[int] | None = None) -> tuple[float, float]:
        """Mean JCT and surrogate mean cost of a whole plan, by adding up its stages."""
        held = [self.need(i, a) for i, a in enumerate(allocation)] if held is None else held
        jct = cost = 0.0
        previous = self.start_state
        for i, (a, h) in enumerate(zip(allocation, held)):
            d, c = self.stage(i, a, h, previous)
            jct += d
            cost += c
            previous = h
        return jct, cost

    def simulated_cheaply(self, i: int, allocation: int) -> bool:
        """Whether stage ``i``'s means under ``allocation`` are known, or cost no more than
        drawing its TRAIN durations: every trial runs at once, on instances never reclaimed (a
        queue is list scheduled, a stage that may be reclaimed runs the spot kernel)."""
        return (allocation in self._entries_by_market[self.markets[i]][i]
                or (self.parallel(i, allocation) and not self.reclaimed[i]))

    def stage_bounds(self, i: int, allocation: int) -> tuple[float, float]:
        """Lower bounds on stage ``i``'s mean duration and surrogate cost under ``allocation``,
        whatever instances it holds or launches (SCALE, INIT and data only add), from the
        same random numbers, without list scheduling a queue or running the spot kernel
        (``_train_bounds``). On a stage that may be reclaimed, its instances are alive at least
        while they train (``busy_usd`` at the instance price), whatever the gaps and overlaps
        of replacements."""
        cache = self._bounds_by_market[self.markets[i]][i]
        if allocation not in cache:
            cache[allocation] = self._stage_bounds(i, allocation)
        return cache[allocation]

    def _stage_bounds(self, i: int, allocation: int) -> tuple[float, float]:
        if self.simulated_cheaply(i, allocation):
            train_s, reclaim_s, _, busy_usd = self._terms(i, allocation)      # the entry's numbers
            duration = train_s + self.sync_s[i]
            if self.per_instance:
                return duration, self.stage_usd_per_s[i] * self.need(i, allocation) * max(0.0, duration + reclaim_s)
            return duration, busy_usd
        train, busy = self._train_bounds(i, self.shape(i, allocation))
        duration = train + self.sync_s[i]
        if self.per_instance and not self.reclaimed[i]:
            return duration, self.stage_usd_per_s[i] * self.need(i, allocation) * duration
        return duration, busy

    def stage_floor(self, i: int) -> np.ndarray:
        """Per sample, a lower bound on stage ``i``'s duration under any of its allocations: the
        least over them of ``_train_bounds``' per-sample bound, plus the SYNC (SCALE, INIT,
        queues and reclaims only add)."""
        floor = np.full(self.samples, np.inf)
        for a in self._candidates[i]:
            shape = self.shape(i, a)
            longest, total = self._stats(i, shape)
            floor = np.minimum(floor, np.maximum(longest, total / shape.running))
        return floor + self.draws[i].sync(self.models[i])

    def _stats(self, i: int, shape) -> tuple[np.ndarray, np.ndarray]:
        """The slowest and the summed TRAIN duration of stage ``i`` per sample, for its GPUs per trial."""
        key = (i, shape.gpus_per_trial)
        stats = self._work_stats.get(key)
        if stats is None:
            stats = self._work_stats[key] = self.draws[i].train_stats(self.models[i], shape)
        return stats

    def _train_bounds(self, i: int, shape) -> tuple[float, float]:
        """Lower bounds on a stage's mean TRAIN makespan and its ``busy_usd``. Its trials run on
        ``r = min(a, n)`` GPUs at a time, each at least as long as without reclaims (a reclaim
        only adds lost work and a restart), so in every sample the makespan is at least the
        slowest trial's duration and the work per GPU, ``max(max_j d_j, sum_j d_j / r)``."""
        longest, total = self._stats(i, shape)
        train = float(np.maximum(longest, total / shape.running).mean())
        busy = float(total.mean()) * shape.gpu_share * self.stage_usd_per_s[i] / self.cloud.gpus_per_instance
        return train, busy
