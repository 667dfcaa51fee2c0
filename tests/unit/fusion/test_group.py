"""A fused group trains each member exactly as the member would train alone (DDPWorker)."""

from __future__ import annotations

import io

import pytest

from rubberband.errors import SpecError
from tests.unit.fusion.toys import Toy, ToyMicro

torch = pytest.importorskip("torch")

from rubberband.executor.worker import DDPWorker  # noqa: E402
from rubberband.fusion import FusedGroup  # noqa: E402


@pytest.fixture(autouse=True)
def _worker_process_settings_back():
    """A DDPWorker sets one thread and flushes denormals for its (Ray worker's) process; here
    that process is the test runner's."""
    threads = torch.get_num_threads()
    yield
    torch.set_flush_denormal(False)
    torch.set_num_threads(threads)


def solo(trainer, config, iters, blob=None, seed=0):
    w = DDPWorker(trainer, seed=seed)
    w.warmup()
    w.assign(config, blob)
    out = w.train(iters) if iters else None
    return w.checkpoint(), out


def fused(trainer, configs, iters, blobs=None, seed=0, forward="auto"):
    w = DDPWorker(trainer, seed=seed)
    w.warmup()
    w.assign_group([f"t{i}" for i in range(len(configs))], configs, blobs, forward=forward)
    out = w.train(iters) if iters else None
    return w.checkpoint_group(), out


def load(blob):
    return torch.load(io.BytesIO(blob), weights_only=False)


def rel_diff(a, b) -> float:
    """Largest ‖a − b‖ / ‖b‖ over two checkpoints: per model tensor, and over the optimizer
    state as a whole (a bias in front of a BatchNorm has a gradient of float noise, ~1e-9, and so
    a momentum buffer whose own relative error means nothing)."""
    sa, sb = load(a), load(b)
    assert (sa["step"], sa["epoch"], sa["config"]) == (sb["step"], sb["epoch"], sb["config"])
    assert sa["optimizer"]["param_groups"] == sb["optimizer"]["param_groups"]
    assert sa["model"].keys() == sb["model"].keys()
    assert sa["optimizer"]["state"].keys() == sb["optimizer"]["state"].keys()
    pairs = [(sa["model"][k], sb["model"][k]) for k in sb["model"]]
    opt = [(sa["optimizer"]["state"][i][k], v) for i, st in sb["optimizer"]["state"].items() for k, v in st.items()]
    assert all(sa["optimizer"]["state"][i].keys() == st.keys() for i, st in sb["optimizer"]["state"].items())
    flat = [(torch.cat([x.double().flatten() for x, _ in opt]), torch.cat([y.double().flatten() for _, y in opt]))] if opt else []
    worst = 0.0
    for x, y in pairs + flat:
        if not x.is_floating_point():
            assert torch.equal(x, y)
            continue
        worst = max(worst, float((x.double() - y.double()).norm() / y.double().norm().clamp_min(1e-30)))
    return worst


SGD_CONFIGS = [
    {"opt": "sgd", "lr": 0.05, "momentum": 0.9, "wd": 1e-3},
    {"opt": "sgd", "lr": 0.2, "momentum": 0.5, "wd": 0.0},
    {"opt": "sgd", "lr": 0.01, "momentum": 0.0, "wd": 5e-4},
    {"opt": "sgd", "lr": 0.1, "momentum": 0.8, "wd": 1e-4, "nesterov": True},
    {"opt": "sgd", "lr": 0.1, "momentum": 0.7, "dampening": 0.3},
]
ADAM_CONFIGS = [
    {"opt": "adam", "lr": 1e-3, "b1": 0.9, "wd": 0.0},
    {"opt": "adam", "lr": 3e-3, "b1": 0.8, "wd": 1e-2},
]
ADAMW_CONFIGS = [
    {"opt": "adamw", "lr": 1e-3, "b1": 0.9, "wd": 1e-2},
    {"opt": "adamw", "lr": 5e-3, "b1": 0.85, "wd": 0.1, "eps": 1e-6},
]


@pytest.mark.parametrize("configs, path", [(SGD_CONFIGS, "FusedSGD"), (ADAM_CONFIGS, "FusedAdam"),
                                           (ADAMW_CONFIGS, "FusedAdam"),
                                           ([{"opt": "sgd-groups", "lr": 0.1, "wd": 1e-3},
                                             {"opt": "sgd-groups", "lr": 0.02, "wd": 0.0, "momentum": 0.5}], "FusedSGD"),
                                           ([{"opt": "rmsprop", "lr": 1e-3}, {"opt": "rmsprop", "lr": 3e-3, "momentum": 0.5}],
                                            "PerMemberStep")],
                         ids=["sgd", "adam", "adamw", "sgd-param-groups", "rmsprop-per-member"])
@pytest.mark.parametrize("forward", ["vmap", "batched"])
def test_each_member_after_100_steps_equals_the_trial_trained_alone(configs, path, forward):
    blobs, results = fused(Toy(), configs, 10, forward=forward)             # 10 iterations x 10 steps
    group = FusedGroup(Toy(), configs, seed=0, forward=forward)
    assert (group.optimizer_path, group.forward_path) == (path, forward)
    for config, blob, result in zip(configs, blobs, results):
        alone, alone_out = solo(Toy(), config, 10)
        assert rel_diff(blob, alone) <= 1e-5
        assert result["step"] == alone_out["step"] == 100
        assert result["metrics"]["val_loss"] == pytest.approx(alone_out["metrics"]["val_loss"], rel=1e-5)
        assert result["digest"] == pytest.approx(alone_out["digest"], rel=1e-5)


def test_micro_batches_accumulate_as_alone_and_batchnorm_keeps_per_member_statistics():
    configs = [{"lr": 0.1, "momentum": 0.9, "bn": True}, {"lr": 0.03, "momentum": 0.5, "bn": True, "wd": 1e-3}]
    blobs, _ = fused(ToyMicro(), configs, 10)
    means = [load(b)["model"]["1.running_mean"] for b in blobs]
    assert not torch.allclose(means[0], means[1])
    for config, blob in zip(configs, blobs):
        alone, _ = solo(ToyMicro(), config, 10)
        assert rel_diff(blob, alone) <= 1e-5
        assert int(load(blob)["model"]["1.num_batches_tracked"]) == 100 * 3     # 3 micro-batches a step


def test_defusion_fused_then_alone_equals_alone_throughout():
    configs = SGD_CONFIGS[:3]
    blobs, _ = fused(Toy(), configs, 5)
    for config, blob in zip(configs, blobs):
        resumed, _ = solo(Toy(), config, 5, blob)
        half, _ = solo(Toy(), config, 5)
        reference, _ = solo(Toy(), config, 5, half)       # the same trial, unfused, same stage boundary
        assert rel_diff(resumed, reference) <= 1e-5
        assert load(resumed)["step"] == 100


def test_alone_then_fused_equals_alone_throughout_and_regroups_survivors():
    configs = ADAMW_CONFIGS + [{"opt": "adamw", "lr": 2e-3, "wd": 0.0}]
    halves = [solo(Toy(), c, 5)[0] for c in configs]
    survivors = [0, 2]                                      # a SYNC keeps two of three
    blobs, _ = fused(Toy(), [configs[i] for i in survivors], 5, [halves[i] for i in survivors])
    for i, blob in zip(survivors, blobs):
        reference, _ = solo(Toy(), configs[i], 5, halves[i])
        assert rel_diff(blob, reference) <= 1e-5


@pytest.mark.parametrize("forward", ["vmap", "batched"])
def test_dropout_draws_per_member(forward):
    same = [{"lr": 0.1, "dropout": 0.5}] * 2
    blobs, _ = fused(Toy(), same, 1, forward=forward)
    a, b = (load(x)["model"]["0.weight"] for x in blobs)
    assert not torch.equal(a, b), "identical members with dropout must see different masks"
    blobs, _ = fused(Toy(), [{"lr": 0.1}] * 2, 1, forward=forward)
    a, b = (load(x)["model"]["0.weight"] for x in blobs)
    assert torch.equal(a, b)


def test_members_at_different_steps_are_refused():
    one = solo(Toy(), {"lr": 0.1}, 1)[0]
    two = solo(Toy(), {"lr": 0.1}, 2)[0]
    with pytest.raises(SpecError, match="different steps"):
        FusedGroup(Toy(), [{"lr": 0.1}] * 2, [one, two], seed=0)


def test_the_batched_forward_covers_sequential_linear_stacks_only():
    assert FusedGroup(Toy(), [{}], seed=0).forward_path == "batched"
    assert FusedGroup(Toy(), [{"bn": True}], seed=0).forward_path == "vmap"
    with pytest.raises(SpecError, match="forward='vmap'"):
        FusedGroup(Toy(), [{"bn": True}], seed=0, forward="batched")
    with pytest.raises(SpecError, match="forward='fast'; use one of auto, vmap, batched"):
        FusedGroup(Toy(), [{}], seed=0, forward="fast")


def test_members_of_different_shapes_are_refused():
    with pytest.raises(SpecError, match="group_by_shape"):
        FusedGroup(Toy(), [{"hidden": 8}, {"hidden": 16}], seed=0)


def test_a_checkpoint_holds_only_its_member():
    group = FusedGroup(Toy(), [{"hidden": 64}] * 8, seed=0)
    blobs = group.checkpoints()
    alone = solo(Toy(), {"hidden": 64}, 0)[0]
    assert len(blobs[0]) < 1.5 * len(alone)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before `optimizer.step\\(\\)`")
@pytest.mark.parametrize("configs", [SGD_CONFIGS[:2], ADAMW_CONFIGS], ids=["sgd", "adamw"])
def test_a_per_member_lr_schedule_on_the_members_optimizers_is_followed(configs):
    """Trainer has no scheduler hook yet; the fused step reads each member's lr at every step,
    so a torch LR scheduler on a member's own optimizer applies as it would alone (the
    scheduler warns that the member optimizer's own ``step`` was never called: the fused one
    stepped it)."""
    trainer = Toy()
    train_set, _ = trainer.build_data({})
    data = [train_set[i * 16:(i + 1) * 16] for i in range(9)]
    group = FusedGroup(trainer, configs, seed=0)
    schedules = [torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.3 + 0.2 * i) for i, o in enumerate(group.opts)]
    for x, y in data:
        group.train_step(x, y)
        for s in schedules:
            s.step()
    for i, config in enumerate(configs):
        torch.manual_seed(0)
        model = trainer.build_model(config)
        opt = trainer.build_optimizer(model, config)
        schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.3 + 0.2 * i)
        for x, y in data:
            opt.zero_grad()
            trainer.loss(model(x), y).backward()
            opt.step()
            schedule.step()
        for (name, p), q in zip(model.named_parameters(), group.member(i).parameters()):
            assert float((p - q).detach().norm() / p.detach().norm()) <= 1e-5, name


def test_inputs_the_batched_forward_cannot_take_go_through_vmap():
    """A Linear over [B, T, features]: the batched layers need [B, features]; auto falls back
    to vmap at the first step, and both members still train as alone."""
    import torch.nn as nn

    class Seq(Toy):
        def build_model(self, config):
            return nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Flatten(), nn.Linear(16, 3))

    x, y = torch.randn(16, 4, 2, generator=torch.Generator().manual_seed(0)), torch.randint(0, 3, (16,))
    group = FusedGroup(Seq(), [{"lr": 0.1}, {"lr": 0.2}], seed=0)
    assert group.forward_path == "batched"
    group.train_step(x, y)
    assert group.forward_path == "vmap"
    torch.manual_seed(0)
    model = Seq().build_model({})
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    Seq().loss(model(x), y).backward()
    opt.step()
    for p, q in zip(model.parameters(), group.member(1).parameters()):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7)
    forced = FusedGroup(Seq(), [{"lr": 0.1}], seed=0, forward="batched")
    with pytest.raises(SpecError, match="needs inputs of shape \\[batch, features\\]"):
        forced.train_step(x, y)
