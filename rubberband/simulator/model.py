"""The execution and cost model of DESIGN §4, one stage at a time, vectorised over samples.

A plan gives stage ``i`` an allocation of ``a_i`` GPUs for its ``n_i`` trials of ``k_i``
iterations. With ``G`` GPUs per instance:

* GPUs per trial: ``m = floor(a / n)`` if ``a >= n``, else ``m = 1`` and each of the ``a``
  GPUs runs one trial at a time, taking the next queued trial as soon as it frees up.
* Instances: trials with ``m <= G`` pack ``floor(G / m)`` to an instance; a trial with
  ``m > G`` takes ``ceil(m / G)`` whole instances. A stage holds the fewest instances that
  fit its running trials, unless the plan says more.
* A stage that needs more instances than are held starts with one SCALE (provider
  queueing, one draw) and one INIT_INSTANCE per new instance; its trials start once every
  new instance is ready. TRAIN of a trial lasts ``trial_startup_s + k * L`` with ``L`` drawn
  once per TRAIN node from ``iter_latency_s(m)``; a SYNC follows the last TRAIN.
* Packing (``k = trials_per_gpu > 1``, only when ``m = 1``): up to ``a * k`` trials run at
  once, ``k`` to a GPU (slots filled GPU by GPU, ``k * G`` to an instance), the rest queued;
  every TRAIN of the stage draws ``L`` from ``packed_latency(k)``, also when its GPU happens
  to hold fewer trials (the tail of a queue). ``k = 1`` is the unpacked model exactly.
* Fusion (``F = fused_per_gpu > 1``, only when ``m = 1``; DESIGN §4.5): the ``n`` trials form
  ``g = ceil(n / F)`` groups of ``F`` in trial order (the last may hold fewer), each trained as
  one program on one GPU: one TRAIN node per group, ``trial_startup_s + iters * L_F`` with
  ``L_F`` drawn once per group from ``fused_latency(F)`` (the last group's too). Groups take
  the place of trials everywhere else: ``min(g, a)`` run at once, one to a GPU, the rest queued.
  ``F = 1`` is the unfused model exactly.
* Per-instance billing: an instance is billed from the end of the SCALE that launched it
  until the SYNC after which it is released (most recently launched first), rounded up to
  ``granularity_s`` and at least ``minimum_s``. Per-function billing charges only TRAIN
  work: ``m * duration * price / G`` (``duration * price / (k * G)`` packed; a fused group
  holds one GPU, ``duration * price / G``, so each of ``F`` members pays ``1 / F``). Each launch costs ``dataset_gb * price_usd_per_gb``.
* Redone iterations (a function trainable that checkpoints every ``c`` reports; DESIGN §4):
  a stage that resumes its trials trains ``iters + r`` iterations per TRAIN, with
  ``r = D mod c`` (``D`` when it never checkpoints) and ``D`` the iterations each trial
  trained before the stage in its bracket (``redone_iters``). ``c = 1`` is the model without it.

Random numbers are common across plans: every (seed, stage, component) has its own
stream, and the j-th trial or j-th new instance of a stage always reads the j-th row of
it, so two plans that differ in one stage see identical draws everywhere else. That is
what lets the planner compare candidates fairly and add up per-stage means exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rubberband.errors import SpecError
from rubberband.profiles.cloud import Billing, CloudProfile
from rubberband.profiles.distributions import Distribution
from rubberband.profiles.model import ModelProfile
from rubberband.spec.experiment import ExperimentSpec

# Stream ids of the per-stage random components.
_SCALE, _INIT, _TRAIN, _STARTUP, _SYNC, _RESTART = range(6)
# Elements per block when ``StageDraws.train_stats`` forms durations (a buffer that stays in cache).
_BLOCK = 1 << 16


def gpus_per_trial(num_trials: int, allocation: int) -> int:
    """``m``: ``floor(a / n)`` when every trial can run at once, else 1 (trials queue)."""
    return allocation // num_trials if allocation >= num_trials else 1


def fused_groups(num_trials: int, fused_per_gpu: int = 1) -> int:
    """TRAIN nodes of a stage: its trials, or ``ceil(n / F)`` fused groups of ``F`` (DESIGN §4.5)."""
    return -(-num_trials // fused_per_gpu)


def running_trials(num_trials: int, allocation: int, trials_per_gpu: int = 1, fused_per_gpu: int = 1) -> int:
    """How many TRAIN nodes run at the same time: all of them, or ``k`` per GPU when they queue
    (``k = trials_per_gpu``, 1 unless the stage packs); fused, ``min(g, a)`` groups, one per GPU."""
    return min(fused_groups(num_trials, fused_per_gpu), allocation * trials_per_gpu)


def instances_needed(num_trials: int, allocation: int, gpus_per_instance: int, trials_per_gpu: int = 1,
                     fused_per_gpu: int = 1) -> int:
    """Fewest instances that hold the stage's running trials with each trial's workers together
    (packed trials: ``k`` to a GPU, so ``k * G`` to an instance; fused groups: one to a GPU)."""
    m = gpus_per_trial(num_trials, allocation)
    slots = running_trials(num_trials, allocation, trials_per_gpu, fused_per_gpu)
    if m <= gpus_per_instance:
        return math.ceil(slots / (gpus_per_instance // m * trials_per_gpu))
    return slots * math.ceil(m / gpus_per_instance)


def billed_seconds(lifetime: npt.ArrayLike, billing: Billing) -> np.ndarray:
    """Billed seconds of instances alive ``lifetime`` seconds: rounded up to the billing
    granularity, and at least the billing minimum (DESIGN §4)."""
    g = billing.granularity_s
    rounded = np.ceil(np.round(np.asarray(lifetime, dtype=float) / g, 9)) * g
    return np.maximum(rounded, billing.minimum_s)


def redone_iters(spec: ExperimentSpec, models: ModelProfile | Sequence[ModelProfile]) -> tuple[int, ...]:
    """``r_i`` per stage: the iterations each trial of stage ``i`` trains again on resuming,
    ``model.redone_after(D_i)`` = ``D_i mod c`` (``D_i`` when it never checkpoints), where
    ``D_i = iters_b + ... + iters_{i-1}`` is what it trained before stage ``i`` since its
    bracket's first stage ``b`` (0 at a bracket start: fresh trials redo nothing).

    Args:
        spec: the job (an ``ExperimentSpec``: its stages and ``bracket_starts``).
        models: the model profile, or one per stage (each stage's ``checkpoint_every``).
    """
    per_stage = [models] * len(spec.stages) if isinstance(models, ModelProfile) else list(models)
    out, done = [], 0
    for i, (stage, model) in enumerate(zip(spec.stages, per_stage)):
        if i in spec.bracket_starts:
            done = 0
        # A surrogate job's target stage starts from scratch (DESIGN §4.6): nothing to redo.
        out.append(0 if i == spec.target_stage else model.redone_after(done))
        done += stage.iters
    return tuple(out)


@dataclass(frozen=True)
class StageShape:
    """The deterministic layout of one stage under an allocation. ``iters`` is what one TRAIN
    trains: the stage's own iterations plus the ``redone`` ones (``redone_iters``)."""

    index: int
    num_trials: int
    iters: int
    allocation: int
    gpus_per_trial: int
    running: int
    instances_needed: int
    trials_per_gpu: int = 1       # k trials sharing one GPU (packing; only 1-GPU trials)
    fused_per_gpu: int = 1        # F trials fused into one program on one GPU (only 1-GPU trials)
    redone: int = 0               # of ``iters``: trained again on resuming (a function's older checkpoint)

    @property
    def own_iters(self) -> int:
        """The stage's own iterations (``iters`` less the redone ones)."""
        return self.iters - self.redone

    @property
    def nodes(self) -> int:
        """TRAIN nodes: one per trial, or one per fused group (``ceil(n / F)``)."""
        return fused_groups(self.num_trials, self.fused_per_gpu)

    @property
    def gpus_used(self) -> int:
        """GPUs the running trials occupy: ``ceil(running / k)`` packed, else ``running * m``."""
        return -(-self.running // self.trials_per_gpu) * self.gpus_per_trial

    @property
    def gpu_share(self) -> float:
        """The share of GPUs one TRAIN node holds (per-function billing): ``m``, or ``1 / k`` packed;
    a fused group holds its whole GPU (``m = 1``), ``1 / F`` of it per member."""
        return self.gpus_per_trial / self.trials_per_gpu


def iter_latency(model: ModelProfile, shape: StageShape) -> Distribution:
    """The distribution of a stage's seconds per iteration of one TRAIN node: ``packed_latency(k)``
    when ``k > 1`` trials share a GPU, ``fused_latency(F)`` (the whole group's) when ``F > 1``
    are fused, else ``latency(m)``."""
    if shape.fused_per_gpu > 1:
        return model.fused_latency(shape.fused_per_gpu)
    return model.packed_latency(shape.trials_per_gpu) if shape.trials_per_gpu > 1 else model.latency(shape.gpus_per_trial)


def stage_shape(index: int, num_trials: int, iters: int, allocation: object, model: ModelProfile,
                cloud: CloudProfile, trials_per_gpu: object = 1, fused_per_gpu: object = 1,
                redone: int = 0) -> StageShape:
    """Validate one stage's allocation (and trials per GPU, or trials fused per GPU) and lay it out;
    each TRAIN trains ``iters + redone`` (``redone``: the stage's ``redone_iters``).

    Raises:
        SpecError: naming the stage and the valid range when the allocation is not a positive
            integer or gives a GPU count per trial outside the model profile; naming
            ``trials_per_gpu[index]`` when ``k`` is not a whole number >= 1, has no packed
            latency, is above what the type's GPU memory holds, or packs trials of more than 1 GPU;
            naming ``fused_per_gpu[index]`` likewise for ``F`` (``_fused_per_gpu``).
    """
    low = 1 if model.min_gpus == 1 else num_trials * model.min_gpus
    # No more GPUs than the instances of the widest trials hold (``layout`` checks each count).
    widest = num_trials * model.max_gpus
    high = min(num_trials * (model.max_gpus + 1) - 1, instances_needed(num_trials, widest, cloud.gpus_per_instance)
               * cloud.gpus_per_instance)
    if isinstance(allocation, (bool, np.bool_)) or not isinstance(allocation, (int, np.integer)):
        if isinstance(allocation, float) and allocation.is_integer():
            allocation = int(allocation)
        else:
            raise SpecError(f"allocation[{index}]: expected a whole number of GPUs in {low}..{high} for "
                            f"{num_trials} trials, got {allocation!r}")
    allocation = int(allocation)
    if not low <= allocation <= high:
        raise SpecError(
            f"allocation[{index}]: {allocation} GPUs for {num_trials} trials is outside the valid range "
            f"{low}..{high} (model profile {model.name!r} covers {model.min_gpus}..{model.max_gpus} GPUs per trial)"
        )
    m = gpus_per_trial(num_trials, allocation)
    model.latency(m)  # raises SpecError if m is outside the profile (e.g. a < n without a 1-GPU profile)
    if _above_one(trials_per_gpu) and _above_one(fused_per_gpu):
        raise SpecError(f"fused_per_gpu[{index}]: stage {index} also packs {trials_per_gpu} trials per GPU; fused and "
                        f"packed are exclusive per stage: set trials_per_gpu[{index}] or fused_per_gpu[{index}] to 1")
    k = _trials_per_gpu(index, trials_per_gpu, m, model, cloud)
    f = _fused_per_gpu(index, fused_per_gpu, m, model, cloud)
    return StageShape(index, num_trials, iters + redone, allocation, m, running_trials(num_trials, allocation, k, f),
                      instances_needed(num_trials, allocation, cloud.gpus_per_instance, k, f), k, f, redone)


def _above_one(count: object) -> bool:
    """Whether a per-stage count is a number above 1 (its own check names it if it is no count)."""
    return isinstance(count, (int, float, np.integer, np.floating)) and not isinstance(count, bool) and bool(count > 1)


def _per_gpu_count(where: str, index: int, count: object, m: int, what: str, verb: str) -> int:
    """A stage's trials packed or fused per GPU as a whole number >= 1; above 1 only for 1-GPU
    trials (``m``, the stage's GPUs per trial)."""
    if isinstance(count, float) and count.is_integer():
        count = int(count)
    if isinstance(count, (bool, np.bool_)) or not isinstance(count, (int, np.integer)) or count < 1:
        raise SpecError(f"{where}: expected a whole number of {what}, got {count!r}")
    if count > 1 and m != 1:
        raise SpecError(f"{where}: only 1-GPU trials are {verb}, and stage {index}'s allocation gives each trial "
                        f"{m} GPUs; give at most as many GPUs as trials, or {where.split('[')[0]} 1")
    return int(count)


def _fused_per_gpu(index: int, f: object, m: int, model: ModelProfile, cloud: CloudProfile) -> int:
    """Validate one stage's trials fused per GPU (see ``stage_shape``; DESIGN §4.5)."""
    where = f"fused_per_gpu[{index}]"
    f = _per_gpu_count(where, index, f, m, "trials fused per GPU (1 = not fused)", "fused")
    if f == 1:
        return 1
    if f not in model.fused_iter_latency_s:
        have = ", ".join(map(str, model.fused_counts)) or "none"
        raise SpecError(f"{where}: {f} trials fused per GPU has no fused_iter_latency_s in model profile "
                        f"{model.name!r} (profiled: {have}); profile it or choose a profiled size")
    if not model.fused_fits(f, cloud.gpu_memory_gb):
        fits = [g for g in model.fused_counts if model.fused_fits(g, cloud.gpu_memory_gb)]
        raise SpecError(f"{where}: a fused group of {f} needs {model.fused_memory(f) or 0.0:.3g} GB, more than the "
                        f"{cloud.gpu_memory_gb:g} GB of one {cloud.instance_type} GPU (fused_memory_gb); fuse at most "
                        f"{max(fits, default=1)}")
    return f


def _trials_per_gpu(index: int, k: object, m: int, model: ModelProfile, cloud: CloudProfile) -> int:
    """Validate one stage's trials per GPU (see ``stage_shape``)."""
    where = f"trials_per_gpu[{index}]"
    k = _per_gpu_count(where, index, k, m, "trials per GPU (1 = not packed)", "packed")
    if k == 1:
        return 1
    if k not in model.packed_iter_latency_s:
        have = ", ".join(map(str, model.packing_counts)) or "none"
        raise SpecError(f"{where}: {k} trials per GPU has no packed_iter_latency_s in model profile {model.name!r} "
                        f"(profiled: {have}); profile it or choose a profiled count")
    try:
        cap = model.max_trials_per_gpu(cloud.gpu_memory_gb)
    except SpecError as exc:
        raise SpecError(f"{where}: {exc}") from None
    if k > cap:
        raise SpecError(f"{where}: {k} trials of {model.gpu_memory_gb_per_trial:g} GB do not fit the "
                        f"{cloud.gpu_memory_gb:g} GB of one {cloud.instance_type} GPU; pack at most {cap}")
    return k


def _shares_normals(latency: Distribution, startup: Distribution) -> bool:
    """Whether TRAIN durations are a non-decreasing transform of the stage's standard normals
    alone: a latency computed from them (``Distribution.from_standard_normal``), a constant start-up."""
    return startup.is_constant and latency.from_standard_normal(np.zeros(1)) is not None


def _frozen(array: np.ndarray) -> np.ndarray:
    """Make a cached array read-only, so no caller can change the draws others share."""
    array.setflags(write=False)
    return array


class StageDraws:
    """Common random numbers of one stage: every component has its own stream.

    Draws are laid out one row per TRAIN node or per new instance, so the j-th trial reads
    the same numbers whatever the allocation, and a second call returns cached arrays.
    """

    def __init__(self, seed: int, stage: int, samples: int):
        self.seed, self.stage, self.samples = int(seed), int(stage), int(samples)
        self._cache: dict[tuple[Any, ...], np.ndarray] = {}
        self._parts: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray | float]] = {}
        self._stats: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}

    def _rng(self, component: int) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(self.seed, spawn_key=(self.stage, component))))

    def scale(self, cloud: CloudProfile) -> np.ndarray:
        """SCALE latency per sample (one draw per scale-up)."""
        key = ("scale", cloud.provision_latency_s)
        if key not in self._cache:
            self._cache[key] = _frozen(cloud.provision_latency_s.sample(self._rng(_SCALE), self.samples))
        return self._cache[key]

    def init_max(self, cloud: CloudProfile, count: int) -> np.ndarray:
        """Time until ``count`` new instances are all initialised: max of ``count`` INIT draws,
        each ``init_contention_s · (count − 1)`` longer (instances launched together that share
        one machine, DESIGN §4; 0 on a cloud)."""
        dist = cloud.init_latency_s
        together = cloud.init_contention_s * (count - 1)
        if dist.is_constant:
            return np.full(self.samples, dist.mean + together)
        key = ("init", dist)
        cummax = self._cache.get(key)
        if cummax is None or cummax.shape[0] < count:
            draws = dist.sample(self._rng(_INIT), (count, self.samples))
            cummax = _frozen(np.maximum.accumulate(draws, axis=0))
            self._cache[key] = cummax
        return np.asarray(cummax[count - 1]) + together if together else np.asarray(cummax[count - 1])

    def init_each(self, cloud: CloudProfile, count: int) -> np.ndarray:
        """INIT latency of each of ``count`` new instances, ``(count, samples)``: the rows whose
        running maximum ``init_max`` is (the j-th new instance reads row j), with the same
        ``init_contention_s · (count − 1)``."""
        dist = cloud.init_latency_s
        together = cloud.init_contention_s * (count - 1)
        if dist.is_constant:
            return np.full((count, self.samples), dist.mean + together)
        return dist.sample(self._rng(_INIT), (count, self.samples)) + together

    def restarts(self, probability: float) -> np.ndarray:
        """Whether an eager target restarts (DESIGN §4.6), per sample: a uniform draw of its own
        stream below ``probability``."""
        key = ("restart", float(probability))
        if key not in self._cache:
            self._cache[key] = _frozen(self._rng(_RESTART).random(self.samples) < probability)
        return self._cache[key]

    def sync(self, model: ModelProfile) -> np.ndarray:
        """SYNC latency per sample."""
        key = ("sync", model.sync_s)
        if key not in self._cache:
            self._cache[key] = _frozen(model.sync_s.sample(self._rng(_SYNC), self.samples))
        return self._cache[key]

    def train_durations(self, model: ModelProfile, shape: StageShape) -> np.ndarray:
        """TRAIN durations, shape ``(nodes, samples)``: ``startup + k * L``, L per node (a trial, or a
        fused group: ``StageShape.nodes``)."""
        key = ("train", iter_latency(model, shape), model.trial_startup_s, shape.nodes, shape.iters)
        if key not in self._cache:
            latency, startup = self.train_parts(model, shape)
            durations = shape.iters * latency
            durations += startup
            self._cache[key] = _frozen(durations)
        return self._cache[key]

    def train_parts(self, model: ModelProfile, shape: StageShape) -> tuple[np.ndarray, np.ndarray | float]:
        """Seconds per iteration ``L`` and start-up of each TRAIN node, ``(nodes, samples)``
        (a constant start-up is one number): ``train_durations`` is ``startup + iters * L``."""
        dist = iter_latency(model, shape)
        key = ("parts", dist, model.trial_startup_s, shape.nodes)
        if key not in self._parts:
            size = (shape.nodes, self.samples)
            latency = _frozen(dist.sample(self._rng(_TRAIN), size))
            startup = model.trial_startup_s
            boot = startup.mean if startup.is_constant else _frozen(startup.sample(self._rng(_STARTUP), size))
            self._parts[key] = (latency, boot)
        return self._parts[key]

    def train_stats(self, model: ModelProfile, shape: StageShape) -> tuple[np.ndarray, np.ndarray]:
        """The slowest and the summed TRAIN duration per sample: ``train_durations(model, shape)``'s
        ``max(axis=0)`` and ``sum(axis=0)`` to the bit, without keeping the durations.

        A latency that is a transform of standard normals (``Distribution.from_standard_normal``:
        a normal) with a constant start-up reads the stage's one draw of them, shared by every
        GPU count: ``train_parts`` would draw the same normals again for each count (one
        stream per stage and component). Durations are formed a block of rows at a time in one
        buffer whose first row carries the running sum, so the sum still adds row after row in
        trial order, as numpy's ``sum(axis=0)`` does (the test checks it to the bit).
        """
        key = ("stats", iter_latency(model, shape), model.trial_startup_s, shape.nodes, shape.iters)
        if key not in self._stats:
            longest, total = self._train_stats(model, shape)
            self._stats[key] = (_frozen(longest), _frozen(total))
        return self._stats[key]

    def _train_stats(self, model: ModelProfile, shape: StageShape) -> tuple[np.ndarray, np.ndarray]:
        dist, startup = iter_latency(model, shape), model.trial_startup_s
        known = ("train", dist, startup, shape.nodes, shape.iters) in self._cache
        if known or not _shares_normals(dist, startup):
            durations = self.train_durations(model, shape)
            return durations.max(axis=0), durations.sum(axis=0)
        z = self.standard_normals(_TRAIN, shape.nodes)
        rows = max(1, _BLOCK // self.samples)
        buffer = np.empty((min(rows, shape.nodes) + 1, self.samples))
        longest, total = np.full(self.samples, -np.inf), np.zeros(self.samples)
        for start in range(0, shape.nodes, rows):
            block = z[start:start + rows]
            part = buffer[1:len(block) + 1]
            dist.from_standard_normal(block, out=part)
            part *= shape.iters
            part += startup.mean
            np.maximum(longest, part.max(axis=0), out=longest)
            buffer[0] = total
            np.add.reduce(buffer[:len(block) + 1], axis=0, out=total)
        return longest, total

    def train_longest(self, model: ModelProfile, shape: StageShape) -> np.ndarray:
        """The slowest TRAIN duration per sample, ``train_durations(model, shape).max(axis=0)`` to
        the bit, for a shared latency (see ``train_stats``) from the stage's largest standard
        normal per sample, without a pass over the trials: every step from ``z`` to a duration
        (times ``sigma >= 0``, plus ``mu``, clipped at 0, times the iterations, plus the
        constant start-up) is non-decreasing, rounding included, so the slowest trial is the
        one of the largest ``z``, and its duration is the same number."""
        key = ("longest", iter_latency(model, shape), model.trial_startup_s, shape.nodes, shape.iters)
        if key not in self._cache:
            dist, startup = iter_latency(model, shape), model.trial_startup_s
            stats = self._stats.get(("stats", *key[1:]))
            known = stats is not None or ("train", *key[1:]) in self._cache
            if known or not _shares_normals(dist, startup):
                longest = self.train_stats(model, shape)[0]
            else:
                zkey = ("largest", _TRAIN, shape.nodes)
                if zkey not in self._cache:
                    self._cache[zkey] = _frozen(self.standard_normals(_TRAIN, shape.nodes).max(axis=0))
                longest = np.asarray(dist.from_standard_normal(self._cache[zkey]))
                longest *= shape.iters
                longest += startup.mean
                _frozen(longest)
            self._cache[key] = longest
        return self._cache[key]

    def train_longest_many(self, model: ModelProfile, shapes: list[StageShape]) -> list[np.ndarray]:
        """``train_longest`` of several shapes of this stage (one ``nodes`` and ``iters``), the
        same arrays to the bit: those whose latency is a ``Normal`` (with a constant start-up) are
        formed together, one row per shape, by the very operations ``train_longest`` applies to
        the stage's largest standard normal per sample (elementwise, so each row is its
        numbers); the others one by one. Each is kept as ``train_longest`` keeps it."""
        from rubberband.profiles.distributions import Normal

        out: dict[int, np.ndarray] = {}
        batch = []
        for j, shape in enumerate(shapes):
            dist, startup = iter_latency(model, shape), model.trial_startup_s
            key = ("longest", dist, startup, shape.nodes, shape.iters)
            if key in self._cache:
                out[j] = self._cache[key]
            elif (type(dist) is Normal and startup.is_constant and ("stats", *key[1:]) not in self._stats
                  and ("train", *key[1:]) not in self._cache):
                batch.append((j, key, dist))
            else:
                out[j] = self.train_longest(model, shape)
        if batch:
            shape = shapes[batch[0][0]]
            zkey = ("largest", _TRAIN, shape.nodes)
            if zkey not in self._cache:
                self._cache[zkey] = _frozen(self.standard_normals(_TRAIN, shape.nodes).max(axis=0))
            sigma = np.array([[d.sigma] for _, _, d in batch], dtype=float)
            mu = np.array([[d.mu] for _, _, d in batch], dtype=float)
            rows = np.multiply(self._cache[zkey][None, :], sigma)      # Normal.from_standard_normal, per row
            rows += mu
            np.maximum(rows, 0.0, out=rows)
            rows *= shape.iters
            rows += model.trial_startup_s.mean
            for (j, key, _), row in zip(batch, rows):
                out[j] = self._cache[key] = _frozen(row.copy())
        return [out[j] for j in range(len(shapes))]

    def standard_normals(self, component: int, rows: int) -> np.ndarray:
        """``(rows, samples)`` standard normals of a component's stream (cached): the numbers a
        normal drawn from that stream is an affine transform of."""
        key = ("standard", component, rows)
        if key not in self._cache:
            self._cache[key] = _frozen(self._rng(component).standard_normal((rows, self.samples)))
        return self._cache[key]

    def train(self, model: ModelProfile, shape: StageShape) -> tuple[np.ndarray, np.ndarray]:
        """Makespan of the stage's TRAIN nodes and their summed duration, per sample.

        When every trial runs at once the makespan is the slowest trial (a straggler holds
        the stage). When trials queue (``a < n``), each GPU takes the next queued trial as
        soon as it frees up: list scheduling in trial order.
        """
        durations = self.train_durations(model, shape)
        total = durations.sum(axis=0)
        if shape.running >= shape.nodes:
            return durations.max(axis=0), total
        return list_schedule(durations, shape.running), total


def list_schedule(durations: np.ndarray, gpus: int) -> np.ndarray:
    """Makespan per sample of ``n`` trials on ``gpus`` GPUs, each GPU taking the next queued
    trial as soon as it frees up (trials in order; ``durations`` has shape ``(n, samples)``)."""
    free = durations[:gpus].T.copy()                # (samples, gpus), a C-ordered copy: the cache stays intact
    rows = np.arange(durations.shape[1])
    for j in range(gpus, durations.shape[0]):
        gpu = free.argmin(axis=1)                   # contiguous rows: ~4x faster than axis 0
        free[rows, gpu] += durations[j]
    return np.asarray(free.max(axis=1))
