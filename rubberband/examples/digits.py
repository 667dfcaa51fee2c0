"""Demo job: an MLP on scikit-learn's bundled 8x8 digits data (1,797 images; no download)."""

from __future__ import annotations

from typing import Any

from rubberband.executor.trainer import Trainer


class DigitsMLP(Trainer):
    """A two-layer MLP classifying handwritten digits; tuned over lr, momentum and weight decay."""

    global_batch_size = 64
    steps_per_iter = 300
    metric = "val_loss"
    mode = "min"
    data_depends_on_config = False
    width_keys = ("hidden",)

    def build_data(self, config: dict[str, Any]):
        import numpy as np
        import torch

        data, target = _load_digits()
        x = torch.tensor(data / 16.0, dtype=torch.float32)
        y = torch.tensor(target, dtype=torch.long)
        order = torch.from_numpy(np.random.default_rng(0).permutation(len(y)))  # fixed split
        x, y = x[order], y[order]
        cut = int(0.8 * len(y))
        return (torch.utils.data.TensorDataset(x[:cut], y[:cut]),
                torch.utils.data.TensorDataset(x[cut:], y[cut:]))

    def build_model(self, config: dict[str, Any]):
        import torch.nn as nn

        hidden = int(config.get("hidden", 128))
        return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def build_optimizer(self, model, config: dict[str, Any]):
        import torch

        return torch.optim.SGD(model.parameters(), lr=float(config.get("lr", 0.05)),
                               momentum=float(config.get("momentum", 0.9)),
                               weight_decay=float(config.get("weight_decay", 0.0)))


def _load_digits():
    """scikit-learn's digits data, read straight from the CSV the package ships.

    Importing ``sklearn.datasets`` costs about 2 s of CPU per worker process; the file itself
    loads in milliseconds.
    """
    import importlib.util
    from pathlib import Path

    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the digits demo needs scikit-learn: pip install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    table = np.loadtxt(path, delimiter=",")
    return table[:, :-1], table[:, -1].astype(np.int64)
