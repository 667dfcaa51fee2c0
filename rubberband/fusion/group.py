"""A fused trial group: F trials of one model shape trained as one program.

Each member is built as it would be alone — ``torch.manual_seed(seed)``, then the trainer's
``build_model(config)`` and ``build_optimizer(model, config)``, then its checkpoint — so its
initial weights are the unfused trial's. The members' parameters and buffers are then stacked
into ``[F, ...]`` tensors, and each member's own parameters become views of its slice: the
member modules stay real ``nn.Module``s (``trainer.evaluate`` runs on them, ``state_dict``
reads them) while training runs on the stacked tensors.

One training step feeds one batch to every member: the forward is
``vmap(functional_call(model, (params_i, buffers_i), x))`` over the member dimension with the
data unbatched (``in_dims=None``), dropout draws per member (``randomness="different"``),
BatchNorm updates each member's running statistics in its own slice. The loss is the sum of
the members' losses: member ``i``'s parameters get exactly ``∂loss_i/∂θ_i``, as alone.
``optim.make_stepper`` steps all members at once (fused SGD/Adam/AdamW with per-member
hyperparameters) or each member's own torch optimizer.

Per-member LR schedules: ``Trainer`` has no scheduler hook today; the fused optimizers read
each member's ``lr`` from its param groups at every step, so one added later applies as is.
"""

from __future__ import annotations

import io
from typing import Any

from rubberband.errors import SpecError
from rubberband.fusion import batched
from rubberband.fusion import optim as fused_optim

FORWARDS = ("auto", "vmap", "batched")


def signature(model: Any) -> tuple[Any, ...]:
    """What must be equal for two models to be fused: their structure (``repr``: module types
    and settings such as dropout ``p``) and every parameter's and buffer's name, shape, dtype."""
    return (repr(model),
            tuple((n, tuple(p.shape), str(p.dtype), bool(p.requires_grad)) for n, p in model.named_parameters()),
            tuple((n, tuple(b.shape), str(b.dtype)) for n, b in model.named_buffers()))


class FusedGroup:
    """F members, one program.

    Args:
        trainer: the user's ``Trainer`` instance (``build_model``, ``build_optimizer``, ``loss``,
            ``evaluate``).
        configs: one config per member.
        checkpoints: per member ``None`` or a ``DDPWorker.checkpoint()`` blob; all members must
            be at the same step (they share one batch stream).
        seed: the seed a lone trial's worker seeds torch with before ``build_model``.
        device: where the stacked tensors live (default: where the models were built).
        forward: ``batched`` (written-out batched layers, ``fusion.batched``: an ``nn.Sequential``
            of Linear, activations, Dropout, Flatten), ``vmap`` (any functional model), or
            ``auto``: batched when it covers the model, else vmap.

    Raises:
        SpecError: members of different shapes, or at different steps; ``forward="batched"``
            for a model it does not cover.
    """

    def __init__(self, trainer: Any, configs: list[dict[str, Any]], checkpoints: list[bytes | None] | None = None,
                 *, seed: int, device: Any = None, forward: str = "auto"):
        import torch
        from torch.func import functional_call, vmap

        if not configs:
            raise SpecError("fused group: needs at least one member config")
        if forward not in FORWARDS:
            raise SpecError(f"fused group: forward={forward!r}; use one of {', '.join(FORWARDS)}")
        checkpoints = list(checkpoints) if checkpoints is not None else [None] * len(configs)
        if len(checkpoints) != len(configs):
            raise SpecError(f"fused group: {len(configs)} configs but {len(checkpoints)} checkpoints")
        self.trainer = trainer
        self.configs = [dict(c) for c in configs]
        self.F = len(configs)
        self.models: list[Any] = []
        self.opts: list[Any] = []
        at: list[tuple[int, int]] = []
        for config, blob in zip(self.configs, checkpoints):
            torch.manual_seed(seed)
            model = trainer.build_model(config)
            opt = trainer.build_optimizer(model, config)
            if blob is not None:
                state = torch.load(io.BytesIO(blob), weights_only=False)
                model.load_state_dict(state["model"])
                opt.load_state_dict(state["optimizer"])
                at.append((int(state["step"]), int(state.get("epoch", 0))))
            else:
                at.append((0, 0))
            self.models.append(model)
            self.opts.append(opt)
        if len({step for step, _ in at}) != 1:
            raise SpecError(f"fused group: members at different steps {sorted({step for step, _ in at})}; they share "
                            "one batch stream, so fuse only trials at the same step (a SYNC's survivors)")
        # The step alone positions the batch stream (DDPWorker._batch_iter); the epoch is kept in
        # checkpoints for compatibility (checkpoints before that counted it differently).
        self.step, self.epoch = max(at)
        if len({signature(m) for m in self.models}) != 1:
            raise SpecError("fused group: the configs build models of different shapes or structure; "
                            "group them with rubberband.fusion.group_by_shape")
        self.device = torch.device(device) if device is not None else next(self.models[0].parameters()).device
        first = self.models[0]
        # Stacked leaves [F, ...]; each member's parameters and buffers become views of its slice.
        self.params: dict[str, Any] = {}
        for name, p in first.named_parameters():
            per = [dict(m.named_parameters())[name] for m in self.models]
            self.params[name] = torch.stack([q.detach() for q in per]).to(self.device).requires_grad_(p.requires_grad)
        self.buffers: dict[str, Any] = {}
        for name, _ in first.named_buffers():
            per = [dict(m.named_buffers())[name] for m in self.models]
            self.buffers[name] = torch.stack([q.detach() for q in per]).to(self.device)
        self.members: list[dict[str, Any]] = []
        for i, m in enumerate(self.models):
            named = dict(m.named_parameters())
            for name, p in named.items():
                p.data = self.params[name].data[i]
            for name, b in m.named_buffers():
                b.data = self.buffers[name][i]
            self.members.append(named)
        if self.device.type != "cpu":
            for o in self.opts:
                for st in o.state.values():
                    for k, v in list(st.items()):
                        if torch.is_tensor(v) and k != "step":
                            st[k] = v.to(self.device)
        self.stepper = fused_optim.make_stepper(self.params, self.members, self.opts)
        self.optimizer_path = type(self.stepper).__name__
        self._base = first          # its code runs every member's forward (functional_call swaps tensors in)

        def member_loss(params, buffers, x, y):
            return trainer.loss(functional_call(self._base, (params, buffers), (x,)), y)

        self._losses = vmap(member_loss, in_dims=(0, 0, None, None), randomness="different")
        steps = batched.plan(first) if forward != "vmap" else None
        if forward == "batched" and steps is None:
            raise SpecError(f"fused group: forward='batched' covers an nn.Sequential of {', '.join(batched.ELEMENTWISE)}, "
                            "Linear and Flatten only; use forward='vmap' for this model")
        self._batched = batched.member_losses(steps, trainer, self.F) if steps is not None else None
        self._steps, self._forward, self._checked = steps or [], forward, False
        self.forward_path = "batched" if self._batched is not None else "vmap"

    def train_step(self, x: Any, y: Any, micro: int | None = None) -> None:
        """One optimizer step of every member on the batch ``(x, y)``, in micro-batches of at
        most ``micro`` samples with gradient accumulation (as ``DDPWorker.train`` does)."""
        for P in self.params.values():
            P.grad = None
        if self.device.type != "cpu":
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        if self._batched is not None and not self._checked:
            self._checked = True
            if not batched.accepts(self._steps, x):
                if self._forward == "batched":
                    raise SpecError(f"fused group: forward='batched' needs inputs of shape [batch, features] at the "
                                    f"first Linear, got {tuple(x.shape)}; use forward='vmap'")
                self._batched, self.forward_path = None, "vmap"
        chunks = list(zip(x.split(micro), y.split(micro))) if micro else [(x, y)]
        for cx, cy in chunks:
            if self._batched is not None:
                losses = self._batched(self.params, cx, cy)
            else:
                losses = self._losses(self.params, self.buffers, cx, cy)
            (losses * (len(cy) / len(y))).sum().backward()
        self.stepper.step()
        self.step += 1

    def member(self, i: int) -> Any:
        """Member ``i``'s own module (its parameters are views of the group's tensors)."""
        return self.models[i]

    def evaluate(self, dataset: Any) -> list[dict[str, float]]:
        """``trainer.evaluate`` on each member's module."""
        return [self.trainer.evaluate(m, dataset) for m in self.models]

    def digests(self) -> list[list[float]]:
        """Per member: sum and sum of squares of its parameters, and the step (``DDPWorker.param_digest``)."""
        import torch

        out = []
        with torch.no_grad():
            for m in self.models:
                flat = torch.cat([p.detach().flatten().double().cpu() for p in m.parameters()])
                out.append([float(flat.sum()), float((flat * flat).sum()), self.step])
        return out

    def checkpoints(self) -> list[bytes]:
        """One ``DDPWorker.checkpoint()`` blob per member: an unfused worker resumes it exactly."""
        import torch

        self.stepper.push()
        blobs = []
        for model, opt, config in zip(self.models, self.opts, self.configs):
            # Clone: a member's tensors are views, and torch.save would write all F members' storage.
            state = {"model": {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
                     "optimizer": _to_cpu(opt.state_dict()), "step": self.step, "epoch": self.epoch,
                     "config": dict(config)}
            buf = io.BytesIO()
            torch.save(state, buf)
            blobs.append(buf.getvalue())
        return blobs


def _to_cpu(obj: Any) -> Any:
    import torch

    if torch.is_tensor(obj):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj
