"""A Ray Tune function trainable on scikit-learn's digits data, run as it is by rubberband.

``train_digits`` is written in Ray Tune 2.x's documented style — it imports ``ray.tune``,
restores from ``tune.get_checkpoint()`` and reports a checkpoint with every result — and runs
unchanged under ``tune.Tuner(train_digits, ...)`` or ``rubberband run`` (trainer:
``rubberband.examples.tune_function:train_digits``). ``train_digits_every3`` checkpoints every
third report only: resumed at a stage boundary, it trains the reports since its checkpoint
again (the run's record says how many). The model is ``examples/digits.py``'s MLP, and one
report is 300 SGD steps of a 64-sample batch, as one ``DigitsMLP`` iteration.

``rubberband.prepare_model`` / ``prepare_data_loader`` make it data-parallel over the GPUs a
stage gives the trial (DDP, a distributed sampler; the global batch stays 64). Outside a
rubberband trial they only move things to the device, so the function still runs under Tune.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from ray import tune

import rubberband

STEPS_PER_REPORT = 300
BATCH = 64


def train_digits(config: dict[str, Any]) -> None:
    """Checkpoints at every report."""
    _train(config, checkpoint_every=1)


def train_digits_every3(config: dict[str, Any]) -> None:
    """Checkpoints at every third report."""
    _train(config, checkpoint_every=3)


def _train(config: dict[str, Any], checkpoint_every: int) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    train_set, val_set = _datasets()
    hidden = int(config.get("hidden", 128))
    model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    start = 0
    state = None
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=False)
        model.load_state_dict(state["model"])
        start = int(state["iteration"])
    model = rubberband.prepare_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=float(config.get("lr", 0.05)),
                          momentum=float(config.get("momentum", 0.9)),
                          weight_decay=float(config.get("weight_decay", 0.0)))
    if state is not None:
        opt.load_state_dict(state["optimizer"])
    loader = rubberband.prepare_data_loader(torch.utils.data.DataLoader(train_set, batch_size=BATCH, shuffle=True,
                                                                        drop_last=True))
    batches = _forever(loader)
    for iteration in range(start, int(config.get("max_reports", 100_000))):
        model.train()
        for _ in range(STEPS_PER_REPORT):
            x, y = next(batches)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        metrics = _evaluate(model, val_set)
        metrics["iteration"] = iteration + 1
        if (iteration + 1) % checkpoint_every == 0:
            with tempfile.TemporaryDirectory() as d:
                torch.save({"model": getattr(model, "module", model).state_dict(), "optimizer": opt.state_dict(),
                            "iteration": iteration + 1}, os.path.join(d, "state.pt"))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
        else:
            tune.report(metrics)


def _forever(loader):
    while True:
        yield from loader


def _datasets():
    import numpy as np
    import torch

    from rubberband.examples.digits import _load_digits

    data, target = _load_digits()
    x = torch.tensor(data / 16.0, dtype=torch.float32)
    y = torch.tensor(target, dtype=torch.long)
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(y)))   # the same fixed split as DigitsMLP
    x, y = x[order], y[order]
    cut = int(0.8 * len(y))
    return torch.utils.data.TensorDataset(x[:cut], y[:cut]), torch.utils.data.TensorDataset(x[cut:], y[cut:])


def _evaluate(model, dataset) -> dict[str, float]:
    import torch
    import torch.nn.functional as F

    x, y = dataset.tensors
    device = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        out = model(x.to(device))
        loss = float(F.cross_entropy(out, y.to(device)))
        acc = float((out.argmax(dim=1).cpu() == y).float().mean())
    return {"val_loss": loss, "val_acc": acc}
