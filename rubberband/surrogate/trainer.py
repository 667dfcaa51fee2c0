"""A user's trainer in μP: the narrow surrogate that is tuned, and the full-width target its
winner trains.

Both are parametrized against the same base shapes, the model at ``width / S`` (each of the
trainer's ``width_keys`` divided by the ratio ``S``). The surrogate *is* the base, so its
multipliers are all 1 and it trains exactly as the trainer's own code would at that width;
the target scales init and learning rates by ``rubberband.surrogate.parametrization``'s rules,
so that the hyperparameters tuned on the surrogate (learning rate, momentum, schedule, batch
size) stay the best ones at full width. The wrappers are ``Trainer`` objects: the optimizer's
per-parameter multipliers are ordinary param groups, built again from parameter names in
every ``build_optimizer``, so a ``DDPWorker`` (DDP, checkpoints, restores) runs them unchanged.
"""

from __future__ import annotations

from typing import Any

from rubberband.errors import SpecError
from rubberband.executor.trainer import Trainer
from rubberband.surrogate.parametrization import (
    Family,
    ParamRule,
    model_shapes,
    module_kinds,
    optimizer_family,
    param_rules,
)

_COPIED = ("global_batch_size", "steps_per_iter", "metric", "mode", "data_depends_on_config", "max_micro_batch",
           "width_keys")


def check_ratio(ratio: object) -> int:
    """``ratio`` as an integer of at least 2.

    Raises:
        SpecError: ``surrogate.width_ratio: ...`` otherwise.
    """
    if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 2:
        raise SpecError(f"surrogate.width_ratio: expected an integer of at least 2 (how many times narrower the "
                        f"surrogate is), got {ratio!r}")
    return ratio


def width_keys(trainer: Any) -> tuple[str, ...]:
    """The trainer's ``width_keys``, checked to be a non-empty tuple of names.

    Raises:
        SpecError: when the trainer names none, or names something that is not a string.
    """
    keys = getattr(trainer, "width_keys", ())
    name = type(trainer).__name__
    if isinstance(keys, str) or not isinstance(keys, (tuple, list)) or not all(isinstance(k, str) for k in keys):
        raise SpecError(f"surrogate: {name}.width_keys must be a tuple of config keys such as ('hidden',), got {keys!r}")
    if not keys:
        raise SpecError(f"surrogate: trainer {name} names no width_keys; set width_keys = ('hidden',) on it to the "
                        "config keys that set its model's width")
    return tuple(keys)


def width_config(trainer: Any, config: dict[str, Any], ratio: int) -> dict[str, Any]:
    """``config`` with each of the trainer's width keys divided by ``ratio``.

    Raises:
        SpecError: one line naming the width key that is missing from ``config``, not a
            positive integer, or not divisible by ``ratio``.
    """
    ratio = check_ratio(ratio)
    out = dict(config)
    for key in width_keys(trainer):
        if key not in config:
            raise SpecError(f"surrogate: width key {key!r} is not in the trial's config; give the full width in "
                            f"search_space (e.g. {key}: 128)")
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise SpecError(f"surrogate: width key {key} = {value!r} is not a positive integer; give the full width "
                            f"as an integer in search_space")
        if value % ratio:
            raise SpecError(f"surrogate: width key {key} = {value} is not divisible by width_ratio {ratio}; use a "
                            f"multiple of {ratio} (e.g. {key}: {max(ratio, value // ratio * ratio)})")
        out[key] = value // ratio
    return out


class MupTrainer(Trainer):
    """``trainer`` in μP with base shapes at ``width / ratio``, its model built at ``width / divisor``.

    Use ``surrogate_trainer`` (``divisor = ratio``) and ``target_trainer`` (``divisor = 1``).
    Everything but ``build_model`` and ``build_optimizer`` is the wrapped trainer's.
    """

    def __init__(self, trainer: Any, ratio: int, divisor: int):
        self.trainer = trainer
        self.ratio = check_ratio(ratio)
        if divisor not in (1, self.ratio):
            raise SpecError(f"surrogate: a model is built at the full width or at width / {self.ratio}, not / {divisor}")
        self.divisor = divisor
        width_keys(trainer)
        for attr in _COPIED:
            if hasattr(trainer, attr):
                setattr(self, attr, getattr(trainer, attr))

    def __getattr__(self, name: str) -> Any:
        # Only reached for what this object lacks: the wrapped trainer's own extras.
        if name == "trainer" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.trainer, name)

    def __repr__(self) -> str:
        which = "surrogate" if self.divisor > 1 else "target"
        return f"{which}_trainer({type(self.trainer).__name__}, width_ratio={self.ratio})"

    # --- delegated ---------------------------------------------------------------------------
    def prepare(self) -> None:
        self.trainer.prepare()

    def build_data(self, config: dict[str, Any]):
        return self.trainer.build_data(config)

    def loss(self, output, target):
        return self.trainer.loss(output, target)

    def evaluate(self, model, dataset) -> dict[str, float]:
        return self.trainer.evaluate(model, dataset)

    # --- μP ----------------------------------------------------------------------------------
    def model_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config the wrapped trainer builds this model from (width keys divided)."""
        base = width_config(self.trainer, config, self.ratio)     # checks the keys either way
        return base if self.divisor > 1 else dict(config)

    def rules(self, model: Any, config: dict[str, Any]) -> dict[str, ParamRule]:
        """μP's rule per parameter name of ``model`` (built from ``config``).

        The base (``width / ratio``) and the full-width model are built for their shapes on
        torch's ``meta`` device (no memory, no draw from the random generator).

        Raises:
            SpecError: when the width keys change no parameter's shape.
        """
        base = self._shapes(width_config(self.trainer, config, self.ratio))
        full = self._shapes(dict(config))
        rules = param_rules(model_shapes(model), base, full, module_kinds(model))
        if all(base[n] == full[n] for n in base):
            raise SpecError(f"surrogate: {type(self.trainer).__name__}'s width keys "
                            f"({', '.join(width_keys(self.trainer))}) change no parameter's shape; name the config "
                            "keys its build_model reads the width from")
        return rules

    def lr_multipliers(self, model: Any, config: dict[str, Any], family: Family) -> dict[str, float]:
        """Learning-rate multiplier per parameter name (what a fused trainer needs per member)."""
        return {name: rule.lr_mult(family) for name, rule in self.rules(model, config).items()}

    def _shapes(self, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        import torch

        with torch.random.fork_rng(devices=[]):
            try:
                with torch.device("meta"):
                    model = self.trainer.build_model(config)
            except Exception:      # code that cannot run on meta tensors: build it for real
                model = self.trainer.build_model(config)
        return model_shapes(model)

    def build_model(self, config: dict[str, Any]):
        """The wrapped trainer's model at this width, its init rescaled by μP's rules."""
        import torch

        model = self.trainer.build_model(self.model_config(config))
        rules = self.rules(model, config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if rules[name].init_scale != 1.0:
                    p.mul_(rules[name].init_scale)
        return model

    def build_optimizer(self, model, config: dict[str, Any]):
        """The wrapped trainer's optimizer, each param group split by μP's multipliers.

        Each new group is the old one with ``lr``, ``weight_decay`` and ``eps`` multiplied (and
        ``mup_lr_mult`` recorded), put back into the same optimizer in place of its groups.
        Where every multiplier is 1 (the surrogate) it is returned as the trainer built it.
        """
        opt = self.trainer.build_optimizer(model, config)
        family = optimizer_family(opt)
        rules = self.rules(model, config)
        names = {id(p): name for name, p in model.named_parameters()}
        groups: list[dict[str, Any]] = []
        scaled = False
        for group in opt.param_groups:
            decoupled = bool(group.get("decoupled_weight_decay", type(opt).__name__ == "AdamW"))
            split: dict[tuple[float, float, float], list[Any]] = {}
            for p in group["params"]:
                if id(p) not in names:
                    raise SpecError(f"surrogate: {type(self.trainer).__name__}.build_optimizer optimizes a tensor that "
                                    "is not a parameter of the model; μP's multipliers are found by parameter name")
                rule = rules[names[id(p)]]
                split.setdefault((rule.lr_mult(family), rule.wd_mult(family, decoupled), rule.eps_mult(family)), []).append(p)
            for (lr_mult, wd_mult, eps_mult), params in split.items():
                new = {k: v for k, v in group.items() if k != "params"}
                new.update(params=params, lr=group["lr"] * lr_mult, mup_lr_mult=lr_mult)
                if "weight_decay" in group:
                    new["weight_decay"] = group["weight_decay"] * wd_mult
                if "eps" in group:
                    new["eps"] = group["eps"] * eps_mult
                scaled = scaled or (lr_mult, wd_mult, eps_mult) != (1.0, 1.0, 1.0)
                groups.append(new)
        if scaled:
            # What Optimizer.__init__ itself does with a list of groups; the optimizer has taken
            # no step, so it holds no state yet. (Calling type(opt)(groups, **opt.defaults) fails:
            # defaults may hold keys its constructor does not take, e.g. AdamW's.)
            opt.param_groups = []
            for new in groups:
                opt.add_param_group(new)
        return opt


def surrogate_trainer(trainer: Any, ratio: int) -> MupTrainer:
    """The surrogate: ``trainer``'s model at ``width / ratio``, which is μP's base (all multipliers 1).

    Raises:
        SpecError: ``ratio`` below 2, or a trainer without ``width_keys``.
    """
    return MupTrainer(trainer, ratio, ratio)


def target_trainer(trainer: Any, ratio: int) -> MupTrainer:
    """The target: ``trainer``'s model at full width in μP, with base shapes at ``width / ratio``,
    so hyperparameters tuned on ``surrogate_trainer(trainer, ratio)`` transfer to it.

    Raises:
        SpecError: ``ratio`` below 2, or a trainer without ``width_keys``.
    """
    return MupTrainer(trainer, ratio, 1)


TARGET_KEY = "__rubberband_target__"      # = rubberband.executor.driver.TARGET_KEY (the driver sets it)


class SurrogateJob(Trainer):
    """The trainer a surrogate job's workers run (DESIGN §4.6): each trial's config says which
    model it is. A config with ``TARGET_KEY`` set (the driver adds it for the target trial only)
    builds ``target_trainer(trainer, ratio)``: the full-width model in μP; any other builds
    ``surrogate_trainer(trainer, ratio)``, the model at ``width / ratio``. The key is taken out
    before the user's code sees the config. One object, so a warm worker serves both kinds of
    trial; a trial's model is built whole at each ``assign`` (the target from scratch).

    Raises:
        SpecError: ``ratio`` below 2, or a trainer without ``width_keys`` (at construction).
    """

    serves_target = True    # what ``execute`` checks: the workers build each trial by its config's TARGET_KEY

    def __init__(self, trainer: Any, ratio: int):
        from rubberband.executor.worker import load_trainer

        self.trainer = load_trainer(trainer)
        if not isinstance(self.trainer, Trainer) and callable(self.trainer) and not hasattr(self.trainer, "build_model"):
            raise SpecError("surrogate: a function trainable builds its own model, so rubberband cannot narrow it; "
                            "write a Trainer class with width_keys, or drop `surrogate:`")
        self.surrogate = surrogate_trainer(self.trainer, ratio)
        self.target = target_trainer(self.trainer, ratio)
        self.ratio = self.surrogate.ratio
        for attr in _COPIED:
            if hasattr(self.trainer, attr):
                setattr(self, attr, getattr(self.trainer, attr))

    def __repr__(self) -> str:
        return f"SurrogateJob({type(self.trainer).__name__}, width_ratio={self.ratio})"

    def _which(self, config: dict[str, Any]) -> tuple[MupTrainer, dict[str, Any]]:
        target = bool(config.get(TARGET_KEY))
        return (self.target if target else self.surrogate), {k: v for k, v in config.items() if k != TARGET_KEY}

    def prepare(self) -> None:
        self.trainer.prepare()

    def build_data(self, config: dict[str, Any]):
        return self.trainer.build_data(self._which(config)[1])

    def build_model(self, config: dict[str, Any]):
        which, own = self._which(config)
        return which.build_model(own)

    def build_optimizer(self, model, config: dict[str, Any]):
        which, own = self._which(config)
        return which.build_optimizer(model, own)

    def loss(self, output, target):
        return self.trainer.loss(output, target)

    def evaluate(self, model, dataset) -> dict[str, float]:
        return self.trainer.evaluate(model, dataset)

    def model_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The config the user's trainer builds this trial's model from (width keys divided for
        a surrogate, as they are for the target)."""
        which, own = self._which(config)
        return which.model_config(own)
