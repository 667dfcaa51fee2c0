"""The trainer a surrogate job's workers run (``SurrogateJob``, DESIGN §4.6): the driver's
``TARGET_KEY`` picks the full-width μP model, its absence the surrogate at width / S, and the
user's code never sees the key."""

from __future__ import annotations

import pickle

import pytest

torch = pytest.importorskip("torch")

from rubberband.errors import SpecError  # noqa: E402
from rubberband.examples.digits import DigitsMLP  # noqa: E402
from rubberband.executor.driver import TARGET_KEY as DRIVER_KEY  # noqa: E402
from rubberband.executor.worker import DDPWorker  # noqa: E402
from rubberband.surrogate import TARGET_KEY, SurrogateJob, surrogate_trainer, target_trainer  # noqa: E402

CONFIG = {"hidden": 128, "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}


class Seen(DigitsMLP):
    """Records the configs the user's code is given."""

    def __init__(self):
        self.configs: list[dict] = []

    def build_model(self, config):
        self.configs.append(dict(config))
        return super().build_model(config)


def test_the_key_is_the_drivers():
    assert TARGET_KEY == DRIVER_KEY


def test_a_trial_builds_the_surrogate_and_the_target_trial_the_full_width_model():
    job = SurrogateJob(Seen(), 8)
    narrow = job.build_model(CONFIG)
    wide = job.build_model({**CONFIG, TARGET_KEY: True})
    assert narrow[0].weight.shape == (16, 64) and wide[0].weight.shape == (128, 64)
    assert all(TARGET_KEY not in c for c in job.trainer.configs)
    # The same models and optimizers as the wrappers of the surrogate and the target build.
    torch.manual_seed(0)
    a = job.build_model({**CONFIG, TARGET_KEY: True})
    torch.manual_seed(0)
    b = target_trainer(DigitsMLP(), 8).build_model(CONFIG)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    lrs = sorted(g["lr"] for g in job.build_optimizer(a, {**CONFIG, TARGET_KEY: True}).param_groups)
    assert lrs == pytest.approx(sorted(g["lr"] for g in target_trainer(DigitsMLP(), 8).build_optimizer(b, CONFIG).param_groups))
    assert [g["lr"] for g in job.build_optimizer(narrow, CONFIG).param_groups] == [0.1]
    assert job.model_config(CONFIG)["hidden"] == 16 and job.model_config({**CONFIG, TARGET_KEY: True})["hidden"] == 128
    assert surrogate_trainer(DigitsMLP(), 8).model_config(CONFIG) == job.model_config(CONFIG)


def test_a_warm_worker_serves_surrogates_then_the_target_from_scratch():
    w = DDPWorker(SurrogateJob(DigitsMLP(), 8), seed=0)
    w.warmup()
    w.assign(CONFIG, None)
    assert w.model[0].weight.shape == (16, 64)
    w.train(1)
    blob = w.checkpoint()
    assert blob
    w.assign({**CONFIG, TARGET_KEY: True}, None)
    assert w.model[0].weight.shape == (128, 64) and w.step == 0
    out = w.train(1)
    assert out["step"] == DigitsMLP.steps_per_iter and "val_loss" in out["metrics"]


def test_it_pickles_and_refuses_what_cannot_be_narrowed():
    job = pickle.loads(pickle.dumps(SurrogateJob("rubberband.examples.digits:DigitsMLP", 8)))
    assert (job.ratio, job.width_keys, job.global_batch_size) == (8, ("hidden",), DigitsMLP.global_batch_size)
    with pytest.raises(SpecError, match="width_ratio"):
        SurrogateJob(DigitsMLP(), 1)

    def trainable(config):
        return None

    with pytest.raises(SpecError, match="function trainable"):
        SurrogateJob(trainable, 8)
