"""Small trainers for the fusion tests: a seeded synthetic classification set, an MLP whose
width, activation, BatchNorm and dropout come from the config, any torch optimizer."""

from __future__ import annotations

from typing import Any

from rubberband.executor.trainer import Trainer


class Toy(Trainer):
    global_batch_size = 16
    steps_per_iter = 10
    data_depends_on_config = False

    def build_data(self, config: dict[str, Any]):
        import torch

        g = torch.Generator().manual_seed(123)
        x = torch.randn(200, 8, generator=g)
        y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).long() + (x[:, 3] > 1).long()
        return (torch.utils.data.TensorDataset(x[:150], y[:150]), torch.utils.data.TensorDataset(x[150:], y[150:]))

    def build_model(self, config: dict[str, Any]):
        import torch.nn as nn

        h = int(config.get("hidden", 16))
        layers: list[Any] = [nn.Linear(8, h)]
        if config.get("bn"):
            layers.append(nn.BatchNorm1d(h))
        layers.append(nn.Tanh())
        if config.get("dropout"):
            layers.append(nn.Dropout(float(config["dropout"])))
        layers += [nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 3)]
        return nn.Sequential(*layers)

    def build_optimizer(self, model, config: dict[str, Any]):
        import torch

        kind = config.get("opt", "sgd")
        lr = float(config.get("lr", 0.05))
        wd = float(config.get("wd", 0.0))
        if kind == "sgd":
            return torch.optim.SGD(model.parameters(), lr=lr, momentum=float(config.get("momentum", 0.0)),
                                   dampening=float(config.get("dampening", 0.0)), weight_decay=wd,
                                   nesterov=bool(config.get("nesterov", False)))
        if kind == "sgd-groups":     # no weight decay on biases: two param groups
            decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
            rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
            return torch.optim.SGD([{"params": decay, "weight_decay": wd}, {"params": rest, "lr": lr / 2}],
                                   lr=lr, momentum=float(config.get("momentum", 0.9)))
        if kind == "adam":
            return torch.optim.Adam(model.parameters(), lr=lr, betas=(float(config.get("b1", 0.9)), 0.999),
                                    weight_decay=wd)
        if kind == "adamw":
            return torch.optim.AdamW(model.parameters(), lr=lr, betas=(float(config.get("b1", 0.9)), 0.99),
                                     eps=float(config.get("eps", 1e-8)), weight_decay=wd)
        if kind == "rmsprop":
            return torch.optim.RMSprop(model.parameters(), lr=lr, momentum=float(config.get("momentum", 0.0)))
        if kind == "lbfgs":
            return torch.optim.LBFGS(model.parameters(), lr=lr)
        raise ValueError(kind)


class ToyMicro(Toy):
    max_micro_batch = 6          # 16 = 6 + 6 + 4: gradient accumulation over uneven chunks


class ToyBranchy(Toy):
    """Data-dependent control flow in the forward."""

    def build_model(self, config: dict[str, Any]):
        import torch.nn as nn

        class Branchy(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(8, 3)

            def forward(self, x):
                y = self.a(x)
                return y if y.sum() > 0 else -y

        return Branchy()


class ToyLSTM(Toy):
    def build_model(self, config: dict[str, Any]):
        import torch.nn as nn

        class Seq(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.LSTM(1, 4, batch_first=True)
                self.out = nn.Linear(4, 3)

            def forward(self, x):
                return self.out(self.rnn(x.unsqueeze(-1))[0][:, -1])

        return Seq()


class ToyConfigData(Toy):
    data_depends_on_config = True
