"""Model profile: per-iteration latency by GPUs per trial (and by trials packed, or fused, on one GPU), trial start-up and SYNC latency."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rubberband.errors import RubberbandWarning, SpecError
from rubberband.profiles.distributions import Constant, Distribution, parse_distribution
from rubberband.schema import check_mapping, integer, load_yaml

_KEYS_REQUIRED = ["iter_latency_s"]
_KEYS_OPTIONAL = [
    "name", "description", "notes", "measured_on", "measured_at", "rubberband_version",
    "global_batch_size", "trial_startup_s", "sync_s", "profiling",
    "packed_iter_latency_s", "gpu_memory_gb_per_trial", "fused_iter_latency_s", "fused_memory_gb", "checkpoint_every",
]
# Read into fields of their own, not kept as ``extra``.
_FIELDS = ("name", "measured_on", "trial_startup_s", "sync_s", "packed_iter_latency_s", "gpu_memory_gb_per_trial",
           "fused_iter_latency_s", "fused_memory_gb", "checkpoint_every")
NEVER = "never"   # ``checkpoint_every: never``: a function trainable that reports no checkpoint


@dataclass(frozen=True)
class ModelProfile:
    """How one model's training scales with GPUs (DESIGN §3).

    ``iter_latency_s`` maps a profiled GPU count to the distribution of seconds per training
    iteration at the fixed global batch size. Between profiled counts the mean and std
    interpolate linearly in ``log2(GPUs)``; outside the profiled range there is no
    extrapolation (``latency(m)`` raises ``SpecError``).

    Packing (only 1-GPU trials are packed): ``packed_iter_latency_s`` maps ``k >= 2`` trials
    sharing one GPU to the seconds per iteration of *one* of them, and
    ``gpu_memory_gb_per_trial`` is a trial's peak GPU memory, which with an instance type's
    ``gpu_memory_gb`` caps ``k`` (``max_trials_per_gpu``). ``k = 1`` is ``iter_latency_s[1]``.
    Packing gives more iterations per GPU-second where ``packed_latency(k).mean < k *
    latency(1).mean``; the planner offers ``k`` only where that gain is at least 5%
    (``plan.variants.packing_pays``). Packed counts are not interpolated.

    Fusion (DESIGN §4.5; only 1-GPU trials are fused): ``fused_iter_latency_s`` maps a group
    size ``F >= 1`` to the seconds of *one* iteration of the whole group of ``F`` trials trained
    as one program on one GPU (``F = 1``: the fused program with one member, which may be slower
    than ``iter_latency_s[1]``, the plain program). ``fused_memory_gb`` (optional) maps ``F`` to
    the group's peak GPU memory; ``fused_memory_fit`` fits ``m(F) = m1 + (F - 1) * delta`` to it
    and ``max_fused`` gives the largest group a device holds (Hydro's rule). Fused counts are
    not interpolated; the planner offers ``F`` only where ``F * E[L_1] / E[L_F]`` beats one
    plain trial by 5% (``plan.variants.fusion_pays``).

    Checkpoints (DESIGN §4): ``checkpoint_every`` is ``c``, the reports per checkpoint of a
    function trainable (``None``: it never reports one; default 1, every report). A trial
    resumed after ``D`` iterations trains ``redone_after(D)`` of them again first.
    """

    iter_latency_s: dict[int, Distribution]
    trial_startup_s: Distribution = field(default_factory=lambda: Constant(0.0))
    sync_s: Distribution = field(default_factory=lambda: Constant(0.0))
    name: str = "model"
    measured_on: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    packed_iter_latency_s: dict[int, Distribution] = field(default_factory=dict)
    gpu_memory_gb_per_trial: float | None = None
    fused_iter_latency_s: dict[int, Distribution] = field(default_factory=dict)
    fused_memory_gb: dict[int, float] = field(default_factory=dict)
    checkpoint_every: int | None = 1
    # ``latency(m)`` by GPU count, built once per profile (the planner asks for the same counts
    # hundreds of thousands of times in one search). Not a field that compares, hashes or is
    # passed in: ``replace`` (e.g. the re-planner's corrected profile) runs ``__init__`` again,
    # so a profile with other latencies always starts with a cache of its own.
    _latency_cache: dict[int, Distribution] = field(default_factory=dict, init=False, repr=False, compare=False)
    _gpu_counts: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.iter_latency_s:
            raise SpecError("iter_latency_s: needs at least one GPU count, e.g. {1: {dist: constant, value: 4.0}}")
        cleaned = {}
        for gpus, dist in self.iter_latency_s.items():
            g = integer(gpus, f"iter_latency_s.{gpus}")
            if not isinstance(dist, Distribution):
                raise SpecError(f"iter_latency_s.{gpus}: expected a distribution")
            if not dist.mean > 0:
                # A free iteration would make every allocation equally fast: nothing to plan.
                raise SpecError(
                    f"iter_latency_s.{g}: the mean time per iteration with {g} GPU{'s' if g > 1 else ''} per trial "
                    f"must be greater than 0 s, got {dist.mean:g}; re-profile it or remove the entry"
                )
            cleaned[g] = dist
        object.__setattr__(self, "iter_latency_s", dict(sorted(cleaned.items())))
        object.__setattr__(self, "_gpu_counts", tuple(self.iter_latency_s))
        slower = [(a, b) for a, b in zip(self.gpu_counts, self.gpu_counts[1:])
                  if self.iter_latency_s[b].mean > self.iter_latency_s[a].mean]
        # On real GPUs a slowdown usually means a broken measurement: say so, and plan with it
        # anyway. Logical GPUs share one CPU, where DDP is expected to lose to a single worker.
        if slower and self.measured_on.get("gpu_model") != "logical":
            pairs = ", ".join(f"{b} GPUs ({self.iter_latency_s[b].mean:.3g}s) slower than {a} "
                              f"({self.iter_latency_s[a].mean:.3g}s)" for a, b in slower)
            warnings.warn(
                f"model profile {self.name!r}: more GPUs per trial make an iteration slower: {pairs}; "
                "check the profile if the model should speed up with more GPUs",
                RubberbandWarning, stacklevel=3,
            )
        self._check_packing()
        self._check_fusion()
        c = self.checkpoint_every
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise SpecError(f"checkpoint_every: expected the reports per checkpoint, a whole number of at least 1, "
                            f"or {NEVER!r}, got {c!r}")

    def redone_after(self, done: int) -> int:
        """Iterations a trial resumed after ``done`` trains again: those since its latest
        checkpoint, ``done mod c`` (all ``done`` when it never checkpoints)."""
        return done if self.checkpoint_every is None else done % self.checkpoint_every

    def _check_packing(self) -> None:
        packed = {}
        for k, dist in self.packed_iter_latency_s.items():
            where = f"packed_iter_latency_s.{k}"
            if isinstance(k, bool) or not isinstance(k, (int, float)) or k != int(k) or k < 2:
                raise SpecError(f"{where}: trials per GPU must be a whole number of at least 2 (k = 1 is "
                                f"iter_latency_s.1), got {k!r}")
            if not isinstance(dist, Distribution):
                raise SpecError(f"{where}: expected a distribution")
            if not dist.mean > 0:
                raise SpecError(f"{where}: the mean time per iteration of one of {int(k)} packed trials must be "
                                f"greater than 0 s, got {dist.mean:g}; re-profile it or remove the entry")
            packed[int(k)] = dist
        object.__setattr__(self, "packed_iter_latency_s", dict(sorted(packed.items())))
        mem = self.gpu_memory_gb_per_trial
        if mem is not None:
            if isinstance(mem, bool) or not isinstance(mem, (int, float)) or not mem > 0 or not math.isfinite(mem):
                raise SpecError(f"gpu_memory_gb_per_trial: expected a peak GPU memory in GB greater than 0, got {mem!r}")
            object.__setattr__(self, "gpu_memory_gb_per_trial", float(mem))
        if packed and 1 not in self.iter_latency_s:
            raise SpecError("packed_iter_latency_s: only 1-GPU trials are packed, but iter_latency_s has no entry "
                            "for 1 GPU; profile 1 GPU per trial or remove the packed latencies")
        faster = [k for k, d in packed.items() if d.mean < self.iter_latency_s[1].mean]
        if faster:
            solo = self.iter_latency_s[1].mean
            pairs = ", ".join(f"packed_iter_latency_s.{k} ({packed[k].mean:.3g}s)" for k in faster)
            warnings.warn(
                f"model profile {self.name!r}: {pairs} lower than the solo latency iter_latency_s.1 ({solo:.3g}s): "
                "one trial alone under-used the GPU, or a measurement is off; check the profile",
                RubberbandWarning, stacklevel=4,
            )

    def _check_fusion(self) -> None:
        fused = {}
        for f, dist in self.fused_iter_latency_s.items():
            where = f"fused_iter_latency_s.{f}"
            if isinstance(f, bool) or not isinstance(f, (int, float)) or f != int(f) or f < 1:
                raise SpecError(f"{where}: trials in a fused group must be a whole number of at least 1, got {f!r}; "
                                "key each latency by the group size, e.g. {8: {dist: normal, mean: 0.5, std: 0.05}}")
            if not isinstance(dist, Distribution):
                raise SpecError(f"{where}: expected a distribution")
            if not dist.mean > 0:
                raise SpecError(f"{where}: the mean time of one iteration of a group of {int(f)} fused trials must be "
                                f"greater than 0 s, got {dist.mean:g}; re-profile it or remove the entry")
            fused[int(f)] = dist
        object.__setattr__(self, "fused_iter_latency_s", dict(sorted(fused.items())))
        memory = {}
        for f, gb in self.fused_memory_gb.items():
            where = f"fused_memory_gb.{f}"
            if isinstance(f, bool) or not isinstance(f, (int, float)) or f != int(f) or f < 1:
                raise SpecError(f"{where}: trials in a fused group must be a whole number of at least 1, got {f!r}")
            if isinstance(gb, bool) or not isinstance(gb, (int, float)) or not gb > 0 or not math.isfinite(gb):
                raise SpecError(f"{where}: expected the group's peak GPU memory in GB, greater than 0, got {gb!r}")
            memory[int(f)] = float(gb)
        object.__setattr__(self, "fused_memory_gb", dict(sorted(memory.items())))
        if fused and 1 not in self.iter_latency_s:
            raise SpecError("fused_iter_latency_s: only 1-GPU trials are fused, but iter_latency_s has no entry for "
                            "1 GPU; profile 1 GPU per trial or remove the fused latencies")
        if len(memory) == 1:
            raise SpecError(f"fused_memory_gb: one group size ({next(iter(memory))}) cannot fit m1 + (F - 1) * delta; "
                            "give the peak memory of at least two group sizes, e.g. {1: 2.1, 8: 6.3}, or remove it")

    @property
    def fused_counts(self) -> tuple[int, ...]:
        """Group sizes with a fused latency, ascending."""
        return tuple(self.fused_iter_latency_s)

    def fused_latency(self, fused: int) -> Distribution:
        """Seconds of one iteration of a fused group of ``fused`` trials on one GPU (the whole group's).

        Raises:
            SpecError: if ``fused`` is not an integer or has no profiled fused latency.
        """
        if isinstance(fused, bool) or not isinstance(fused, (int, float)) or int(fused) != fused:
            raise SpecError(f"fused per GPU: expected an integer, got {fused!r}")
        f = int(fused)
        if f not in self.fused_iter_latency_s:
            have = ", ".join(map(str, self.fused_counts)) or "none"
            raise SpecError(f"fused per GPU: {f} has no fused_iter_latency_s in model profile {self.name!r} "
                            f"(profiled: {have}); profile it with `rubberband profile` or choose a profiled size")
        return self.fused_iter_latency_s[f]

    @property
    def fused_memory_fit(self) -> tuple[float, float] | None:
        """``(m1, delta)`` of ``m(F) = m1 + (F - 1) * delta``, least squares over ``fused_memory_gb``
        (``None`` without it): one member's memory and what each further member adds (Hydro)."""
        if len(self.fused_memory_gb) < 2:
            return None
        xs = [f - 1.0 for f in self.fused_memory_gb]
        ys = list(self.fused_memory_gb.values())
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        delta = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        return my - delta * mx, delta

    def fused_memory(self, fused: int) -> float | None:
        """Peak GPU memory of a fused group of ``fused`` trials: the measured one where profiled,
        else the fitted ``m1 + (F - 1) * delta`` (``None`` without ``fused_memory_gb``)."""
        if fused in self.fused_memory_gb:
            return self.fused_memory_gb[fused]
        fit = self.fused_memory_fit
        return None if fit is None else fit[0] + (fused - 1) * fit[1]

    def max_fused(self, device_gb: float | None) -> int | None:
        """The largest fused group one GPU of ``device_gb`` holds, by Hydro's rule on the fitted
        ``m(F) = m1 + (F - 1) * delta``: ``m(F) <= M  <=>  F <= (M - m1) / delta + 1``, so
        ``F_max = floor((M - m1) / delta) + 1``. ``None``: no memory cap known (no
        ``fused_memory_gb``, an unknown device memory, or memory that does not grow with ``F``).

        Raises:
            SpecError: if one member alone (``m1``) is above ``device_gb``.
        """
        fit = self.fused_memory_fit
        if fit is None or device_gb is None:
            return None
        m1, delta = fit
        if m1 > device_gb + 1e-9:      # a fit through points on the line may land a hair above it
            raise SpecError(f"fused_memory_gb: one fused member needs {m1:.3g} GB (fitted m1), above the "
                            f"{device_gb:g} GB of one GPU; pick a type with more GPU memory or check the profile")
        if delta <= 0:
            return None
        return math.floor((device_gb - m1) / delta + 1e-9) + 1

    def fused_fits(self, fused: int, device_gb: float | None) -> bool:
        """Whether a fused group of ``fused`` trials fits one GPU of ``device_gb``: within Hydro's
        ``max_fused`` and, where its memory was measured, within the measurement too."""
        if device_gb is None or self.fused_memory_fit is None:
            return True
        try:
            cap = self.max_fused(device_gb)
        except SpecError:
            return False
        measured = self.fused_memory_gb.get(fused)
        return (cap is None or fused <= cap) and (measured is None or measured <= device_gb)

    @property
    def packing_counts(self) -> tuple[int, ...]:
        """Trials per GPU with a latency: 1 (when 1 GPU per trial is profiled) and the packed counts."""
        return ((1,) if 1 in self.iter_latency_s else ()) + tuple(self.packed_iter_latency_s)

    def packed_latency(self, k: int) -> Distribution:
        """Seconds per iteration of one trial when ``k`` trials share one GPU (``k = 1``: alone).

        Raises:
            SpecError: if ``k`` is not an integer or has no profiled latency.
        """
        if isinstance(k, bool) or not isinstance(k, (int, float)) or int(k) != k:
            raise SpecError(f"trials per GPU: expected an integer, got {k!r}")
        k = int(k)
        if k == 1:
            return self.latency(1)
        if k not in self.packed_iter_latency_s:
            have = ", ".join(map(str, self.packing_counts)) or "none"
            raise SpecError(f"trials per GPU: {k} has no packed latency in model profile {self.name!r} (profiled: "
                            f"{have}); profile it with `rubberband profile` or choose a profiled count")
        return self.packed_iter_latency_s[k]

    def max_trials_per_gpu(self, gpu_memory_gb: float | None = None) -> int:
        """The most trials one GPU may run at once: the largest profiled ``k`` whose trials'
        peak memory fits ``gpu_memory_gb`` (unknown memory on either side: no memory cap).

        Raises:
            SpecError: if one trial's peak memory alone is above ``gpu_memory_gb``.
        """
        mem = self.gpu_memory_gb_per_trial
        if mem is not None and gpu_memory_gb is not None and mem > gpu_memory_gb:
            raise SpecError(f"gpu_memory_gb_per_trial: {mem:g} GB is above the {gpu_memory_gb:g} GB of one GPU of "
                            "this instance type; pick a type with more GPU memory or check the profile")
        fits = [k for k in self.packing_counts
                if mem is None or gpu_memory_gb is None or k * mem <= gpu_memory_gb]
        return max(fits, default=1)

    @property
    def gpu_counts(self) -> tuple[int, ...]:
        """The profiled GPU counts, ascending."""
        return self._gpu_counts       # set by ``__post_init__``: the profile is frozen

    @property
    def min_gpus(self) -> int:
        return self.gpu_counts[0]

    @property
    def max_gpus(self) -> int:
        return self.gpu_counts[-1]

    def covers(self, gpus: int) -> bool:
        """Whether ``gpus`` per trial lies in the profiled range."""
        return self.min_gpus <= gpus <= self.max_gpus

    def latency(self, gpus: int) -> Distribution:
        """Seconds per iteration with ``gpus`` GPUs per trial (log2-interpolated).

        Each count's distribution is built once and kept (``_latency_cache``): the profile is
        frozen, so the same count always gives the same distribution, and the planner asks for
        it on every candidate allocation.

        Raises:
            SpecError: if ``gpus`` is outside the profiled range.
        """
        if isinstance(gpus, bool):      # ``True == 1`` would find 1 GPU's entry in the cache
            raise SpecError(f"gpus per trial: expected an integer, got {gpus!r}")
        cached = self._latency_cache.get(gpus)     # int keys only: 2.0 and np.int64(2) find 2's
        if cached is not None:
            return cached
        if int(gpus) != gpus:
            raise SpecError(f"gpus per trial: expected an integer, got {gpus!r}")
        gpus = int(gpus)
        latency = self._interpolate(gpus)
        self._latency_cache[gpus] = latency
        return latency

    def _interpolate(self, gpus: int) -> Distribution:
        if gpus in self.iter_latency_s:
            return self.iter_latency_s[gpus]
        if not self.covers(gpus):
            raise SpecError(
                f"gpus per trial: {gpus} is outside the profiled range {self.min_gpus}..{self.max_gpus} of "
                f"model profile {self.name!r}; profile more GPU counts or use an allocation in range"
            )
        counts = self.gpu_counts
        hi = next(c for c in counts if c > gpus)
        lo = max(c for c in counts if c < gpus)
        t = (math.log2(gpus) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
        a, b = self.iter_latency_s[lo], self.iter_latency_s[hi]
        mean = (1 - t) * a.mean + t * b.mean
        std = (1 - t) * a.std + t * b.std
        return a.with_moments(mean, std)

    # --- I/O ------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "model_profile") -> ModelProfile:
        """Build from the YAML shape of DESIGN §3 (unknown keys rejected)."""
        data = check_mapping(data, where, required=_KEYS_REQUIRED, optional=_KEYS_OPTIONAL)
        lat = data["iter_latency_s"]
        if not isinstance(lat, dict) or not lat:
            raise SpecError(f"{where}.iter_latency_s: expected a mapping of GPU count to distribution, e.g. {{1: {{dist: normal, mean: 4.0, std: 0.4}}}}")
        iter_latency = {}
        for gpus, dist in lat.items():
            g = integer(gpus if not isinstance(gpus, str) or not gpus.isdigit() else int(gpus), f"{where}.iter_latency_s.{gpus}")
            if g in iter_latency:  # `1:` and `"1":` are one GPU count
                raise SpecError(f"{where}.iter_latency_s.{gpus}: {g} GPUs given twice; keep one entry")
            iter_latency[g] = parse_distribution(dist, f"{where}.iter_latency_s.{gpus}")
        measured_on = data.get("measured_on") or {}
        if not isinstance(measured_on, dict):
            raise SpecError(f"{where}.measured_on: expected a mapping such as {{provider: aws, instance_type: p3.8xlarge}}")
        extra = {k: data[k] for k in _KEYS_OPTIONAL if k in data and k not in _FIELDS}
        packed = data.get("packed_iter_latency_s") or {}
        if not isinstance(packed, dict):
            raise SpecError(f"{where}.packed_iter_latency_s: expected a mapping of trials per GPU to distribution, "
                            "e.g. {2: {dist: normal, mean: 6.0, std: 0.5}}")
        packed_latency = {}
        for k, dist in packed.items():
            kk = int(k) if isinstance(k, str) and k.isdigit() else k
            if kk in packed_latency:
                raise SpecError(f"{where}.packed_iter_latency_s.{k}: {kk} trials per GPU given twice; keep one entry")
            packed_latency[kk] = parse_distribution(dist, f"{where}.packed_iter_latency_s.{k}")
        fused_latency = _by_count(data.get("fused_iter_latency_s"), f"{where}.fused_iter_latency_s",
                                  "trials in a fused group to distribution, e.g. {8: {dist: normal, mean: 0.5, std: 0.05}}",
                                  parse=lambda d, w: parse_distribution(d, w))
        fused_memory = _by_count(data.get("fused_memory_gb"), f"{where}.fused_memory_gb",
                                 "trials in a fused group to peak GPU memory in GB, e.g. {1: 2.1, 8: 6.3}",
                                 parse=lambda v, w: v)
        mem = data.get("gpu_memory_gb_per_trial")
        every = data.get("checkpoint_every", 1)
        if every == NEVER:
            every = None
        elif every is None or isinstance(every, str):
            raise SpecError(f"{where}.checkpoint_every: expected the reports per checkpoint (a whole number of at "
                            f"least 1) or {NEVER!r}, got {every!r}")
        trial_startup_s = parse_distribution(data.get("trial_startup_s", 0), f"{where}.trial_startup_s")
        sync_s = parse_distribution(data.get("sync_s", 0), f"{where}.sync_s")
        try:
            return cls(iter_latency_s=iter_latency, trial_startup_s=trial_startup_s, sync_s=sync_s,
                       name=str(data.get("name", "model")), measured_on=dict(measured_on), extra=extra,
                       packed_iter_latency_s=packed_latency, gpu_memory_gb_per_trial=mem,
                       fused_iter_latency_s=fused_latency, fused_memory_gb=fused_memory,
                       checkpoint_every=every)
        except SpecError as exc:  # the checks of __post_init__ name the field; add the file
            raise SpecError(f"{where}.{exc}") from None

    @classmethod
    def load(cls, path: str | Path) -> ModelProfile:
        """Load a model profile YAML file."""
        return cls.from_dict(load_yaml(path, "model_profile"), where=str(path))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.measured_on:
            out["measured_on"] = dict(self.measured_on)
        out.update(self.extra)
        out["iter_latency_s"] = {g: d.to_dict() for g, d in self.iter_latency_s.items()}
        out["trial_startup_s"] = self.trial_startup_s.to_dict()
        out["sync_s"] = self.sync_s.to_dict()
        if self.packed_iter_latency_s:
            out["packed_iter_latency_s"] = {k: d.to_dict() for k, d in self.packed_iter_latency_s.items()}
        if self.gpu_memory_gb_per_trial is not None:
            out["gpu_memory_gb_per_trial"] = self.gpu_memory_gb_per_trial
        if self.fused_iter_latency_s:
            out["fused_iter_latency_s"] = {f: d.to_dict() for f, d in self.fused_iter_latency_s.items()}
        if self.fused_memory_gb:
            out["fused_memory_gb"] = dict(self.fused_memory_gb)
        if self.checkpoint_every != 1:
            out["checkpoint_every"] = NEVER if self.checkpoint_every is None else self.checkpoint_every
        return out

    def replace(self, **changes: Any) -> ModelProfile:
        """A copy with some fields changed."""
        from dataclasses import replace

        return replace(self, **changes)


def _by_count(value: Any, where: str, shape: str, parse: Callable[[Any, str], Any]) -> dict[Any, Any]:
    """A YAML mapping keyed by a count (``"8"`` and ``8`` are one key), each value parsed."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a mapping of {shape}")
    out: dict[Any, Any] = {}
    for key, item in value.items():
        k = int(key) if isinstance(key, str) and key.isdigit() else key
        if k in out:
            raise SpecError(f"{where}.{key}: {k} given twice; keep one entry")
        out[k] = parse(item, f"{where}.{key}")
    return out
