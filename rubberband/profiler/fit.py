"""Fit latency distributions to measured samples, and split TRAIN durations into start-up and
seconds per iteration (pure: numpy and scipy only).

Choosing a family. All samples equal (within 1e-9 relative) give ``Constant``. Otherwise, with
at least ``MIN_SAMPLES_FOR_SHAPE`` samples, ``normal`` and ``lognormal`` are both fitted by
maximum likelihood and the one with the lower Akaike information criterion wins::

    AIC = 2 k - 2 ln L̂        (k = 2 parameters for both families)

so with equal ``k`` this is the higher log-likelihood; ``lognormal`` needs every sample > 0.
With fewer samples the shape cannot be told apart and ``normal`` is used. The returned
distribution is written with the moments of the latency itself, as
``rubberband.profiles.distributions`` expects: the sample mean and the sample standard
deviation (``ddof=1``) for ``normal``; ``exp(m + s²/2)`` and ``mean·sqrt(exp(s²) - 1)`` of the
fitted log-mean ``m`` and log-std ``s`` for ``lognormal``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from rubberband.errors import SpecError
from rubberband.profiles.distributions import Constant, Distribution, LogNormal, Normal

MIN_SAMPLES_FOR_SHAPE = 5       # below this, normal vs lognormal is a coin toss: use normal
CONSTANT_RTOL = 1e-9
CRITERION = "aic"


@dataclass(frozen=True)
class Fit:
    """A fitted latency: the chosen distribution, the samples and each candidate's AIC."""

    dist: Distribution
    samples: tuple[float, ...]
    aic: dict[str, float] = field(default_factory=dict)
    reason: str = ""

    @property
    def n(self) -> int:
        return len(self.samples)


def _clean(samples: Sequence[float] | np.ndarray, where: str) -> np.ndarray:
    try:
        arr = np.asarray(list(samples), dtype=float).ravel()
    except (TypeError, ValueError):
        raise SpecError(f"{where}: expected a list of measured seconds, got {samples!r}") from None
    if arr.size == 0:
        raise SpecError(f"{where}: no samples to fit; measure at least one")
    if not np.all(np.isfinite(arr)):
        raise SpecError(f"{where}: samples must be finite numbers, got {arr.tolist()!r}")
    if np.any(arr < 0):
        raise SpecError(f"{where}: latencies cannot be negative, got {float(arr.min()):g}")
    return arr


def _sig(x: float, digits: int = 6) -> float:
    """``x`` rounded to ``digits`` significant digits (YAML stays readable)."""
    return float(f"{x:.{digits}g}")


def fit(samples: Sequence[float] | np.ndarray, where: str = "samples") -> Fit:
    """Fit ``samples`` (seconds) and say why the family was chosen; see the module docstring.

    Raises:
        SpecError: no samples, a non-finite or a negative one.
    """
    arr = _clean(samples, where)
    kept = tuple(float(v) for v in arr)
    scale = float(np.max(np.abs(arr)))
    if float(np.ptp(arr)) <= CONSTANT_RTOL * scale:
        return Fit(Constant(_sig(float(np.mean(arr)))), kept, reason="all samples equal")
    mean, std = float(np.mean(arr)), float(np.std(arr, ddof=1))
    normal = Normal(_sig(mean), _sig(std))
    if arr.size < MIN_SAMPLES_FOR_SHAPE:
        return Fit(normal, kept, reason=f"fewer than {MIN_SAMPLES_FOR_SHAPE} samples: normal by default")
    # Maximum-likelihood fits; both families have k = 2 parameters.
    aic = {"normal": 4.0 - 2.0 * float(np.sum(stats.norm.logpdf(arr, loc=mean, scale=float(np.std(arr)))))}
    lognormal = None
    if np.all(arr > 0):
        logs = np.log(arr)
        m, s_mle = float(np.mean(logs)), float(np.std(logs))
        if s_mle > 0:
            aic["lognormal"] = 4.0 - 2.0 * float(np.sum(stats.lognorm.logpdf(arr, s=s_mle, scale=math.exp(m))))
            s = float(np.std(logs, ddof=1))
            ln_mean = math.exp(m + s * s / 2.0)
            lognormal = LogNormal(_sig(ln_mean), _sig(ln_mean * math.sqrt(math.expm1(s * s))))
    aic = {k: (v if math.isfinite(v) else math.inf) for k, v in aic.items()}
    if lognormal is not None and aic["lognormal"] < aic["normal"]:
        return Fit(lognormal, kept, aic, reason="lower AIC")
    return Fit(normal, kept, aic, reason="lower AIC" if "lognormal" in aic else "normal (lognormal needs samples > 0)")


def fit_latency(samples: Sequence[float] | np.ndarray) -> Distribution:
    """The best of constant, normal and lognormal for measured latencies (seconds).

    Args:
        samples: measured seconds, each finite and >= 0.

    Returns:
        ``Constant`` when all samples are equal (within 1e-9 relative) or there is only one;
        else ``Normal`` or ``LogNormal``, whichever has the lower AIC (``Normal`` when there
        are fewer than ``MIN_SAMPLES_FOR_SHAPE`` samples). Both are given by the mean and std
        of the latency itself.

    Raises:
        SpecError: no samples, or a non-finite or negative one.
    """
    return fit(samples).dist


def to_profile_entry(samples: Sequence[float] | np.ndarray, digits: int = 6) -> dict[str, Any]:
    """The YAML of a fitted latency, with the raw samples kept beside it.

    Returns:
        ``{"fitted": {dist: ...}, "empirical": {dist: empirical, samples: [...]},
        "fit": {n, criterion, aic, reason}}``: ``fitted`` goes where the profile wants a
        distribution (``iter_latency_s.<gpus>``); ``empirical`` is a valid distribution too
        (the samples themselves, to resample instead of the fit); ``fit`` says why.
    """
    result = fit(samples)
    return {
        "fitted": result.dist.to_dict(),
        "empirical": {"dist": "empirical", "samples": [_sig(v, digits) for v in result.samples]},
        "fit": {"n": result.n, "criterion": CRITERION, "reason": result.reason,
                "aic": {k: round(v, 3) for k, v in result.aic.items()}},
    }


# The shortest time per iteration a profile records (1 microsecond): below what any run resolves.
MIN_ITER_S = 1e-6


def split_timed_trains(short: Sequence[tuple[float, Sequence[float]]], long: Sequence[tuple[float, Sequence[float]]],
                       k_short: int, k_long: int) -> tuple[list[float], list[float]]:
    """Per-trial estimates of seconds per iteration and of start-up from TRAIN durations and
    the iterations the workers timed themselves.

    Each TRAIN is ``(duration, iteration seconds)``. Its untimed part ``o = d - sum(iters)``
    is the start-up plus whatever each iteration costs outside the worker's timer (reporting,
    the driver's round trip): with ``u = (mean(o_long) - mean(o_short)) / (k_long -
    k_short)`` (clipped at 0), each long trial gives ``L_j = mean(iters_j) + u`` and every
    trial a start-up ``o_i - k_i u``. So ``d = startup + k L`` (DESIGN §4) still holds on
    average, but ``L`` is read from the timed iterations themselves rather than from the
    difference of two noisy durations (``split_train_durations``): the short trials' single
    iteration, and the concurrency noise of whole TRAINs, no longer move it. The run's own
    timings (the ledger's ``iter_s``, the re-planner's observations) are the same timer.

    Raises:
        SpecError: ``k_long <= k_short``, no TRAIN on either side, or a TRAIN whose timed
            iterations are not ``k_short`` / ``k_long`` many.
    """
    if k_long <= k_short:
        raise SpecError(f"iters: the long trials ({k_long}) must run more iterations than the short ones ({k_short})")
    for side, runs, k in (("short", short, k_short), ("long", long, k_long)):
        if not runs:
            raise SpecError(f"no {side} TRAIN durations to estimate from")
        if any(len(it) != k for _, it in runs):
            raise SpecError(f"{side} TRAINs: expected {k} timed iterations each")
    untimed_short = [d - sum(it) for d, it in short]
    untimed_long = [d - sum(it) for d, it in long]
    u = max(0.0, (float(np.mean(untimed_long)) - float(np.mean(untimed_short))) / (k_long - k_short))
    per_trial = [max(MIN_ITER_S, float(np.mean(it)) + u) for _, it in long]
    startup = [max(0.0, o - k_short * u) for o in untimed_short] + [max(0.0, o - k_long * u) for o in untimed_long]
    return per_trial, startup


def split_train_durations(short: Sequence[float], long: Sequence[float], k_short: int,
                          k_long: int) -> tuple[list[float], list[float]]:
    """Per-trial estimates of seconds per iteration and of start-up from TRAIN durations.

    A TRAIN node of ``k`` iterations lasts ``d = startup + k L`` (DESIGN §4). With trials of
    ``k_short`` and of ``k_long`` iterations measured alike, ``L̂ = (mean(d_long) -
    mean(d_short)) / (k_long - k_short)``; each long trial gives ``L_j = (d_j -
    mean(d_short)) / (k_long - k_short)`` (a slow trial stays slow) and each short trial a
    start-up ``d_i - k_short L̂``. Start-ups are clipped at 0; times per iteration at
    ``MIN_ITER_S``: an iteration too short for the runs to resolve (noise swamps the extra
    iterations' time) still takes some time, and a profile needs it positive — measure with
    more ``iters`` to resolve it.

    Returns:
        ``(iter_latency_samples, startup_samples)``.

    Raises:
        SpecError: ``k_long <= k_short`` or no durations on either side.
    """
    if k_long <= k_short:
        raise SpecError(f"iters: the long trials ({k_long}) must run more iterations than the short ones ({k_short})")
    d_short, d_long = _clean(short, "short TRAIN durations"), _clean(long, "long TRAIN durations")
    base = float(np.mean(d_short))
    span = float(k_long - k_short)
    per_trial = [max(MIN_ITER_S, (d - base) / span) for d in d_long.tolist()]
    iter_hat = max(MIN_ITER_S, (float(np.mean(d_long)) - base) / span)
    startup = [max(0.0, d - k_short * iter_hat) for d in d_short.tolist()]
    return per_trial, startup


def checkpoint_interval(trials: Sequence[tuple[Sequence[float], float]]) -> int | None:
    """``c``, a function trainable's iterations per checkpoint (``checkpoint_every``; one report
    is one iteration unless the experiment names a ``time_attr``), from profiled trials.

    Each trial gives the iterations it reported checkpoints at and how far it got, ``L``. With
    two checkpoints or more, its pace is the largest gap between consecutive ones (a steady
    pace is that gap; an uneven one is read at its slowest, so that the model errs toward more
    redone work); with one, at ``j``, the smallest pace that fits it, ``max(j, L - j + 1)`` (the
    first came at ``j``; none in the ``L - j`` after it). Gaps of a ``time_attr`` are rounded up
    to whole iterations. Over trials, the largest pace.

    Returns:
        ``c >= 1``, or ``None`` when no trial reported a checkpoint: it never checkpoints (or
        less often than once in ``L`` iterations, which the profile cannot tell apart).
    """
    paces = []
    for checkpoints, reached in trials:
        points = sorted(float(c) for c in checkpoints)
        if len(points) >= 2:
            paces.append(max(b - a for a, b in zip(points, points[1:])))
        elif points:
            j = points[0]
            paces.append(max(j, float(reached) - j + 1))
    if not paces:
        return None
    return max(1, math.ceil(round(max(paces), 9)))
