"""Optimizers for a fused group: one step for all members, each with its own hyperparameters.

A member's optimizer is the one its trainer builds (``build_optimizer(model, config)``) over
the member's own module, whose parameters alias the member's slice of the group's stacked
tensors (``[F, ...]``). Its param groups stay the source of truth for hyperparameters, read
at every step (so anything that changes a member's ``lr`` in its param groups is honoured),
and its ``state_dict()`` is what a member's checkpoint holds.

Two ways to step:

- ``FusedSGD`` / ``FusedAdam``: torch.optim's single-tensor arithmetic on the stacked tensors
  with per-member hyperparameter tensors of shape ``[F, 1, ..., 1]`` — one kernel per stacked
  parameter instead of ``F``. The formulas are torch 2.x's ``_single_tensor_sgd`` /
  ``_single_tensor_adam`` (``AdamW`` is ``Adam`` with ``decoupled_weight_decay``), operation
  for operation, with Python-float scalars replaced by float64-computed, parameter-dtype
  tensors (the cast ``torch.optim`` does when it passes a Python float to a kernel):

      SGD:  g ← g + wd·p;  b ← g (first step) | m·b + (1−d)·g;  g ← g + m·b (nesterov) | b;  p ← p − lr·g
      Adam: t ← t+1;  p ← p·(1 − lr·wd) (AdamW) | g ← g + wd·p (Adam);  m₁ ← lerp(m₁, g, 1−β₁);
            m₂ ← β₂·m₂ + (1−β₂)·g²;  p ← p − (lr / (1−β₁ᵗ))·m₁ / (√m₂ / √(1−β₂ᵗ) + ε)

- ``PerMemberStep``: any other optimizer (or an SGD/Adam with a flag the fused forms do not
  cover: amsgrad, maximize, mixed classes). Each member's own torch optimizer steps its own
  parameters, whose ``.grad`` is set to its slice of the stacked gradient; exact by
  construction, ``F`` optimizer calls per step.
"""

from __future__ import annotations

from typing import Any

FUSABLE = ("SGD", "Adam", "AdamW")


def _group_of(opt: Any) -> dict[int, dict[str, Any]]:
    """id(parameter) -> its param group, for one member's optimizer."""
    return {id(p): g for g in opt.param_groups for p in g["params"]}


def fused_kind(opts: list[Any]) -> str | None:
    """Which fused form steps these members' optimizers, or None (use ``PerMemberStep``)."""
    names = {type(o).__name__ for o in opts}
    types = {type(o) for o in opts}
    if len(types) != 1 or names.pop() not in FUSABLE:
        return None
    import torch

    cls = types.pop()
    if cls not in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW):
        return None      # a user's subclass may override step()
    for o in opts:
        for g in o.param_groups:
            if g.get("maximize") or g.get("amsgrad") or g.get("differentiable") or g.get("capturable"):
                return None
    if cls is torch.optim.SGD:
        return "SGD"
    decoupled = {bool(g.get("decoupled_weight_decay", cls is torch.optim.AdamW)) for o in opts for g in o.param_groups}
    return None if len(decoupled) != 1 else ("AdamW" if decoupled.pop() else "Adam")


class _Stepper:
    """Common part: per stacked parameter, each member's param group; hyperparameter tensors."""

    keys: tuple[str, ...] = ()

    def __init__(self, stacked: dict[str, Any], members: list[dict[str, Any]], opts: list[Any]):
        # stacked: name -> [F, ...] leaf; members[i]: name -> member i's Parameter (a view).
        self.stacked, self.members, self.opts = stacked, members, opts
        self.F = len(opts)
        groups = [_group_of(o) for o in opts]
        self.groups: dict[str, list[dict[str, Any]]] = {}
        for name in stacked:
            found = [groups[i].get(id(members[i][name])) for i in range(self.F)]
            if all(g is None for g in found):
                continue                      # trained by no member: frozen
            if any(g is None for g in found):
                raise ValueError(f"parameter {name}: in some members' optimizers but not others; "
                                 "a fused group needs the same parameters optimized in every member")
            self.groups[name] = found  # type: ignore[assignment]
        distinct = {id(g): g for found in self.groups.values() for g in found}
        self._distinct = list(distinct.values())
        self._snapshot: tuple[Any, ...] | None = None
        self._hyper: dict[str, dict[str, Any]] = {}

    def _read(self, group: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(tuple(map(float, group[k])) if isinstance(group[k], tuple) else float(group[k])
                     for k in self.keys)

    def hypers(self) -> dict[str, dict[str, Any]]:
        """Per stacked parameter: ``derive``'s tensors from the members' hyperparameters, rebuilt
        only when a member's param group changed since the last step (an LR schedule)."""
        import torch

        snapshot = tuple(self._read(g) for g in self._distinct)
        if snapshot == self._snapshot:
            return self._hyper
        self._snapshot = snapshot
        for name, groups in self.groups.items():
            P = self.stacked[name]
            shape = (self.F,) + (1,) * (P.dim() - 1)
            values = [self._read(g) for g in groups]
            h64: dict[str, Any] = {}
            for j, k in enumerate(self.keys):
                column: list[Any] = [v[j] for v in values]
                if isinstance(column[0], tuple):
                    for n in range(len(column[0])):
                        h64[f"{k}{n}"] = torch.tensor([c[n] for c in column], dtype=torch.float64,
                                                      device=P.device).view(shape)
                else:
                    h64[k] = torch.tensor(column, dtype=torch.float64, device=P.device).view(shape)
            # Python floats are doubles that torch.optim hands to float32 kernels: compute in
            # float64, then cast to the parameter's dtype, as that hand-over does.
            self._hyper[name] = self.derive(h64, P.dtype, values)
        return self._hyper

    def derive(self, h: dict[str, Any], dtype: Any, values: list[tuple[Any, ...]]) -> dict[str, Any]:
        return h

    def step(self) -> None:
        """One optimizer step of every member from the stacked gradients."""
        raise NotImplementedError

    def pull(self) -> None:
        """Read the members' torch optimizer state (after a checkpoint was loaded into them)."""

    def push(self) -> None:
        """Write the fused state into the members' torch optimizers (before ``state_dict()``)."""


class FusedSGD(_Stepper):
    keys = ("lr", "momentum", "dampening", "weight_decay", "nesterov")

    def __init__(self, stacked, members, opts):
        super().__init__(stacked, members, opts)
        self.buf: dict[str, Any] = {}
        self.ready: dict[str, list[bool]] = {}       # per member: has a momentum buffer
        self.pull()

    def pull(self) -> None:
        import torch

        for name in self.groups:
            P = self.stacked[name]
            bufs = [o.state.get(self.members[i][name], {}).get("momentum_buffer") for i, o in enumerate(self.opts)]
            self.ready[name] = [b is not None for b in bufs]
            self.buf[name] = torch.stack([b.detach().to(P) if b is not None else torch.zeros_like(P[0])
                                          for b in bufs])

    def push(self) -> None:
        for name, groups in self.groups.items():
            for i, o in enumerate(self.opts):
                p = self.members[i][name]
                if float(groups[i]["momentum"]) != 0 and self.ready[name][i]:
                    o.state[p] = {"momentum_buffer": self.buf[name][i].detach().clone()}
                else:
                    o.state.pop(p, None)

    def derive(self, h: dict[str, Any], dtype: Any, values: list[tuple[Any, ...]]) -> dict[str, Any]:
        lr, momentum, dampening, wd, nesterov = (h[k] for k in self.keys)
        # Which members use weight decay / momentum / nesterov, as Python bools: no step waits
        # on the device to decide.
        return {"neg_lr": (-lr).to(dtype), "mom": momentum.to(dtype), "damp1": (1 - dampening).to(dtype),
                "wd": wd.to(dtype), "nesterov": nesterov != 0, "mom_nz": momentum != 0,
                "wd_on": [v[3] != 0 for v in values], "mom_on": [v[1] != 0 for v in values],
                "any_nesterov": any(v[4] for v in values)}

    def step(self) -> None:
        import torch

        hypers = self.hypers()
        with torch.no_grad():
            for name in self.groups:
                P = self.stacked[name]
                g = P.grad
                if g is None:
                    continue
                h = hypers[name]
                mom_on = h["mom_on"]
                if any(h["wd_on"]):
                    g = g.addcmul(P, h["wd"])
                if any(mom_on):
                    buf, ready = self.buf[name], self.ready[name]
                    if all(r for r, on in zip(ready, mom_on) if on):
                        buf.mul_(h["mom"]).addcmul_(g, h["damp1"])
                    else:           # some member's first step with momentum: its buffer starts as g
                        r = torch.tensor(ready, device=P.device).view(h["mom"].shape)
                        buf.copy_(torch.where(r, buf * h["mom"] + g * h["damp1"], g))
                    self.ready[name] = [r or on for r, on in zip(ready, mom_on)]
                    direction = torch.where(h["nesterov"], g.addcmul(buf, h["mom"]), buf) if h["any_nesterov"] else buf
                    g = direction if all(mom_on) else torch.where(h["mom_nz"], direction, g)
                P.addcmul_(g, h["neg_lr"])


class FusedAdam(_Stepper):
    keys = ("lr", "betas", "eps", "weight_decay")

    def __init__(self, stacked, members, opts, decoupled: bool):
        super().__init__(stacked, members, opts)
        self.decoupled = decoupled
        self.m1: dict[str, Any] = {}
        self.m2: dict[str, Any] = {}
        self.t: dict[str, list[float]] = {}
        self.pull()

    def pull(self) -> None:
        import torch

        for name in self.groups:
            P = self.stacked[name]
            states = [o.state.get(self.members[i][name], {}) for i, o in enumerate(self.opts)]
            zero = torch.zeros_like(P[0])
            self.m1[name] = torch.stack([s["exp_avg"].detach().to(P) if "exp_avg" in s else zero for s in states])
            self.m2[name] = torch.stack([s["exp_avg_sq"].detach().to(P) if "exp_avg_sq" in s else zero for s in states])
            self.t[name] = [float(s["step"]) if "step" in s else 0.0 for s in states]

    def push(self) -> None:
        import torch

        scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        for name in self.groups:
            for i, o in enumerate(self.opts):
                p = self.members[i][name]
                if self.t[name][i] == 0:
                    o.state.pop(p, None)
                    continue
                o.state[p] = {"step": torch.tensor(self.t[name][i], dtype=scalar),
                              "exp_avg": self.m1[name][i].detach().clone(),
                              "exp_avg_sq": self.m2[name][i].detach().clone()}

    def derive(self, h: dict[str, Any], dtype: Any, values: list[tuple[Any, ...]]) -> dict[str, Any]:
        lr, wd, b1, b2, eps = h["lr"], h["weight_decay"], h["betas0"], h["betas1"], h["eps"]
        return {"lr": lr, "b1": b1, "b2": b2, "decay": (1 - lr * wd).to(dtype), "wd": wd.to(dtype),
                "one_b1": (1 - b1).to(dtype), "b2_": b2.to(dtype), "one_b2": (1 - b2).to(dtype),
                "eps": eps.to(dtype), "wd_on": any(v[3] != 0 for v in values)}

    def step(self) -> None:
        import torch

        hypers = self.hypers()
        with torch.no_grad():
            for name in self.groups:
                P = self.stacked[name]
                g = P.grad
                if g is None:
                    continue
                h = hypers[name]
                dt = P.dtype
                # torch keeps `step` in a float32 tensor (exact for integers below 2**24).
                self.t[name] = [t + 1 for t in self.t[name]]
                step = torch.tensor(self.t[name], dtype=torch.float64, device=P.device).view(h["lr"].shape)
                if h["wd_on"]:
                    if self.decoupled:
                        P.mul_(h["decay"])
                    else:
                        g = g.addcmul(P, h["wd"])
                m1, m2 = self.m1[name], self.m2[name]
                m1.lerp_(g, h["one_b1"])
                m2.mul_(h["b2_"]).addcmul_(g * h["one_b2"], g)
                bias2_sqrt = (1 - h["b2"] ** step) ** 0.5
                step_size = h["lr"] / (1 - h["b1"] ** step)
                denom = (m2.sqrt() / bias2_sqrt.to(dt)).add_(h["eps"])
                P.add_((m1 * (-step_size).to(dt)) / denom)


class PerMemberStep(_Stepper):
    """Each member's own torch optimizer over its own parameter views (any optimizer)."""

    def step(self) -> None:
        for i, o in enumerate(self.opts):
            for name in self.groups:
                P = self.stacked[name]
                self.members[i][name].grad = None if P.grad is None else P.grad[i]
            o.step()
        for i in range(self.F):
            for name in self.groups:
                self.members[i][name].grad = None


def make_stepper(stacked: dict[str, Any], members: list[dict[str, Any]], opts: list[Any]) -> _Stepper:
    """The fused form for these members' optimizers if one applies, else ``PerMemberStep``."""
    kind = fused_kind(opts)
    if kind == "SGD":
        return FusedSGD(stacked, members, opts)
    if kind in ("Adam", "AdamW"):
        return FusedAdam(stacked, members, opts, decoupled=kind == "AdamW")
    return PerMemberStep(stacked, members, opts)
