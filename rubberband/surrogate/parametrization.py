"""μP (the Maximal Update Parametrization) written out: per-parameter init scales and
learning-rate multipliers, computed by parameter name from two sets of shapes.

Yang et al., *Tensor Programs V* (2022), Table 3, as the ``mup`` library implements it
(``set_base_shapes``, ``MuReadout``, ``MuSGD``, ``MuAdam``), relative to a *base* model: a
dimension is *infinite* when it differs between the base shapes and the *delta* shapes
(another width), and its width multiplier is ``m = dim / base_dim`` (1 for finite dims).
For a weight, ``fan_out`` is dimension 0 and ``fan_in`` dimension 1 (``nn.Linear``, convs);
``m_in``, ``m_out`` are their multipliers and ``m`` is that of the last infinite dimension.

==========================  ===========  ==========  ==============  ==============
parameter                    infinite     init ×      SGD lr ×        Adam lr ×
==========================  ===========  ==========  ==============  ==============
fixed (e.g. readout bias)    none         1           1               1
vector / input weight        one          1           m               1
output weight (readout)      fan_in only  1/sqrt(m)   1/m             1/m
hidden weight                two          1           m_out / m_in    1/m_in
==========================  ===========  ==========  ==============  ==============

- The bias of an ``nn.Linear`` or a conv is also scaled at init by ``sqrt(m_in)`` of its own
  weight (mup's ``rescale_linear_bias``), so it keeps the base's scale.
- Weight decay is multiplied by ``1 / (lr multiplier)``, keeping ``lr · wd`` as mup does
  (a readout's coupled decay under Adam: by ``m²``, see below).
- The *output* row differs from mup on purpose. mup's ``MuReadout`` multiplies its input by
  ``1/m`` in ``forward`` and scales its weight ``W`` by ``sqrt(m)`` at init (SGD lr × m, Adam
  × 1). Storing ``W' = W / m`` instead gives the same function with a plain ``nn.Linear``
  the user already wrote: ``W'`` starts at ``sqrt(m)/m = 1/sqrt(m)`` of the default init;
  under SGD its gradient is ``m`` times ``W``'s and its step must be ``1/m`` of ``W``'s, so
  ``lr × m · (1/m) · (1/m) = 1/m``; Adam normalises the gradient's scale away, leaving
  ``1/m``; its gradient being ``m`` times larger, Adam's ``eps`` is multiplied by ``m`` too
  (else ``eps`` weighs ``m`` times less than in mup), and coupled decay (added to that
  gradient) by ``m²``. Training with these rules tracks mup's step for step, SGD, Adam and
  AdamW (``tests/unit/surrogate`` checks it against the library).
- Nothing here is an attribute of a tensor (mup's ``infshape`` is, and ``state_dict``,
  ``deepcopy`` and ``torch.func.stack_module_state`` lose it): the rules are a mapping from
  parameter name to numbers, computed again whenever a model is built.
- Not covered: attention needs its ``1/sqrt(d)`` replaced by ``1/d`` in the model's own
  code; a tensor with more than two infinite dimensions has no μP rule here (nor in mup).

torch is not imported by this module: it reads shapes and module kinds only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rubberband.errors import SpecError

Shapes = Mapping[str, tuple[int, ...]]


class Kind(Enum):
    """How μP treats a parameter, by which of its dimensions grow with width."""

    FIXED = "fixed"
    VECTOR = "vector"        # one infinite dimension, not a readout's fan-in: biases, norms, input weights
    OUTPUT = "output"        # a weight whose fan-in grows and fan-out does not: the readout
    HIDDEN = "hidden"        # fan-in and fan-out both grow


class Family(Enum):
    """Optimizers whose μP learning-rate rules are the same (mup's ``MuSGD`` and ``MuAdam``)."""

    SGD = "sgd"              # the update is proportional to the gradient
    ADAM = "adam"            # the update normalises the gradient entrywise (Adam, AdamW, RMSprop, Adagrad, ...)


# torch.optim class names by family; mup's optim module names RMSprop and Adagrad "Adam-like".
OPTIMIZER_FAMILIES = {
    "SGD": Family.SGD, "ASGD": Family.SGD,
    "Adam": Family.ADAM, "AdamW": Family.ADAM, "Adamax": Family.ADAM, "NAdam": Family.ADAM,
    "RAdam": Family.ADAM, "RMSprop": Family.ADAM, "Adagrad": Family.ADAM,
}


def optimizer_family(optimizer: Any) -> Family:
    """The μP family of a ``torch.optim`` optimizer (or subclass), by class name.

    Raises:
        SpecError: for an optimizer with no μP rule here.
    """
    for cls in type(optimizer).__mro__:
        if cls.__name__ in OPTIMIZER_FAMILIES:
            return OPTIMIZER_FAMILIES[cls.__name__]
    raise SpecError(f"surrogate: the trainer's optimizer {type(optimizer).__name__} has no μP rule; use one of "
                    f"{', '.join(OPTIMIZER_FAMILIES)} (SGD-like or Adam-like, as mup's MuSGD / MuAdam)")


@dataclass(frozen=True)
class ParamRule:
    """μP for one parameter: its kind, multipliers, init scale and learning-rate multipliers.

    ``width_mult`` is that of its last infinite dimension (mup's ``infshape.width_mult()``);
    ``fan_in_mult`` and ``fan_out_mult`` those of dimensions 1 and 0 (1 for a vector).
    ``init_scale`` multiplies the parameter as the model's own code initialised it.
    """

    kind: Kind
    width_mult: float
    fan_in_mult: float
    fan_out_mult: float
    init_scale: float

    def lr_mult(self, family: Family) -> float:
        """Learning-rate multiplier under ``family`` (the table in the module docstring)."""
        if self.kind is Kind.FIXED:
            return 1.0
        if self.kind is Kind.OUTPUT:
            return 1.0 / self.fan_in_mult
        if self.kind is Kind.VECTOR:
            return self.width_mult if family is Family.SGD else 1.0
        return self.fan_out_mult / self.fan_in_mult if family is Family.SGD else 1.0 / self.width_mult

    def eps_mult(self, family: Family) -> float:
        """Multiplier of Adam's ``eps``: ``m`` for a readout (its gradient is ``m`` times mup's)."""
        return self.fan_in_mult if self.kind is Kind.OUTPUT and family is Family.ADAM else 1.0

    def wd_mult(self, family: Family, decoupled: bool = True) -> float:
        """Weight-decay multiplier: ``1 / lr_mult``, so ``lr · wd`` stays the base's (mup's rule);
        for a readout under an Adam-like optimizer with *coupled* decay (``Adam(weight_decay=)``)
        ``m²``, as decay added to a gradient ``m`` times mup's must be ``m²`` times larger."""
        if self.kind is Kind.OUTPUT and family is Family.ADAM and not decoupled:
            return self.fan_in_mult**2
        return 1.0 / self.lr_mult(family)


def param_rules(shapes: Shapes, base: Shapes, delta: Shapes | None = None,
                module_kind: Callable[[str], str] | None = None) -> dict[str, ParamRule]:
    """μP's rule for each parameter, by name.

    Args:
        shapes: parameter name -> shape, of the model being trained.
        base: the same names' shapes in the base model (multipliers are ``dim / base_dim``).
        delta: shapes at another width, only to tell which dimensions are infinite (those
            that differ from ``base``); defaults to ``shapes``, as in mup.
        module_kind: the kind of module that owns a parameter, given its name:
            ``"linear"`` (``nn.Linear`` and convs: their weight is ``(fan_out, fan_in, ...)``
            and their bias is rescaled with it), or anything else. Defaults to treating every
            module as ``"other"`` (a readout is then not recognised: give it).

    Raises:
        SpecError: a name missing from ``base`` or ``delta``, a rank that differs, or a
            parameter with more than two infinite dimensions.
    """
    delta = shapes if delta is None else delta
    kind_of = module_kind or (lambda name: "other")
    rules: dict[str, ParamRule] = {}
    infinite: dict[str, tuple[bool, ...]] = {}
    for name, shape in shapes.items():
        if name not in base or name not in delta:
            raise SpecError(f"surrogate: parameter {name} is not in the base model; the trainer's model must have "
                            "the same parameters at every width")
        if not len(base[name]) == len(delta[name]) == len(shape):
            raise SpecError(f"surrogate: parameter {name} has shape {tuple(shape)} but {tuple(base[name])} in the base "
                            "model; only sizes may change with width, not the number of dimensions")
        infinite[name] = tuple(b != d for b, d in zip(base[name], delta[name]))
    for name, shape in shapes.items():
        inf, mults = infinite[name], [d / b for d, b in zip(shape, base[name])]
        mults = [m if i else 1.0 for m, i in zip(mults, inf)]
        ninf = sum(inf)
        if ninf > 2:
            raise SpecError(f"surrogate: parameter {name} has {ninf} dimensions that grow with width; μP's rules "
                            "cover at most 2 (as mup's)")
        width_mult = next((m for m, i in zip(reversed(mults), reversed(inf)) if i), 1.0)
        fan_out, fan_in = (mults[0], mults[1]) if len(shape) >= 2 else (1.0, 1.0)
        owner, _, leaf = name.rpartition(".")
        linear = kind_of(name) == "linear"
        if ninf == 0:
            kind = Kind.FIXED
        elif ninf == 2:
            kind = Kind.HIDDEN
        elif linear and leaf == "weight" and len(shape) >= 2 and inf[1] and not inf[0]:
            kind = Kind.OUTPUT
        else:
            kind = Kind.VECTOR
        init = 1.0 / math.sqrt(fan_in) if kind is Kind.OUTPUT else 1.0
        weight = f"{owner}.weight" if owner else "weight"
        if linear and leaf == "bias" and weight in shapes and len(shapes[weight]) >= 2 and infinite[weight][1]:
            init = math.sqrt(shapes[weight][1] / base[weight][1])      # mup's rescale_linear_bias
        rules[name] = ParamRule(kind, width_mult, fan_in, fan_out, init)
    return rules


def model_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of a ``torch.nn.Module``'s parameters."""
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def module_kinds(model: Any) -> Callable[[str], str]:
    """``param_rules``' ``module_kind`` for a ``torch.nn.Module``: ``"linear"`` for parameters
    of ``nn.Linear`` and convolutions (whose weights are ``(fan_out, fan_in, ...)``)."""
    import torch.nn as nn

    linear = {name for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.modules.conv._ConvNd))}

    def kind(param: str) -> str:
        return "linear" if param.rpartition(".")[0] in linear else "other"

    return kind
