"""One sampled run as a timeline of instances and trials, for Gantt charts and inspection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rubberband.errors import SpecError
from rubberband.profiles.cloud import CloudProfile
from rubberband.profiles.model import ModelProfile
from rubberband.simulator.engine import layout
from rubberband.simulator.model import StageDraws
from rubberband.spec.experiment import ExperimentSpec


@dataclass(frozen=True)
class InstanceSpan:
    instance: int          # launch number in the job
    requested_s: float     # SCALE start
    launched_s: float      # SCALE end: billing starts
    ready_s: float         # INIT_INSTANCE end
    released_s: float


@dataclass(frozen=True)
class TrialSpan:
    stage: int
    trial: int
    instances: tuple[int, ...]   # every instance the trial's GPUs are on (launch numbers)
    lane: int              # which of the instance's trial slots it takes (0 when it spans instances)
    gpus: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Timeline:
    instances: tuple[InstanceSpan, ...]
    trials: tuple[TrialSpan, ...]
    stages: tuple[tuple[float, float, float], ...]   # (start, trials start, SYNC end) per stage
    jct_s: float
    sample: int = 0        # which of ``samples`` Monte-Carlo samples this is
    samples: int = 1


def median_sample(jct_s: Sequence[float]) -> int:
    """Index of the median sample by JCT (the lower middle one for an even count): a typical
    run to draw, where sample 0 may sit anywhere in the distribution."""
    order = np.argsort(np.asarray(jct_s), kind="stable")
    return int(order[(len(order) - 1) // 2])


def sample_timeline(spec: ExperimentSpec, allocation: Sequence[int], model: ModelProfile, cloud: CloudProfile,
                    seed: int = 0, instances: Sequence[int] | None = None, samples: int = 1,
                    sample: int = 0) -> Timeline:
    """Replay one sample of the simulator event by event.

    Its JCT equals ``simulate(..., samples=samples, seed=seed).jct_s[sample]``; trials are
    laid on instances as the placement policy packs them (each trial's GPUs on one instance,
    or on whole instances when it needs more than one).

    Raises:
        SpecError: for an invalid allocation, or ``sample`` outside ``0..samples-1``.
    """
    if isinstance(sample, bool) or not isinstance(sample, (int, np.integer)) or not 0 <= sample < samples:
        raise SpecError(f"sample: expected a sample number in 0..{samples - 1}, got {sample!r}")
    shapes, held = layout(spec, allocation, model, cloud, instances)
    G = cloud.gpus_per_instance
    now = 0.0
    alive: list[list[float]] = []                   # [id, requested, launched, ready], oldest first
    spans: list[InstanceSpan] = []
    trials: list[TrialSpan] = []
    stages = []
    launched = 0
    for shape, count in zip(shapes, held):
        d = StageDraws(seed, shape.index, samples)
        start = now
        while len(alive) > count:                   # release newest first at the previous SYNC
            iid, req, lau, rdy = alive.pop()
            spans.append(InstanceSpan(int(iid), req, lau, rdy, now))
        if count > len(alive):
            new = count - len(alive)
            scale_end = now + float(d.scale(cloud)[sample])
            ready = scale_end + float(d.init_max(cloud, new)[sample])
            for _ in range(new):
                alive.append([launched, now, scale_end, ready])
                launched += 1
            now = ready
        train_start = now
        durations = d.train_durations(model, shape)[:, sample]
        m = shape.gpus_per_trial
        per_instance = G // m if m <= G else 0
        span = -(-m // G)                           # whole instances a trial takes when m > G
        free = [train_start] * shape.running
        for t in range(shape.num_trials):
            slot = t if t < shape.running else min(range(shape.running), key=lambda g: free[g])
            begin = free[slot]
            free[slot] = begin + float(durations[t])
            if per_instance:
                hosts, lane = [slot // per_instance], slot % per_instance
            else:
                hosts, lane = range(slot * span, (slot + 1) * span), 0
            trials.append(TrialSpan(shape.index, t, tuple(int(alive[h][0]) for h in hosts), lane, m, begin, free[slot]))
        now = max(free) + float(d.sync(model)[sample])
        stages.append((start, train_start, now))
    for iid, req, lau, rdy in reversed(alive):
        spans.append(InstanceSpan(int(iid), req, lau, rdy, now))
    return Timeline(tuple(sorted(spans, key=lambda s: s.instance)), tuple(trials), tuple(stages), now, sample, samples)
