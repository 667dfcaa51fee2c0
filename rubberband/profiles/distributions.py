"""Latency distributions (constant, normal clipped at 0, lognormal, empirical) with vectorised samplers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from rubberband.errors import SpecError
from rubberband.schema import check_mapping, choice, number

Size = int | tuple[int, ...]


class Draws(Protocol):
    """The ``numpy.random.Generator`` methods a distribution samples with; the spot
    simulator's counter-based stand-in (``simulator.spot._Counter``) offers the same."""

    def normal(self, loc: float, scale: float, size: Size) -> np.ndarray: ...

    def lognormal(self, mean: float, sigma: float, size: Size) -> np.ndarray: ...

    def choice(self, a: np.ndarray, size: Size, replace: bool = True) -> np.ndarray: ...


class Distribution:
    """A non-negative latency distribution in seconds.

    Every distribution offers ``sample(rng, size)`` (a numpy array drawn from the given
    ``numpy.random.Generator``), ``mean`` and ``std`` (of the distribution as written), and
    ``with_moments(mean, std)``, the same family moved to other moments — how the model
    profile interpolates between profiled GPU counts.
    """

    kind = "abstract"

    def sample(self, rng: Draws, size: Size) -> np.ndarray:
        raise NotImplementedError

    @property
    def mean(self) -> float:
        raise NotImplementedError

    @property
    def std(self) -> float:
        raise NotImplementedError

    @property
    def is_constant(self) -> bool:
        return self.std == 0.0

    def from_standard_normal(self, z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray | None:
        """``sample``'s numbers computed from the standard normals that ``rng.standard_normal(size)``
        would draw from the same generator, when the family is such a transform (``None`` when
        it is not): what lets distributions of one family share one draw (``StageDraws.train_stats``)."""
        return None

    def with_moments(self, mean: float, std: float) -> Distribution:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class Constant(Distribution):
    """Always ``value`` seconds."""

    value: float
    kind = "constant"

    def __post_init__(self) -> None:
        number(self.value, "constant.value", minimum=0)

    def sample(self, rng: Draws, size: Size) -> np.ndarray:
        return np.full(size, float(self.value))

    @property
    def mean(self) -> float:
        return float(self.value)

    @property
    def std(self) -> float:
        return 0.0

    def with_moments(self, mean: float, std: float) -> Distribution:
        return Constant(mean) if std == 0 else Normal(mean, std)

    def to_dict(self) -> dict[str, Any]:
        return {"dist": "constant", "value": self.value}


@dataclass(frozen=True)
class Normal(Distribution):
    """Normal with ``mean`` and ``std``; samples below 0 are clipped to 0."""

    mu: float
    sigma: float
    kind = "normal"

    def __post_init__(self) -> None:
        number(self.mu, "normal.mean", minimum=0)
        number(self.sigma, "normal.std", minimum=0)

    def sample(self, rng: Draws, size: Size) -> np.ndarray:
        if self.sigma == 0:
            return np.full(size, float(self.mu))
        return np.asarray(np.maximum(rng.normal(self.mu, self.sigma, size), 0.0))

    def from_standard_normal(self, z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``max(mu + sigma * z, 0)``: numpy's ``Generator.normal(mu, sigma)`` is ``mu + sigma *
        standard_normal()`` in that order, so these are ``sample``'s numbers to the bit (and
        ``mu`` when ``sigma`` is 0)."""
        out = np.multiply(z, self.sigma, out=out)
        out += self.mu
        return np.asarray(np.maximum(out, 0.0, out=out))

    @property
    def mean(self) -> float:
        return float(self.mu)

    @property
    def std(self) -> float:
        return float(self.sigma)

    def with_moments(self, mean: float, std: float) -> Distribution:
        return Normal(mean, std)

    def to_dict(self) -> dict[str, Any]:
        return {"dist": "normal", "mean": self.mu, "std": self.sigma}


@dataclass(frozen=True)
class LogNormal(Distribution):
    """Log-normal given by the ``mean`` and ``std`` of the latency itself (not of its log)."""

    mu: float
    sigma: float
    kind = "lognormal"

    def __post_init__(self) -> None:
        number(self.mu, "lognormal.mean", positive=True)
        number(self.sigma, "lognormal.std", minimum=0)

    @property
    def _log_params(self) -> tuple[float, float]:
        s2 = math.log1p((self.sigma / self.mu) ** 2)
        return math.log(self.mu) - s2 / 2, math.sqrt(s2)

    def sample(self, rng: Draws, size: Size) -> np.ndarray:
        if self.sigma == 0:
            return np.full(size, float(self.mu))
        m, s = self._log_params
        return rng.lognormal(m, s, size)

    @property
    def mean(self) -> float:
        return float(self.mu)

    @property
    def std(self) -> float:
        return float(self.sigma)

    def with_moments(self, mean: float, std: float) -> Distribution:
        return LogNormal(mean, std)

    def to_dict(self) -> dict[str, Any]:
        return {"dist": "lognormal", "mean": self.mu, "std": self.sigma}


@dataclass(frozen=True)
class Empirical(Distribution):
    """Resamples measured ``samples`` with replacement."""

    samples: tuple[float, ...]
    kind = "empirical"

    def __post_init__(self) -> None:
        values = tuple(float(number(v, f"empirical.samples[{i}]", minimum=0)) for i, v in enumerate(self.samples))
        if not values:
            raise SpecError("empirical.samples: needs at least one measured sample")
        object.__setattr__(self, "samples", values)

    def sample(self, rng: Draws, size: Size) -> np.ndarray:
        return rng.choice(np.asarray(self.samples), size=size, replace=True)

    @property
    def mean(self) -> float:
        return float(np.mean(self.samples))

    @property
    def std(self) -> float:
        return float(np.std(self.samples))

    def with_moments(self, mean: float, std: float) -> Distribution:
        """Shift and scale the measured samples to the new moments (clipped at 0)."""
        own_std = self.std
        arr = np.asarray(self.samples)
        scaled = (arr - self.mean) * (std / own_std) + mean if own_std > 0 else np.full_like(arr, mean)
        return Empirical(tuple(np.maximum(scaled, 0.0)))

    def to_dict(self) -> dict[str, Any]:
        return {"dist": "empirical", "samples": list(self.samples)}


KINDS = ("constant", "normal", "lognormal", "empirical")


def parse_distribution(value: Any, where: str) -> Distribution:
    """Build a distribution from its YAML form; a bare number means ``constant``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Constant(float(number(value, where, minimum=0)))
    if not isinstance(value, dict) or "dist" not in value:
        raise SpecError(f"{where}: expected a distribution such as {{dist: normal, mean: 4.0, std: 0.4}}, got {value!r}")
    kind = choice(value["dist"], f"{where}.dist", KINDS)
    try:
        if kind == "constant":
            check_mapping(value, where, required=["dist", "value"])
            return Constant(number(value["value"], f"{where}.value", minimum=0))
        if kind == "normal":
            check_mapping(value, where, required=["dist", "mean", "std"])
            return Normal(number(value["mean"], f"{where}.mean", minimum=0), number(value["std"], f"{where}.std", minimum=0))
        if kind == "lognormal":
            check_mapping(value, where, required=["dist", "mean", "std"])
            return LogNormal(number(value["mean"], f"{where}.mean", positive=True), number(value["std"], f"{where}.std", minimum=0))
        check_mapping(value, where, required=["dist", "samples"])
        if not isinstance(value["samples"], list):
            raise SpecError(f"{where}.samples: expected a list of measured seconds")
        return Empirical(tuple(value["samples"]))
    except SpecError as exc:
        msg = str(exc)
        raise SpecError(msg if msg.startswith(where) else f"{where}: {msg}") from None
