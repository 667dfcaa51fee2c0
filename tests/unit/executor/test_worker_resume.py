"""Exact resume: a trial's batch stream is a function of its optimizer step, so a trial resumed
from a checkpoint (alone, fused, regrouped) trains on the batches it would have seen had it never
stopped — across epoch boundaries too."""

from __future__ import annotations

import pytest

from rubberband.examples.digits import DigitsMLP
from tests.unit.fusion.toys import Toy

torch = pytest.importorskip("torch")

from rubberband.executor.worker import DDPWorker  # noqa: E402
from tests.unit.fusion.test_group import load, rel_diff  # noqa: E402


@pytest.fixture(autouse=True)
def _worker_process_settings_back():
    threads = torch.get_num_threads()
    yield
    torch.set_flush_denormal(False)
    torch.set_num_threads(threads)


class ToyStep(Toy):
    steps_per_iter = 1          # 150 samples, batch 16: 9 steps an epoch


class Digits5(DigitsMLP):
    steps_per_iter = 5          # 1437 samples, batch 64: 22 steps an epoch


def solo(trainer, config, steps, blob=None, seed=0):
    w = DDPWorker(trainer, seed=seed)
    w.warmup()
    w.assign(config, blob)
    out = w.train(steps // trainer.steps_per_iter)
    return w.checkpoint(), out


def fused(w, configs, steps, blobs):
    w.assign_group([f"t{i}" for i in range(len(configs))], configs, blobs)
    out = w.train(steps // w.trainer.steps_per_iter)
    return w.checkpoint_group(), out


@pytest.mark.parametrize("trainer, first, second", [(ToyStep(), 50, 50), (ToyStep(), 5, 13), (Digits5(), 30, 30)],
                         ids=["toy-50+50", "toy-5+13", "digits-30+30"])
def test_solo_resumed_equals_solo_uninterrupted(trainer, first, second):
    config = {"lr": 0.05, "momentum": 0.9, "wd": 1e-4, "weight_decay": 1e-4}
    half, _ = solo(trainer, config, first)
    resumed, out = solo(trainer, config, second, half)
    whole, whole_out = solo(trainer, config, first + second)
    assert out["step"] == whole_out["step"] == first + second
    assert rel_diff(resumed, whole) <= 1e-6
    assert out["metrics"]["val_loss"] == pytest.approx(whole_out["metrics"]["val_loss"], rel=1e-6)
    per_epoch = 9 if isinstance(trainer, ToyStep) else 22
    assert load(resumed)["epoch"] == (first + second) // per_epoch


@pytest.mark.parametrize("trainer", [ToyStep(), Digits5()], ids=["toy", "digits"])
def test_fused_split_and_regrouped_equals_each_member_alone_uninterrupted(trainer):
    configs = [{"lr": 0.05, "momentum": 0.9}, {"lr": 0.2, "momentum": 0.5},
               {"lr": 0.01, "momentum": 0.0, "wd": 1e-3, "weight_decay": 1e-3}, {"lr": 0.1, "momentum": 0.7}]
    w = DDPWorker(trainer, seed=0)
    w.warmup()
    # Stage 1: members 0-2 fused, member 3 alone; 30 steps (past the toy's epoch of 9, into the digits' 2nd of 22).
    blobs, _ = fused(w, configs[:3], 30, None)
    w.leave()
    blobs.append(solo(trainer, configs[3], 30)[0])
    # Stage 2, regrouped: 3, 0 and 2 fused (another order, one of them unfused before), 1 alone.
    again, outs = fused(w, [configs[3], configs[0], configs[2]], 30, [blobs[3], blobs[0], blobs[2]])
    w.leave()
    after = {3: again[0], 0: again[1], 2: again[2], 1: solo(trainer, configs[1], 30, blobs[1])[0]}
    for i, config in enumerate(configs):
        whole, whole_out = solo(trainer, config, 60)
        assert rel_diff(after[i], whole) <= 1e-5, f"member {i}"
        assert load(after[i])["step"] == 60
    assert outs[1]["metrics"]["val_loss"] == pytest.approx(solo(trainer, configs[0], 60)[1]["metrics"]["val_loss"],
                                                           rel=1e-5)


def stream(trainer, step, world=1, rank=0, n=1):
    """The next ``n`` batches of a worker at ``step`` (rank ``rank`` of ``world``), as index-free
    tensors; no process group is needed to draw them."""
    w = DDPWorker(trainer, seed=7)
    w.warmup()
    w.rank, w.world, w.step = rank, world, step
    batches = w._batch_iter()
    return [next(batches) for _ in range(n)], w


@pytest.mark.parametrize("world", [1, 2, 4])
def test_the_stream_is_a_function_of_the_step_on_every_rank(world):
    trainer = ToyStep()
    for rank in range(world):
        run, _ = stream(trainer, 0, world, rank, n=30)
        for step in (1, 8, 9, 10, 17, 27):          # 9 steps an epoch at every world size here
            (x, y), = stream(trainer, step, world, rank)[0]
            assert torch.equal(x, run[step][0]) and torch.equal(y, run[step][1]), (rank, step)
    # The ranks' batches of one step together are the lone worker's batch of that step (each
    # rank's DistributedSampler takes its shard of one permutation per epoch).
    for step in (0, 5, 9, 20):
        (x1, _), = stream(trainer, step)[0]
        parts = torch.cat([stream(trainer, step, world, r)[0][0][0] for r in range(world)])
        assert sorted(map(tuple, parts.tolist())) == sorted(map(tuple, x1.tolist()))


def test_epoch_follows_the_step_and_a_batch_larger_than_the_data_is_refused():
    from rubberband.errors import SpecError

    _, w = stream(ToyStep(), 20)
    assert w.epoch == 2
    big = ToyStep()
    big.global_batch_size = 256
    w = DDPWorker(big, seed=0)
    w.warmup()
    with pytest.raises(SpecError, match="global_batch_size: 256 is more than the 150 training samples"):
        w.assign({}, None)
