"""One sampled run as a timeline of instances and trials, for Gantt charts and inspection."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    instance: int          # first instance the trial runs on
    gpus: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Timeline:
    instances: tuple[InstanceSpan, ...]
    trials: tuple[TrialSpan, ...]
    stages: tuple[tuple[float, float, float], ...]   # (start, trials start, SYNC end) per stage
    jct_s: float


def sample_timeline(spec: ExperimentSpec, allocation: Sequence[int], model: ModelProfile, cloud: CloudProfile,
                    seed: int = 0, instances: Sequence[int] | None = None) -> Timeline:
    """Replay the simulator for a single sample (``samples=1`` with ``seed``) event by event.

    Its JCT equals ``simulate(..., samples=1, seed=seed).jct_s[0]``; trials are laid on
    instances as the placement policy packs them (each trial's GPUs on one instance, or on
    whole instances when it needs more than one).
    """
    shapes, held = layout(spec, allocation, model, cloud, instances)
    G = cloud.gpus_per_instance
    now = 0.0
    alive: list[list[float]] = []                   # [id, requested, launched, ready], oldest first
    spans: list[InstanceSpan] = []
    trials: list[TrialSpan] = []
    stages = []
    launched = 0
    for shape, count in zip(shapes, held):
        d = StageDraws(seed, shape.index, 1)
        start = now
        while len(alive) > count:                   # release newest first at the previous SYNC
            iid, req, lau, rdy = alive.pop()
            spans.append(InstanceSpan(int(iid), req, lau, rdy, now))
        if count > len(alive):
            new = count - len(alive)
            scale_end = now + float(d.scale(cloud)[0])
            ready = scale_end + float(d.init_max(cloud, new)[0])
            for _ in range(new):
                alive.append([launched, now, scale_end, ready])
                launched += 1
            now = ready
        train_start = now
        durations = d.train_durations(model, shape)[:, 0]
        m = shape.gpus_per_trial
        per_instance = max(1, G // m) if m <= G else 0
        free = [train_start] * shape.running
        for t in range(shape.num_trials):
            slot = t if t < shape.running else min(range(shape.running), key=lambda g: free[g])
            begin = free[slot]
            free[slot] = begin + float(durations[t])
            host = slot // per_instance if per_instance else slot * -(-m // G)
            trials.append(TrialSpan(shape.index, t, int(alive[host][0]), m, begin, free[slot]))
        now = max(free) + float(d.sync(model)[0])
        stages.append((start, train_start, now))
    for iid, req, lau, rdy in reversed(alive):
        spans.append(InstanceSpan(int(iid), req, lau, rdy, now))
    return Timeline(tuple(sorted(spans, key=lambda s: s.instance)), tuple(trials), tuple(stages), now)
