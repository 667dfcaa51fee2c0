"""A packed stage for real on the local provider: two trials share one logical GPU as Ray actors of half a GPU."""

import dataclasses

import pytest

import rubberband as rb
from rubberband.executor.run import execute
from rubberband.plan import plan_allocation, simulate_plan
from rubberband.providers.local import LocalCluster

from .conftest import trainer
from .tiny_trainer import Sleepy

pytestmark = pytest.mark.integration

SPACE = {"lr": {"loguniform": [0.01, 0.3]}, "hidden": [32, 64]}


def test_a_packed_stage_runs_two_trials_on_each_logical_gpu_at_once(tmp_path, model, cloud):
    # Stage 0: 4 trials of 8 iterations on the 2 logical GPUs of one local.2gpu instance, 2 to
    # a GPU (all at once); stage 1: the best one alone on a whole GPU (the warm pool swaps its
    # half-GPU workers for whole-GPU ones), resumed from its checkpoint.
    spec = rb.ExperimentSpec.from_stages([(4, 8), (1, 10)])
    packed_model = model.replace(packed_iter_latency_s={2: model.iter_latency_s[1]})
    plan = plan_allocation(spec, (2, 1), packed_model, cloud, deadline_s=600, samples=20)
    plan = dataclasses.replace(plan, trials_per_gpu=(2, 1))
    plan = dataclasses.replace(plan, predicted=simulate_plan(plan, packed_model, samples=20))
    assert plan.instances == (1, 1) and plan.gpus_per_trial == (1, 1)
    stage_lines = []

    def on_event(kind, data):
        if kind == "stage":
            stage_lines.append(data)

    result = execute(plan, trainer("Sleepy"), SPACE, metric="val_loss", seed=4, runs_dir=tmp_path / "runs",
                     latency_scale=0.2, on_event=on_event)

    assert [d["trials_per_gpu"] for d in stage_lines] == [2, 1]
    stage0 = {tid: t["history"][0] for tid, t in result.trials.items()}
    assert len(stage0) == 4 and {h["trials_per_gpu"] for h in stage0.values()} == {2}
    on_gpu: dict[tuple[str, str], list[dict]] = {}
    for h in stage0.values():
        (instance,), ((gpu,),) = h["instances"], h["gpu_ids"]          # one worker, on one GPU
        on_gpu.setdefault((instance, gpu), []).append(h)
    # Both logical GPUs of the one instance, two trials on each, training at the same time.
    # Each iteration sleeps 0.75 s (6 s a TRAIN); the driver starts the 4 gangs one after
    # another (~1 s each here), so GPU mates overlap by several iterations, not by a moment.
    assert sorted(on_gpu) == [("rb-instance-1", "0"), ("rb-instance-1", "1")]
    for a, b in on_gpu.values():
        overlap = min(a["end_s"], b["end_s"]) - max(a["start_s"], b["start_s"])
        assert overlap > 2 * Sleepy.ITER_S * Sleepy.SLOWDOWN, (a, b)

    winner = result.trials[result.best["trial"]]
    h0, h1 = winner["history"]
    assert (h1["trials_per_gpu"], h1["step"]) == (1, 8 + 10)           # resumed at step 8 on a whole GPU
    assert len(h1["gpu_ids"]) == 1
    assert sum(1 for t in result.trials.values() if t["eliminated_after"] == 0) == 3

    instances = result.ledger["instances"]
    assert len(instances) == 1 and instances[0]["released_s"] is not None
    assert result.actual["cost_usd"] > 0 and result.stages[0]["actual"]["instances"] == 1
    assert LocalCluster.known() == []                                  # nothing left running
