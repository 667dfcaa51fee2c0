"""What a user writes: a Trainer that builds model, optimizer, data and loss from a config.

rubberband does the rest (wrapping the model in DistributedDataParallel, sharding the data,
keeping the global batch size fixed across GPU counts with gradient accumulation, and
checkpointing). torch is imported lazily, so this module stays importable without it.
"""

from __future__ import annotations

from typing import Any


class Trainer:
    """Base class of a user's trainer.

    Override ``build_model``, ``build_optimizer`` and ``build_data``; ``loss`` defaults to
    cross-entropy and ``evaluate`` to mean loss and accuracy on the validation set.

    Attributes:
        global_batch_size: samples per optimizer step summed over all workers; fixed
            whatever the number of GPUs a trial gets.
        steps_per_iter: optimizer steps in one iteration (the unit of the experiment spec).
        metric, mode: default metric to rank trials by and whether lower (``min``) is better.
        data_depends_on_config: ``False`` lets a warm worker keep its datasets from trial to
            trial (they are built once, when the worker warms up).
        max_micro_batch: largest batch one worker processes at once; a worker's share of the
            global batch is split into micro-batches with gradient accumulation.
        width_keys: the config keys that set the model's width (e.g. ``("hidden",)``); a μP
            surrogate (``rubberband.surrogate``) builds the model with each divided by its ratio.
    """

    global_batch_size: int = 64
    steps_per_iter: int = 10
    metric: str = "val_loss"
    mode: str = "min"
    data_depends_on_config: bool = True
    max_micro_batch: int | None = None
    width_keys: tuple[str, ...] = ()

    def prepare(self) -> None:
        """Once per worker process, before any trial: import heavy modules, cache data."""

    def build_model(self, config: dict[str, Any]):
        raise NotImplementedError("Trainer.build_model(config) must return a torch.nn.Module")

    def build_optimizer(self, model, config: dict[str, Any]):
        raise NotImplementedError("Trainer.build_optimizer(model, config) must return a torch.optim.Optimizer")

    def build_data(self, config: dict[str, Any]):
        raise NotImplementedError("Trainer.build_data(config) must return (train_dataset, val_dataset)")

    def loss(self, output, target):
        import torch.nn.functional as F

        return F.cross_entropy(output, target)

    def evaluate(self, model, dataset) -> dict[str, float]:
        """Mean loss and accuracy of ``model`` on ``dataset`` (in eval mode, no gradients)."""
        import torch

        loader = torch.utils.data.DataLoader(dataset, batch_size=512)
        model.eval()
        total = correct = 0
        loss_sum = 0.0
        with torch.no_grad():
            for x, y in loader:
                out = model(x)
                loss_sum += float(self.loss(out, y)) * len(y)
                correct += int((out.argmax(dim=1) == y).sum())
                total += len(y)
        model.train()
        return {"val_loss": loss_sum / max(total, 1), "val_acc": correct / max(total, 1)}
