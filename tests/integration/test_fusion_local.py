"""Fused stages for real on the local provider (DESIGN §4.5): six trials in two fused groups of
three on the two logical GPUs of one instance, each group one worker training its members as one
program; the winners leave as ordinary checkpoints and go on unfused. Every trial ends exactly
where the same trial trained alone ends (the worker's own loop, in this process)."""

import pytest
import torch

import rubberband as rb
from rubberband.executor.run import execute
from rubberband.executor.worker import DDPWorker
from rubberband.plan import plan_allocation
from rubberband.providers.local import LocalCluster

from .conftest import trainer

pytestmark = pytest.mark.integration

SPACE = {"lr": {"loguniform": [0.01, 0.3]}, "momentum": [0.5, 0.9]}
SEED = 4


@pytest.fixture(autouse=True)
def _denormals_back():
    yield
    torch.set_flush_denormal(False)      # DDPWorker flushes denormals process-wide


def test_a_fused_stage_trains_groups_on_one_worker_per_gpu_and_each_member_as_alone(tmp_path, model, cloud):
    fused_model = model.replace(fused_iter_latency_s={4: model.iter_latency_s[1].with_moments(
        2 * model.iter_latency_s[1].mean, model.iter_latency_s[1].std)})
    spec = rb.ExperimentSpec.from_stages([(6, 3), (2, 2)])
    plan = plan_allocation(spec, (2, 2), fused_model, cloud, deadline_s=600, samples=20, fused_per_gpu=(4, 1))
    assert plan.instances == (1, 1)
    stages = []
    result = execute(plan, trainer("Tiny"), SPACE, metric="val_loss", seed=SEED, runs_dir=tmp_path / "runs",
                     on_event=lambda kind, data: stages.append(data) if kind == "stage" else None)

    assert [(d["trials_per_gpu"], d.get("fused", False)) for d in stages] == [(4, True), (1, False)]
    first = {tid: t["history"][0] for tid, t in result.trials.items()}
    assert len(first) == 6 and all(h["fused"] and h["trials_per_gpu"] == 4 for h in first.values())
    by_gpu: dict = {}
    for tid, h in first.items():
        by_gpu.setdefault((tuple(h["instances"]), tuple(map(tuple, h["gpu_ids"]))), []).append(tid)
    # Two groups on the instance's two GPUs, the six members balanced over them (the model charges
    # each group L_4 either way, DESIGN §4.5).
    assert sorted(len(g) for g in by_gpu.values()) == [3, 3] and len({k[0] for k in by_gpu}) == 1

    # Each trial as it would have trained alone: its metric after stage 0 and, for the two
    # promoted, after stage 1 (resumed from its stage-0 checkpoint, unfused).
    alone = DDPWorker(trainer("Tiny"), SEED)
    alone.warmup()
    for tid, t in result.trials.items():
        alone.assign(t["config"], None, tid)
        out = alone.train(3)
        assert out["metrics"]["val_loss"] == pytest.approx(first[tid]["val_loss"], rel=1e-5), tid
        if len(t["history"]) > 1:
            alone.assign(t["config"], alone.checkpoint(), tid)
            out = alone.train(2)
            assert out["metrics"]["val_loss"] == pytest.approx(t["history"][1]["val_loss"], rel=1e-5), tid
            assert not t["history"][1].get("fused") and t["history"][1]["step"] == out["step"] == 25
    assert sum(1 for t in result.trials.values() if len(t["history"]) == 2) == 2
    assert "stage 0: 4 trials fused per GPU" in result.table()
    assert all(i["released_s"] is not None for i in result.ledger["instances"])
    assert LocalCluster.known() == []
