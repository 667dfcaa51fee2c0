"""The scheduler on a plan with an instance type per stage and packed stages (docs/model.md):
scripted event streams in, decisions out."""

from __future__ import annotations

from collections import Counter

import pytest

from rubberband import ExperimentSpec
from rubberband.plan.plan import Plan
from rubberband.scheduler import (
    InstanceReady,
    ReleaseInstances,
    Replanner,
    RequestInstances,
    RunSync,
    Scheduler,
    StartTrial,
    StopTrial,
    TrainFinished,
)
from rubberband.simulator import simulate
from rubberband.testing.builders import cloud_profile, model_profile
from rubberband.testing.drive import drive

MODEL = model_profile({g: 10.0 / g for g in (1, 2, 4, 8)}, startup_s=1.0, sync_s=1.0, name="m",
                      packed_iter_latency_s={2: 14.0, 4: 25.0})
CLOUDS = {"small": cloud_profile("small", 1, 3.0, provision_s=5, init_s=5),
          "big": cloud_profile("big", 4, 12.0, provision_s=5, init_s=5)}


def make_plan(spec, allocation, types=None, packing=None) -> Plan:
    clouds = CLOUDS if types else CLOUDS["big"]
    result = simulate(spec, allocation, MODEL, clouds, samples=2, trials_per_gpu=packing, instance_types=types)
    return Plan(allocation=result.allocation, instances=result.instances,
                gpus_per_trial=tuple(s.gpus_per_trial for s in result.stages), predicted=result, deadline_s=3600.0,
                policy="manual", spec=spec, cloud=CLOUDS[types[0]] if types else CLOUDS["big"], samples=2,
                instance_types=tuple(types or ()), trials_per_gpu=tuple(packing or ()),
                type_clouds=dict(CLOUDS) if types else {})


def run(s: Scheduler) -> list:
    """Instances up at once with their type's GPUs, a SYNC at once, trials finishing in the order
    started, scoring by their number; every decision."""
    return drive(s, gpus={name: c.gpus_per_instance for name, c in CLOUDS.items()})


def stage_of(log, i, kind):
    return [d for d in log if isinstance(d, kind) and getattr(d, "stage", i) == i]


def test_each_stage_requests_its_own_type_and_a_change_releases_every_old_instance_first():
    spec = ExperimentSpec.from_stages([(8, 2), (4, 3), (2, 4), (1, 5)])
    plan = make_plan(spec, [8, 8, 8, 1], ["small", "big", "big", "small"])
    log = run(Scheduler(plan))
    requests = [d for d in log if isinstance(d, RequestInstances)]
    assert [(d.instance_type, len(d.names), d.stage) for d in requests] == [("small", 8, 0), ("big", 2, 1),
                                                                            ("small", 1, 3)]
    small0, big = set(requests[0].names), set(requests[1].names)
    # At stage 0's SYNC every small instance goes (the survivors paused first), before the big ones come.
    cut = log.index(requests[1])
    released = {n for d in log[:cut] if isinstance(d, ReleaseInstances) for n in d.names}
    assert released == small0
    paused = [d.trial for d in log[:cut] if isinstance(d, StopTrial) and not d.eliminated]
    assert len(paused) == 4
    starts = [d for d in stage_of(log, 1, StartTrial)]
    assert sorted(d.trial for d in starts) == sorted(paused)
    assert all(len(d.slots) == 2 and {n for n, _ in d.slots} <= big for d in starts)
    # Stage 2 stays on big: nothing released at stage 1's SYNC; the change back to small releases both.
    sync2 = next(j for j, d in enumerate(log) if isinstance(d, RunSync) and d.stage == 2)
    assert not any(isinstance(d, ReleaseInstances) and set(d.names) & big for d in log[cut:sync2])
    assert all(len(d.slots) == 4 for d in stage_of(log, 2, StartTrial))
    assert {n for d in log[sync2:log.index(requests[2])] if isinstance(d, ReleaseInstances) for n in d.names} == big


def test_a_packed_stage_runs_k_trials_per_gpu_queues_the_rest_and_a_wider_stage_resizes_its_survivors():
    spec = ExperimentSpec.from_stages([(12, 2), (2, 3)])
    plan = make_plan(spec, [2, 8], packing=[4, 1])
    s = Scheduler(plan, mode="max")      # the last queued win: they still hold their shared GPU at the SYNC
    first = s.start(0.0)
    [request] = [d for d in first if isinstance(d, RequestInstances)]
    out = [d for n in request.names for d in s.on(InstanceReady(n, 4, 1.0), 1.0)]
    starts = [d for d in out if isinstance(d, StartTrial)]
    assert len(starts) == 8 and all(d.trials_per_gpu == 4 and len(d.slots) == 1 for d in starts)
    per_gpu = Counter(d.slots[0] for d in starts)
    assert len(per_gpu) == 2 and set(per_gpu.values()) == {4}          # 2 GPUs, 4 trials each
    assert s._queue == [f"t{j:03d}" for j in range(8, 12)]
    # A finished trial hands its share of the GPU to the next queued one.
    [nxt] = s.on(TrainFinished(starts[0].trial, 2, 5.0), 2.0)
    assert nxt.trial == "t008" and nxt.slots == starts[0].slots and nxt.trials_per_gpu == 4
    log = drive(s, running=[*starts[1:], nxt], now=3.0, steps={starts[0].trial: 2})
    # Stage 1 gives each of its 2 trials 4 GPUs: the survivors leave their shared GPU (paused, resized).
    wide = stage_of(log, 1, StartTrial)
    assert len(wide) == 2 and all(len(d.slots) == 4 and d.trials_per_gpu == 1 for d in wide)
    paused = {d.trial for d in log if isinstance(d, StopTrial) and not d.eliminated}
    assert {d.trial for d in wide} == paused == {"t010", "t011"}


def test_a_packed_train_at_the_packed_latency_is_on_the_profiled_pace():
    spec = ExperimentSpec.from_stages([(8, 2), (2, 3)])
    r = Replanner(make_plan(spec, [2, 2], packing=[4, 1]), MODEL)
    for _ in range(5):
        r.observe(1, 10, 1.0 + 10 * 25.0, trials_per_gpu=4)
    assert r.factor == pytest.approx(1.0)


def test_the_budget_prices_each_stages_requests_at_its_own_type():
    spec = ExperimentSpec.from_stages([(8, 2), (4, 3), (2, 4), (1, 5)])
    plan = make_plan(spec, [8, 8, 8, 1], ["small", "big", "big", "small"])
    # 8 small at their 60 s minimum ($0.40) fit; 2 big at theirs ($0.40) no longer do.
    s = Scheduler(plan, budget_usd=0.55)
    log = run(s)
    assert [(d.instance_type, len(d.names)) for d in log if isinstance(d, RequestInstances)] == [("small", 8)]
    assert s.report().stopped.startswith("budget: ") and "cannot pay the minimum charge of 2 more big (on-demand): $0.40" \
        in s.report().stopped
