"""Sample trial configs from a search space: Ray Tune domains, YAML samplers or plain lists."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from rubberband.errors import SpecError


def sample_configs(search_space: Mapping[str, Any], num: int, seed: int = 0) -> list[dict[str, Any]]:
    """Draw ``num`` configs with the run's seed.

    A value may be a Ray Tune domain (``tune.loguniform(1e-4, 1e-1)``, ``tune.choice([...])``:
    anything with a ``sample(random_state=...)`` method), a YAML sampler mapping
    (``{loguniform: [low, high]}``, ``{choice: [...]}``, ``{uniform: ...}``, ``{randint: ...}``,
    ``{quniform: [low, high, q]}``, ``{qloguniform: ...}``, ``{randn: [mean, std]}``,
    ``{grid: [...]}``), a plain list (a uniform choice), or a constant. Grid axes are
    enumerated in order and cycled; everything else is drawn independently per config.
    """
    if num < 1:
        raise SpecError(f"num_trials: expected at least one trial, got {num}")
    rng = np.random.default_rng(seed)
    grid_axes = {k: v["grid"] for k, v in search_space.items() if isinstance(v, Mapping) and "grid" in v}
    grid = list(itertools.product(*grid_axes.values())) or [()]
    configs = []
    for i in range(num):
        config: dict[str, Any] = dict(zip(grid_axes, grid[i % len(grid)]))
        for name, domain in search_space.items():
            if name in grid_axes:
                continue
            config[name] = _sample(name, domain, rng)
        configs.append(config)
    return configs


def _sample(name: str, domain: Any, rng: np.random.Generator) -> Any:
    if hasattr(domain, "sample") and callable(domain.sample):   # Ray Tune domain
        value = domain.sample(random_state=rng)
        return value[0] if isinstance(value, list) and len(value) == 1 else _plain(value)
    if isinstance(domain, list):
        return _plain(domain[int(rng.integers(len(domain)))])
    if isinstance(domain, Mapping):
        if len(domain) != 1:
            raise SpecError(f"search_space.{name}: expected one sampler such as {{loguniform: [1e-4, 1e-1]}}")
        (kind, args), = domain.items()
        if kind == "choice":
            return _plain(args[int(rng.integers(len(args)))])
        if kind == "uniform":
            return float(rng.uniform(args[0], args[1]))
        if kind == "loguniform":
            return float(math.exp(rng.uniform(math.log(args[0]), math.log(args[1]))))
        if kind == "randint":
            return int(rng.integers(int(args[0]), int(args[1])))
        if kind == "quniform":
            return float(np.round(rng.uniform(args[0], args[1]) / args[2]) * args[2])
        if kind == "qloguniform":
            return float(np.round(math.exp(rng.uniform(math.log(args[0]), math.log(args[1]))) / args[2]) * args[2])
        if kind == "randn":
            return float(rng.normal(args[0], args[1]))
        raise SpecError(f"search_space.{name}: unknown sampler {kind!r}")
    return domain


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value
