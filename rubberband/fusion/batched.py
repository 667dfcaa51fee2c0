"""The fast path of a fused forward: batched layers instead of ``vmap`` (HFTA's way).

``torch.func.vmap`` runs any functional forward over the member dimension but pays Python
overhead on every call (about 3 ms a step for a three-layer MLP on one CPU thread, more than
the arithmetic). For an ``nn.Sequential`` of known layers the batched forward is written out:

    Linear:  h ← h·Wᵀ + b  as  x[B,i]·W[F,i,o] (the first layer, data shared)  or  baddbmm(b, h[F,B,i], Wᵀ)
    elementwise activations, Dropout: applied to the [F, B, ...] tensor as is (Dropout draws an
    independent mask per member, as ``randomness="different"``)
    Flatten: over the dims after the member and batch dims

and the loss is ``cross_entropy`` over ``[F·B]`` rows (the trainer's default loss), averaged
per member, else the trainer's ``loss`` under ``vmap``. Any other layer (BatchNorm, Conv, a
custom module): ``plan`` returns ``None`` and the group uses ``vmap``.
"""

from __future__ import annotations

from typing import Any

ELEMENTWISE = ("ReLU", "Tanh", "GELU", "Sigmoid", "SiLU", "LeakyReLU", "ELU", "Softplus", "Mish",
               "Hardtanh", "Identity", "Dropout")


def plan(model: Any) -> list[tuple[Any, ...]] | None:
    """The batched forward's steps for ``model``, or ``None`` if it has a layer not covered."""
    import torch.nn as nn

    if type(model) is not nn.Sequential:
        return None
    steps: list[tuple[Any, ...]] = []
    for name, m in model.named_children():
        kind = type(m)
        if kind is nn.Linear:
            steps.append(("linear", f"{name}.weight", f"{name}.bias" if m.bias is not None else None))
        elif kind is nn.Flatten and m.start_dim == 1 and m.end_dim == -1:
            steps.append(("flatten",))
        elif kind.__module__.startswith("torch.nn") and kind.__name__ in ELEMENTWISE:
            steps.append(("apply", m))
        else:
            return None
    return steps


def accepts(steps: list[tuple[Any, ...]], x: Any) -> bool:
    """Whether the batched forward takes inputs shaped like ``x``: its first Linear needs
    ``[B, features]`` (after a Flatten if there is one before it)."""
    for step in steps:
        if step[0] == "flatten":
            return True
        if step[0] == "linear":
            return bool(x.dim() == 2)
    return True


def uses_default_loss(trainer: Any) -> bool:
    """Whether the trainer's loss is ``Trainer.loss`` (mean cross-entropy), not overridden."""
    fn = getattr(type(trainer), "loss", None)
    return getattr(fn, "__qualname__", "") == "Trainer.loss" and \
        getattr(fn, "__module__", "") == "rubberband.executor.trainer"


def member_losses(steps: list[tuple[Any, ...]], trainer: Any, F: int) -> Any:
    """A function ``(params, x, y) -> [F]`` losses, one per member, with the batched layers."""
    import torch
    import torch.nn.functional as nnf
    from torch.func import vmap

    default_loss = uses_default_loss(trainer)
    vloss = None if default_loss else vmap(trainer.loss, in_dims=(0, None), randomness="different")

    def forward(params: dict[str, Any], x: Any) -> Any:
        h, shared = x, True
        for step in steps:
            if step[0] == "linear":
                W = params[step[1]]
                b = params[step[2]] if step[2] is not None else None
                if shared:
                    h = torch.matmul(h, W.transpose(1, 2))
                    if b is not None:
                        h = h + b.unsqueeze(1)
                    shared = False
                elif b is not None:
                    h = torch.baddbmm(b.unsqueeze(1), h, W.transpose(1, 2))
                else:
                    h = torch.bmm(h, W.transpose(1, 2))
            elif step[0] == "flatten":
                h = h.flatten(1) if shared else h.flatten(2)
            else:
                if shared and type(step[1]).__name__ == "Dropout":
                    h, shared = h.expand(F, *h.shape), False
                h = step[1](h)
        return h if not shared else h.expand(F, *h.shape)

    def losses(params: dict[str, Any], x: Any, y: Any) -> Any:
        out = forward(params, x)
        if default_loss:
            B = out.shape[1]
            return nnf.cross_entropy(out.reshape(F * B, -1), y.repeat(F), reduction="none").view(F, B).mean(1)
        assert vloss is not None
        return vloss(out, y)

    return losses
