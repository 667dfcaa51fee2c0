"""Which trials can be fused, and into which groups: each reason in one line.

A fused group runs one model's code over every member's tensors, feeds every member the same
batches, and steps one optimizer over all of them. So trials fuse when:

- the trainer is a ``Trainer`` class, not a function trainable (which runs its own loop);
- the data does not depend on the config (``data_depends_on_config = False``), or all the
  configs are equal — otherwise members could need different batch streams;
- their configs build models of one structure and parameter shape (``group_by_shape``: trials
  with a different ``hidden`` go to different groups);
- the model's forward and the loss run under ``torch.func.vmap`` — no data-dependent control
  flow (``if tensor:``), no module without a batching rule (``nn.LSTM``) — found by running one
  fused step of two members on one real batch;
- the optimizer steps without a closure (``LBFGS`` needs one). SGD, Adam and AdamW step fused;
  any other optimizer steps per member (``optim.PerMemberStep``).
"""

from __future__ import annotations

import re
from typing import Any

from rubberband import function_api

CLOSURE_OPTIMIZERS = ("LBFGS",)


def _build_meta(trainer: Any, config: dict[str, Any]) -> Any:
    """The config's model without allocating its weights (on torch's meta device when the
    trainer's code allows it)."""
    import torch

    try:
        with torch.device("meta"):
            return trainer.build_model(config)
    except Exception:
        return trainer.build_model(config)


def group_by_shape(trainer: Any, configs: list[dict[str, Any]]) -> list[list[int]]:
    """Indices of ``configs`` grouped by the structure and parameter shapes of their models
    (``group.signature``), each group in the order first seen."""
    from rubberband.fusion.group import signature

    groups: dict[Any, list[int]] = {}
    for i, config in enumerate(configs):
        groups.setdefault(signature(_build_meta(trainer, config)), []).append(i)
    return list(groups.values())


def _differing_keys(configs: list[dict[str, Any]], groups: list[list[int]]) -> list[str]:
    """Config keys whose values differ between groups (the ones that change the shape)."""
    keys = sorted({k for c in configs for k in c})
    firsts = [configs[g[0]] for g in groups]
    return [k for k in keys if len({repr(c.get(k)) for c in firsts}) > 1]


def why_not_fusable(trainer: Any, configs: list[dict[str, Any]], sample: tuple[Any, Any] | None = None,
                    *, seed: int = 0) -> str | None:
    """Why these trials cannot be trained as one fused group, in one line; ``None`` if they can.

    Args:
        trainer: the user's trainer instance (or a function trainable).
        configs: the trials' configs.
        sample: one ``(x, y)`` training batch to try the fused step on; default the first
            ``global_batch_size`` samples of ``trainer.build_data(configs[0])``.
        seed: torch seed for building the trial members (the global RNG is restored after).
    """
    if function_api.is_function_trainable(trainer):
        return ("a function trainable runs its own training loop: rubberband cannot batch its model "
                "(write a Trainer class to fuse)")
    if not configs:
        return "no configs to fuse"
    if getattr(trainer, "data_depends_on_config", True) and any(c != configs[0] for c in configs):
        return ("trainer.data_depends_on_config is True: fused members share one batch stream; set it to "
                "False if the data does not depend on the config")
    groups = group_by_shape(trainer, configs)
    if len(groups) > 1:
        keys = _differing_keys(configs, groups)
        return (f"the configs build {len(groups)} different model shapes (differing: {', '.join(keys) or '?'}); "
                "fuse each group_by_shape group separately")
    return _try_a_step(trainer, configs[:2], sample, seed)


def _try_a_step(trainer: Any, configs: list[dict[str, Any]], sample: tuple[Any, Any] | None, seed: int) -> str | None:
    """Build a fused group of (up to) two members and train one step on a real batch."""
    import torch

    from rubberband.fusion.group import FusedGroup

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        opt = trainer.build_optimizer(trainer.build_model(configs[0]), configs[0])
        if type(opt).__name__ in CLOSURE_OPTIMIZERS:
            return f"unsupported optimizer: torch.optim.{type(opt).__name__} steps with a closure; a fused group steps without one"
        if sample is None:
            train_set, _ = trainer.build_data(configs[0])
            B = int(getattr(trainer, "global_batch_size", 64))
            sample = next(iter(torch.utils.data.DataLoader(train_set, batch_size=B)))
        x, y = sample
        try:
            group = FusedGroup(trainer, configs, seed=seed)
            group.train_step(x, y)
        except Exception as exc:    # noqa: BLE001 - any failure is a reason not to fuse, named below
            return _reason(exc, trainer, configs[0])
    return None


_NO_RULE = re.compile(r"Batching rule not implemented for (aten::[\w.]+)")


def _reason(exc: Exception, trainer: Any, config: dict[str, Any]) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "data-dependent control flow" in text:
        return ("data-dependent control flow in the model's forward or loss (a Python `if` or `.item()` on a "
                "tensor): torch.func.vmap cannot batch it")
    rule = _NO_RULE.search(text)
    if rule:
        kinds = sorted({type(m).__name__ for m in trainer.build_model(config).modules()
                        if rule.group(1).split("::")[1].split(".")[0].lower() in type(m).__name__.lower()})
        where = f" (in nn.{kinds[0]})" if kinds else ""
        return f"unsupported module{where}: torch.func.vmap has no batching rule for {rule.group(1)}"
    return f"the model does not train under torch.func.vmap: {type(exc).__name__}: {text[:200]}"
