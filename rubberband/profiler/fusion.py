"""Fused throughput: seconds per iteration of a fused group of F trials on one device, and its memory.

For ``F = 1, 2, 4, ...`` a worker takes F configurations from the search space as one fused
group (``DDPWorker.assign_group``, ``rubberband.fusion``), trains one iteration to warm up,
then ``iters`` iterations, each as a run trains it (one call, the members' evaluation and the
group's checkpoint after it); each such round of the whole group is one sample of ``L_F``. Its
memory is the group's peak (``torch.cuda.max_memory_allocated`` on CUDA, the process's peak
RSS on CPU). Memory is linear in F (Hydro, OSDI '23): from two sizes,

    m(F) = m₁ + (F − 1)·Δ,   Δ = (m(F₂) − m₁) / (F₂ − 1),   F_max = 1 + ⌊(M − m₁) / Δ⌋

for a device of M GB (least squares over every size measured). It stops after the first F
whose throughput (F over the seconds per iteration) rises less than ``MIN_GAIN`` over the one
before, when the next F would not fit ``M`` on the fitted line, when a worker runs out of
memory, or at ``max_f``. The same worker first times one trial unfused, so the profile can
put the fused latencies on the solo latency's scale (``fused_entries``).

Profile entries (plain dicts; ``to_profile_entry``'s fitted distributions, as
``iter_latency_s`` has them):

    fused_iter_latency_s: {F: {dist: normal, mean: s, std: s}, ...}   # one iteration of all F
    fused_memory_gb: {F: gb, ...}

``next_size`` and ``fit_memory`` are pure; ``measure_fused`` calls a worker through ``call``
(a local ``DDPWorker``'s methods, or a Ray actor's through ``ray.get``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rubberband.profiler.fit import to_profile_entry
from rubberband.profiler.packing import MIN_GAIN

DEFAULT_MAX_F = 16


def not_measured(groups: list[list[int]], reason: str | None) -> str | None:
    """Why fused groups are not measured for the search space's sampled configs: the trainer's
    reason (``DDPWorker.fusable``), or — when its configs give the model several shapes — that
    the executor groups trials by GPU, not by shape, so such a job runs unfused (its profile gets
    no fused latencies and nothing is planned fused); ``None`` when they are measured."""
    if reason is None and len(groups) > 1:
        return (f"the search space gives the model {len(groups)} shapes (a width in it); a fused group needs one "
                "shape, and the executor does not group trials by shape yet: run unfused")
    return reason


@dataclass(frozen=True)
class FusedSize:
    """One F: the group's seconds per iteration (one sample per iteration) and its peak memory."""

    F: int
    iter_samples: tuple[float, ...]
    memory_gb: float | None = None

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.iter_samples)

    @property
    def throughput(self) -> float:
        """Trial-iterations per second of the group."""
        return self.F / self.mean_s


@dataclass(frozen=True)
class FusedResult:
    """What the fused measurement found."""

    sizes: tuple[FusedSize, ...]
    stopped: str                       # why no larger F was measured
    solo_iter_s: float                 # one trial alone, unfused, on the same worker
    forward: str = ""                  # the group's forward: batched or vmap
    optimizer: str = ""                # the group's optimizer step: FusedSGD, FusedAdam, PerMemberStep
    device_memory_gb: float | None = None

    def fit(self) -> tuple[float, float] | None:
        """``(m1, Δ)`` of ``m(F) = m1 + (F − 1)·Δ``, or ``None`` with fewer than two sizes."""
        points = {s.F: s.memory_gb for s in self.sizes if s.memory_gb is not None}
        return fit_memory(points) if len(points) >= 2 else None

    def f_max(self) -> int | None:
        """The largest F whose fitted memory fits ``device_memory_gb`` (None: unknown)."""
        line = self.fit()
        if line is None or self.device_memory_gb is None:
            return None
        return f_max(*line, self.device_memory_gb)


def fit_memory(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares ``m(F) = m1 + (F − 1)·Δ`` through ``{F: GB}``; returns ``(m1, Δ)``, Δ ≥ 0."""
    xs = [F - 1 for F in points]
    ys = list(points.values())
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    delta = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx) if sxx else 0.0
    return my - delta * mx, delta


def f_max(m1: float, delta: float, device_gb: float) -> int | None:
    """Largest F with ``m1 + (F − 1)·Δ ≤ device_gb``: 0 when one member does not fit, None when
    memory does not grow with F (no limit from memory)."""
    if m1 > device_gb:
        return 0
    return 1 + int((device_gb - m1) // delta) if delta > 0 else None


def next_size(done: Sequence[FusedSize], max_f: int, device_memory_gb: float | None = None) -> tuple[int | None, str]:
    """The next F to measure (doubling), or ``None`` and why to stop."""
    if not done:
        return 1, ""
    last = done[-1]
    if len(done) > 1 and last.throughput < done[-2].throughput * (1 + MIN_GAIN):
        gain = last.throughput / done[-2].throughput - 1
        return None, (f"throughput stopped rising: {last.F} fused gives {gain:+.0%} over {done[-2].F} "
                      f"({last.throughput:.3g} vs {done[-2].throughput:.3g} trial-iterations/s)")
    F = 2 * last.F
    if F > max_f:
        return None, f"reached the largest group asked for ({max_f})"
    points = {s.F: s.memory_gb for s in done if s.memory_gb is not None}
    if device_memory_gb and len(points) >= 2:
        m1, delta = fit_memory(points)
        if m1 + (F - 1) * delta > device_memory_gb:
            return None, (f"memory: {F} fused would need {m1 + (F - 1) * delta:.3g} GB "
                          f"(m1 {m1:.3g} + (F-1) x {delta:.3g}), over the device's {device_memory_gb:.3g} GB")
    return F, ""


def measure_fused(call: Callable[..., Any], configs: Callable[[int], list[dict[str, Any]]], iters: int,
                  max_f: int = DEFAULT_MAX_F, device_memory_gb: float | None = None,
                  on_size: Callable[[FusedSize], None] | None = None,
                  may_continue: Callable[[], bool] = lambda: True,
                  clock: Callable[[], float] = time.perf_counter) -> FusedResult:
    """Measure a fused group's latency and memory for F = 1, 2, 4, ... on one warm worker.

    Each sample is one round as a run trains a fused group: one iteration of every member, their
    evaluation and the group's checkpoint, timed around the calls (a Ray actor's round trip
    included), so that what a run does per iteration beside the optimizer steps — evaluating and
    checkpointing every member, which grows with F — is in ``L_F``, as it is in the unfused
    latency the profiler reads from real TRAINs. The solo sample is timed the same way.

    Args:
        call: ``call(method, *args)`` runs a ``DDPWorker`` method on the worker (warmed up).
        configs: ``configs(n)`` -> ``n`` configurations from the search space.
        iters: timed rounds per size (after one warm-up round).
        max_f: the largest group to try.
        device_memory_gb: the device's memory, for the stopping rule and ``f_max``.
        on_size: called with each measured F.
        may_continue: asked before each F after the first (a time budget); ``False`` stops.

    Returns:
        A ``FusedResult`` with at least F = 1.
    """
    def rounds(checkpoint: str) -> list[float]:
        """Seconds of each of ``iters`` rounds as a run trains them (``executor/ray_runner.py``):
        one iteration per call, its evaluation and the checkpoint after it; the first warms up."""
        call("train", 1)
        call(checkpoint)
        out = []
        for _ in range(iters):
            t0 = clock()
            call("train", 1)
            call(checkpoint)
            out.append(clock() - t0)
        return out

    call("assign", configs(1)[0], None)
    solo = statistics.fmean(rounds("checkpoint"))
    call("leave")
    done: list[FusedSize] = []
    forward = optimizer = stopped = ""
    F: int | None = 1
    while F is not None:
        try:
            call("assign_group", [f"f{i}" for i in range(F)], configs(F), None)
            samples = rounds("checkpoint_group")
            memory = call("peak_memory_gb")
            forward, optimizer = call("group_paths")
        except Exception as exc:
            if done and "out of memory" in str(exc).lower():
                stopped = f"memory: {F} fused ran out of device memory"
                break
            raise
        finally:
            call("leave")
        size = FusedSize(F, tuple(samples), memory)
        done.append(size)
        if on_size is not None:
            on_size(size)
        F, stopped = next_size(done, max_f, device_memory_gb)
        if F is not None and not may_continue():
            F, stopped = None, "time budget (--max-seconds) reached"
    return FusedResult(tuple(done), stopped, solo, forward, optimizer, device_memory_gb)


def fused_entries(result: FusedResult, solo_s: float | None = None) -> dict[str, Any]:
    """The profile's fused keys from a measurement, latencies scaled by ``solo_s /
    result.solo_iter_s`` (so that the same worker's unfused trial equals the profile's solo
    ``L``: what the planner compares is the measured ratio, not the two methods' difference).

    Returns:
        ``{"fused_iter_latency_s": {F: distribution}, "fused_memory_gb": {F: GB} (empty below
        two sizes),
        "profiling": {...}}`` — ``profiling`` is what ``profiling.fusion`` records: the scale,
        the stop reason, the throughput against one trial alone, the memory fit and F_max.
    """
    scale = solo_s / result.solo_iter_s if solo_s else 1.0
    entries = {s.F: to_profile_entry([x * scale for x in s.iter_samples]) for s in result.sizes}
    line = result.fit()
    memory = {s.F: round(s.memory_gb, 4) for s in result.sizes if s.memory_gb is not None}
    out: dict[str, Any] = {
        "fused_iter_latency_s": {F: e["fitted"] for F, e in entries.items()},
        # At least two sizes, or there is no line m1 + (F − 1)·Δ to fit (the profile refuses one).
        "fused_memory_gb": memory if len(memory) >= 2 else {},
        "profiling": {
            "stopped": result.stopped, "forward": result.forward, "optimizer": result.optimizer,
            "solo_iter_s_as_fused": round(result.solo_iter_s, 6), "scaled_by": round(scale, 4),
            "throughput_vs_alone": {s.F: round(s.F / s.mean_s * result.solo_iter_s, 4) for s in result.sizes},
            "fit": {F: e["fit"] for F, e in entries.items()},
            "samples": {F: e["empirical"]["samples"] for F, e in entries.items()},
        },
    }
    if line is not None:
        out["profiling"]["memory_fit"] = {"m1_gb": round(line[0], 4), "delta_gb": round(line[1], 6),
                                          "f_max": result.f_max(), "device_memory_gb": result.device_memory_gb}
    return out


def local_call(worker: Any) -> Callable[..., Any]:
    """``call`` for a worker in this process."""
    return lambda method, *args: getattr(worker, method)(*args)
