"""Search spaces and search: the domains a config is drawn from, and how a bracket's configs are drawn.

A search space maps hyperparameter names to domains. It may be written three ways, all turned
into this module's own domains (``normalize``), so nothing here needs Ray installed:

* rubberband's constructors, named as Ray Tune's: ``uniform``, ``loguniform``, ``quniform``,
  ``qloguniform``, ``randint``, ``lograndint``, ``qrandint``, ``randn``, ``choice``,
  ``grid_search`` (``rubberband.uniform(0.1, 1)`` ...);
* Ray Tune's own objects (``ray.tune.uniform``, ``choice``, ``grid_search`` ...), recognised by
  their class, never by importing ``ray``;
* the YAML forms of an experiment file (``{loguniform: [1e-4, 1e-1]}``, ``{grid: [...]}``, a
  plain list for a uniform choice, a constant).

A mapping whose values hold domains is a nested space (as in Ray Tune): its configs are nested
the same way. Sampling follows Ray Tune's semantics (``randint``'s upper bound is excluded,
``q``-samplers round to a multiple of ``q``).

How a bracket's configs are drawn is a *search algorithm*, looked up by name in ``SEARCHERS``:

* ``random`` — every domain drawn independently from the seed; grid axes are crossed, in order,
  and cycled (Ray Tune's ``BasicVariantGenerator``);
* ``grid`` — the same, for a space that has grid axes; the trial count should be the grid's
  size times Ray Tune's ``num_samples`` (``check_search`` says so);
* ``optuna`` — Optuna's TPE, BOHB-style (Falkner et al., 2018): a bracket's configs are drawn
  from a TPE model fitted on the results reported so far — the metric of each config at the
  highest rung (iterations trained) that has at least ``d + 3`` results (BOHB's ``N_min + 2``
  with ``N_min = d + 1``, ``d`` the number of modelled hyperparameters) — and drawn at random
  while no rung has that many; as in BOHB, a third of the configs stay random draws. Domains TPE
  cannot model (``randn``, a foreign domain) are drawn at random beside it.

Every algorithm is deterministic given the seed (and the results it is fed).
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rubberband.errors import SpecError

Path = tuple[str, ...]


# --- domains ------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=True)
class Float:
    """A float in ``[low, high)``: uniform, or log-uniform (``log``); rounded to a multiple of ``q``."""

    low: float
    high: float
    log: bool = False
    q: float | None = None

    def __post_init__(self) -> None:
        _bounds(self.low, self.high, self.log, "loguniform" if self.log else "uniform")
        _step(self.q)

    def sample(self, rng: np.random.Generator) -> float:
        v = math.exp(rng.uniform(math.log(self.low), math.log(self.high))) if self.log else rng.uniform(self.low, self.high)
        return self.round(float(v))

    def round(self, v: float) -> float:
        return float(np.round(v / self.q) * self.q) if self.q else float(v)


@dataclass(frozen=True, eq=True)
class Integer:
    """An integer in ``[low, high)`` (Ray Tune's ``randint``): uniform, or log-uniform; rounded
    to a multiple of ``q``."""

    low: int
    high: int
    log: bool = False
    q: int | None = None

    def __post_init__(self) -> None:
        _bounds(self.low, self.high, self.log, "lograndint" if self.log else "randint")
        _step(self.q)

    def sample(self, rng: np.random.Generator) -> int:
        if self.log:
            v = int(math.floor(math.exp(rng.uniform(math.log(self.low), math.log(self.high)))))
        else:
            v = int(rng.integers(int(self.low), int(self.high)))
        return self.round(v)

    def round(self, v: float) -> int:
        return int(np.round(v / self.q) * self.q) if self.q else int(v)


@dataclass(frozen=True, eq=True)
class Normal:
    """A normal draw of ``mean`` and ``std`` (Ray Tune's ``randn``), rounded to a multiple of ``q``."""

    mean: float
    std: float
    q: float | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.std, (int, float)) and self.std > 0):
            raise SpecError(f"randn: std must be positive, got {self.std!r}")
        _step(self.q)

    def sample(self, rng: np.random.Generator) -> float:
        v = float(rng.normal(self.mean, self.std))
        return float(np.round(v / self.q) * self.q) if self.q else v


@dataclass(frozen=True, eq=True)
class Choice:
    """One of ``categories``, each equally likely."""

    categories: tuple[Any, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "categories", tuple(self.categories))
        if not self.categories:
            raise SpecError("choice: an empty list has nothing to choose from")

    def sample(self, rng: np.random.Generator) -> Any:
        return _plain(self.categories[int(rng.integers(len(self.categories)))])


@dataclass(frozen=True, eq=True)
class Grid:
    """Every one of ``values``: the grid's axes are crossed (Ray Tune's ``grid_search``)."""

    values: tuple[Any, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(self.values))
        if not self.values:
            raise SpecError("grid_search: an empty list has no grid point")


@dataclass(frozen=True, eq=False)
class Foreign:
    """A domain object of someone else's with ``sample(random_state=...)`` (drawn at random only)."""

    domain: Any

    def sample(self, rng: np.random.Generator) -> Any:
        value = self.domain.sample(random_state=rng)
        return _plain(value[0] if isinstance(value, list) and len(value) == 1 else value)


Domain = Float | Integer | Normal | Choice | Grid | Foreign


def _bounds(low: Any, high: Any, log: bool, name: str) -> None:
    for v in (low, high):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise SpecError(f"{name}: expected finite numbers [low, high], got {low!r}, {high!r}")
    if high <= low:
        raise SpecError(f"{name}: high {high:g} must exceed low {low:g}")
    if log and low <= 0:
        raise SpecError(f"{name}: low must be positive for a log scale, got {low:g}")


def _step(q: Any) -> None:
    if q is not None and (isinstance(q, bool) or not isinstance(q, (int, float)) or not q > 0):
        raise SpecError(f"q: the step must be a positive number, got {q!r}")


# --- constructors with Ray Tune's names ----------------------------------------------------------
def uniform(lower: float, upper: float) -> Float:
    """A float drawn uniformly from ``[lower, upper)`` (``ray.tune.uniform``)."""
    return Float(lower, upper)


def quniform(lower: float, upper: float, q: float) -> Float:
    """``uniform``, rounded to a multiple of ``q`` (``ray.tune.quniform``)."""
    return Float(lower, upper, q=q)


def loguniform(lower: float, upper: float) -> Float:
    """A float drawn uniformly in log space from ``[lower, upper)`` (``ray.tune.loguniform``)."""
    return Float(lower, upper, log=True)


def qloguniform(lower: float, upper: float, q: float) -> Float:
    """``loguniform``, rounded to a multiple of ``q`` (``ray.tune.qloguniform``)."""
    return Float(lower, upper, log=True, q=q)


def randint(lower: int, upper: int) -> Integer:
    """An integer drawn uniformly from ``[lower, upper)`` (``ray.tune.randint``)."""
    return Integer(lower, upper)


def qrandint(lower: int, upper: int, q: int = 1) -> Integer:
    """``randint`` rounded to a multiple of ``q`` (``ray.tune.qrandint``)."""
    return Integer(lower, upper, q=q)


def lograndint(lower: int, upper: int) -> Integer:
    """An integer drawn log-uniformly from ``[lower, upper)`` (``ray.tune.lograndint``)."""
    return Integer(lower, upper, log=True)


def randn(mean: float = 0.0, sd: float = 1.0) -> Normal:
    """A normal draw (``ray.tune.randn``)."""
    return Normal(mean, sd)


def choice(categories: Sequence[Any]) -> Choice:
    """One of ``categories`` (``ray.tune.choice``)."""
    return Choice(tuple(categories))


def grid_search(values: Sequence[Any]) -> Grid:
    """Every one of ``values``, crossed with the other grid axes (``ray.tune.grid_search``)."""
    return Grid(tuple(values))


# --- normalising: YAML forms, Ray Tune objects, rubberband domains -> (path, domain | constant) ----
YAML_SAMPLERS = ("choice", "grid", "uniform", "loguniform", "randint", "quniform", "qloguniform", "randn")
_OWN = (Float, Integer, Normal, Choice, Grid, Foreign)


@dataclass(frozen=True)
class SearchSpace:
    """A normalised search space: ``(path, domain)`` per hyperparameter, in the order written;
    a domain that is no ``Domain`` is a constant."""

    axes: tuple[tuple[Path, Any], ...]

    @property
    def grid(self) -> list[tuple[Path, Grid]]:
        return [(p, d) for p, d in self.axes if isinstance(d, Grid)]

    def grid_size(self) -> int:
        return math.prod(len(d.values) for _, d in self.grid)

    def names(self) -> list[str]:
        return [name(p) for p, _ in self.axes]

    def nest(self, flat: Mapping[Path, Any]) -> dict[str, Any]:
        """The config of one draw, nested as the space was written."""
        out: dict[str, Any] = {}
        for path, _ in self.axes:
            node = out
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = flat[path]
        return out


def name(path: Path) -> str:
    return "/".join(path)


def normalize(space: Mapping[str, Any] | SearchSpace | None, where: str = "search_space") -> SearchSpace:
    """The search space ``space`` as rubberband's own domains.

    Raises:
        SpecError: naming ``where.<key>`` for a malformed sampler or a domain that cannot be used.
    """
    if isinstance(space, SearchSpace):
        return space
    if space is None:
        return SearchSpace(())
    if not isinstance(space, Mapping):
        raise SpecError(f"{where}: expected a mapping of hyperparameter name to a domain, e.g. "
                        "{'lr': rubberband.loguniform(1e-4, 1e-1)}")
    axes: list[tuple[Path, Any]] = []
    _flatten(space, (), where, axes)
    return SearchSpace(tuple(axes))


def _flatten(space: Mapping[str, Any], prefix: Path, where: str, out: list[tuple[Path, Any]]) -> None:
    for key, value in space.items():
        path = (*prefix, str(key))
        here = f"{where}.{'.'.join(path)}"
        if isinstance(value, Mapping) and _holds_domains(value) and not _is_sampler(value):
            _flatten(value, path, where, out)
            continue
        try:
            out.append((path, _domain(value, here)))
        except SpecError as exc:
            msg = str(exc)
            raise SpecError(msg if msg.startswith(here) else f"{here}: {msg}") from None


def _is_sampler(value: Mapping[str, Any]) -> bool:
    return len(value) == 1 and next(iter(value)) in (*YAML_SAMPLERS, "grid_search")


def _holds_domains(value: Any) -> bool:
    if isinstance(value, Mapping):
        return _is_sampler(value) or any(_holds_domains(v) for v in value.values())
    return isinstance(value, _OWN) or _ray_domain(value) or (hasattr(value, "sample") and callable(value.sample))


def _ray_domain(value: Any) -> bool:
    return type(value).__module__.startswith("ray.tune")


def _domain(value: Any, where: str) -> Any:
    if isinstance(value, _OWN):
        return value
    if _ray_domain(value):
        return _from_ray(value, where)
    if hasattr(value, "sample") and callable(value.sample):
        return Foreign(value)
    if isinstance(value, list):
        return Choice(tuple(value)) if value else _raise(f"{where}: an empty list has nothing to choose from")
    if isinstance(value, Mapping):
        if len(value) != 1:
            raise SpecError(f"{where}: expected one sampler such as {{loguniform: [1e-4, 1e-1]}}")
        (kind, args), = value.items()
        return _from_yaml(str(kind), args, where)
    return value


def _raise(message: str) -> Any:
    raise SpecError(message)


def _from_yaml(kind: str, args: Any, where: str) -> Any:
    if kind == "grid_search":        # Ray Tune's grid_search is this mapping
        kind = "grid"
    if kind not in YAML_SAMPLERS:
        raise SpecError(f"{where}: unknown sampler {kind!r}; choose one of {', '.join(YAML_SAMPLERS)}")
    if not isinstance(args, (list, tuple)):
        raise SpecError(f"{where}.{kind}: expected a list, got {args!r}")
    if kind == "choice":
        return Choice(tuple(args))
    if kind == "grid":
        return Grid(tuple(args))
    if kind == "randn":
        if len(args) != 2:
            raise SpecError(f"{where}.randn: expected [mean, std]")
        return Normal(*args)
    if len(args) not in (2, 3) or (kind.startswith("q") and len(args) != 3):
        raise SpecError(f"{where}.{kind}: expected [low, high]" + (", q]" if kind.startswith("q") else "]"))
    if kind == "randint":
        return Integer(args[0], args[1])
    return Float(args[0], args[1], log="log" in kind, q=args[2] if kind.startswith("q") else None)


def _from_ray(domain: Any, where: str) -> Any:
    """A Ray Tune domain (``ray.tune.search.sample``) as rubberband's own, read by class name."""
    kind = type(domain).__name__
    sampler: Any = getattr(domain, "sampler", None)
    q = None
    if type(sampler).__name__ == "Quantized":
        q, sampler = sampler.q, sampler.sampler
    how = type(sampler).__name__
    if kind == "Categorical":
        return Choice(tuple(domain.categories))
    if kind in ("Float", "Integer") and how in ("_Uniform", "_LogUniform"):
        cls = Float if kind == "Float" else Integer
        return cls(domain.lower, domain.upper, log=how == "_LogUniform", q=q)
    if kind == "Float" and how == "_Normal":
        return Normal(sampler.mean, sampler.sd, q=q)
    if kind == "Function":
        raise SpecError(f"{where}: tune.sample_from draws from other keys of the config, which rubberband does not "
                        "resolve; give it a domain of its own (uniform, choice, ...)")
    if hasattr(domain, "sample") and callable(domain.sample):
        return Foreign(domain)
    raise SpecError(f"{where}: Ray Tune domain {kind} ({how}) is not supported; use uniform, loguniform, quniform, "
                    "randint, choice, randn or grid_search")


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


# --- search algorithms --------------------------------------------------------------------------
@dataclass(frozen=True)
class Observation:
    """A config's ``metric`` after it had trained ``iters`` iterations (one rung of a bracket)."""

    config: Mapping[str, Any]
    iters: int
    metric: float


Searcher = Callable[[SearchSpace, int, int, Sequence[Observation], str], list[dict[Path, Any]]]


def _random(space: SearchSpace, num: int, seed: int, observations: Sequence[Observation] = (),
            mode: str = "min") -> list[dict[Path, Any]]:
    """Independent draws; grid axes crossed in order and cycled."""
    rng = np.random.default_rng(seed)
    grid = space.grid
    points = list(itertools.product(*(d.values for _, d in grid))) or [()]
    out = []
    for i in range(num):
        flat: dict[Path, Any] = dict(zip((p for p, _ in grid), points[i % len(points)]))
        for path, domain in space.axes:
            if path not in flat:
                flat[path] = domain.sample(rng) if isinstance(domain, (Float, Integer, Normal, Choice, Foreign)) \
                    else domain
        out.append(flat)
    return out


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise SpecError("search: optuna needs Optuna; install it with `pip install 'rubberband[optuna]'` "
                        "(or `pip install optuna`), or use search: random") from None
    return optuna


def _tpe(space: SearchSpace, num: int, seed: int, observations: Sequence[Observation] = (),
         mode: str = "min") -> list[dict[Path, Any]]:
    """TPE fitted on the highest rung with enough results (module docstring); random before."""
    modelled = {p: d for p, d in space.axes if isinstance(d, (Float, Integer, Choice))}
    rung = _rung(observations, len(modelled) + 3)
    drawn = _random(space, num, seed)     # unmodelled axes (and everything, when TPE has too little)
    if rung is None or not modelled:
        return drawn
    optuna = _optuna()
    dists = {name(p): _distribution(optuna, d) for p, d in modelled.items()}
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        # BOHB's split: the best max(N_min, 15%) results are the "good" density, N_min = d + 1.
        n_min = len(modelled) + 1
        with warnings.catch_warnings():     # Optuna 4.9 deprecates `gamma` (to go in 6.0; the extra pins < 6)
            warnings.simplefilter("ignore", FutureWarning)
            sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=len(rung), constant_liar=False,
                                                 gamma=lambda n: min(n - 1, max(n_min, math.ceil(0.15 * n))))
        study = optuna.create_study(direction="minimize" if mode == "min" else "maximize", sampler=sampler)
        for obs in rung:
            params = {}
            for p, d in modelled.items():
                encoded = _encode(d, _lookup(obs.config, p))
                if encoded is None:
                    break
                params[name(p)] = encoded
            else:
                study.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=obs.metric))
        # BOHB draws each config from the model alone (no constant liar: a bracket's configs are
        # drawn before any of them reports) and a fraction of them at random, to keep exploring.
        at_random = np.random.default_rng([seed, 1]).random(len(drawn)) < RANDOM_FRACTION
        for flat, random in zip(drawn, at_random):
            if random:
                continue
            asked = study.ask(dists)
            for p, d in modelled.items():
                flat[p] = _decode(d, asked.params[name(p)])
    finally:
        optuna.logging.set_verbosity(verbosity)
    return drawn


RANDOM_FRACTION = 1 / 3      # BOHB's share of configs drawn at random once the model is fitted


def _rung(observations: Sequence[Observation], min_points: int) -> list[Observation] | None:
    """The results at the highest rung with at least ``min_points`` finite metrics, or ``None``."""
    by_iters: dict[int, list[Observation]] = {}
    for obs in observations:
        if isinstance(obs.metric, (int, float)) and math.isfinite(obs.metric):
            by_iters.setdefault(obs.iters, []).append(obs)
    for iters in sorted(by_iters, reverse=True):
        if len(by_iters[iters]) >= min_points:
            return by_iters[iters]
    return None


def _distribution(optuna: Any, d: Float | Integer | Choice) -> Any:
    if isinstance(d, Choice):
        return optuna.distributions.CategoricalDistribution(tuple(range(len(d.categories))))
    if isinstance(d, Integer):
        return optuna.distributions.IntDistribution(int(d.low), int(d.high) - 1, log=d.log)
    return optuna.distributions.FloatDistribution(float(d.low), float(d.high), log=d.log)


def _encode(d: Float | Integer | Choice, value: Any) -> Any:
    """An observed value as TPE's parameter (``None``: it is not in the domain)."""
    if isinstance(d, Choice):
        return next((i for i, c in enumerate(d.categories) if c == value), None)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    if isinstance(d, Integer):
        return int(min(max(value, d.low), d.high - 1))
    return float(min(max(value, d.low), d.high))


def _decode(d: Float | Integer | Choice, value: Any) -> Any:
    if isinstance(d, Choice):
        return _plain(d.categories[int(value)])
    return d.round(value)


def _lookup(config: Mapping[str, Any], path: Path) -> Any:
    node: Any = config
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


SEARCHERS: dict[str, Searcher] = {"random": _random, "grid": _random, "optuna": _tpe}


@dataclass(frozen=True)
class Search:
    """A search space and the algorithm that draws each bracket's configs (``SEARCHERS``)."""

    space: SearchSpace
    algorithm: str = "random"

    @classmethod
    def of(cls, space: Mapping[str, Any] | SearchSpace | Search | None, algorithm: str = "random") -> Search:
        if isinstance(space, Search):
            return space
        if algorithm not in SEARCHERS:
            from rubberband.schema import did_you_mean

            raise SpecError(f"search: unknown algorithm {algorithm!r}{did_you_mean(algorithm, SEARCHERS)}; "
                            f"choose one of {', '.join(SEARCHERS)}")
        return cls(normalize(space), algorithm)

    def configs(self, num: int, seed: int = 0, observations: Sequence[Observation] = (),
                mode: str = "min") -> list[dict[str, Any]]:
        """``num`` configs drawn with ``seed``, given the results reported so far."""
        if num < 1:
            raise SpecError(f"num_trials: expected at least one trial, got {num}")
        return [self.space.nest(flat) for flat in SEARCHERS[self.algorithm](self.space, num, seed, observations, mode)]


def sample_configs(search_space: Mapping[str, Any] | SearchSpace | Search, num: int, seed: int = 0,
                   observations: Sequence[Observation] = (), mode: str = "min") -> list[dict[str, Any]]:
    """Draw ``num`` configs with the run's seed (``Search.configs``; random search for a plain space).

    A value may be one of rubberband's domains (``rubberband.loguniform(1e-4, 1e-1)``), a Ray
    Tune domain (``tune.loguniform``, ``tune.choice([...])``, ``tune.grid_search([...])``), any
    object with a ``sample(random_state=...)`` method, a YAML sampler mapping
    (``{loguniform: [low, high]}``, ``{choice: [...]}``, ``{uniform: ...}``, ``{randint: ...}``,
    ``{quniform: [low, high, q]}``, ``{qloguniform: ...}``, ``{randn: [mean, std]}``,
    ``{grid: [...]}``), a plain list (a uniform choice), a constant, or a mapping of these (a
    nested space). Grid axes are enumerated in order and cycled; everything else is drawn
    independently per config.
    """
    return Search.of(search_space).configs(num, seed, observations, mode)


def check_search(space: Mapping[str, Any] | SearchSpace, algorithm: str, first_bracket_trials: int | None = None,
                 where: str = "search") -> list[str]:
    """Check that ``algorithm`` can search ``space``; return warnings.

    Raises:
        SpecError: ``grid`` with no grid axis, ``optuna`` with a grid axis or a foreign domain, or
            without Optuna installed.
    """
    s = Search.of(space, algorithm).space
    warnings = []
    if algorithm == "grid":
        if not s.grid:
            raise SpecError(f"{where}: grid has no grid axis to cross; give one with grid_search([...]) "
                            "(YAML: {grid: [...]}), or use search: random")
        size = s.grid_size()
        if first_bracket_trials is not None and first_bracket_trials % size:
            lo, hi = first_bracket_trials // size * size, (first_bracket_trials // size + 1) * size
            warnings.append(f"{where}: the grid has {size} points and the job starts {first_bracket_trials} trials, "
                            f"so some points are tried more often; start {lo or hi} or {hi} "
                            "(num_samples repeats the grid)")
    if algorithm == "optuna":
        for p, d in s.axes:
            if isinstance(d, Grid):
                raise SpecError(f"search_space.{'.'.join(p)}: search: optuna draws every config from its model, "
                                "so it takes no grid axis; use choice([...]), or search: grid")
        if importlib.util.find_spec("optuna") is None:
            _optuna()
    return warnings


# The words a width hyperparameter goes by, for the note that configs never change a trial's speed.
WIDTH_WORDS = ("hidden", "width", "channels", "d_model", "units", "filters", "embed")


def width_note(space: Mapping[str, Any] | SearchSpace, width_keys: Sequence[str] | None = None) -> str | None:
    """One line when the search space names a model width: the profile gives one speed per GPU
    count, whatever the config, so a wider config is not modelled as slower (DESIGN §3)."""
    s = normalize(space)
    keys = set(width_keys or ())
    named = [name(p) for p, d in s.axes if isinstance(d, _OWN) and
             (p[-1] in keys or name(p) in keys or (not keys and any(w in p[-1].lower() for w in WIDTH_WORDS)))]
    if not named:
        return None
    return (f"search space: {', '.join(named)} set{'s' if len(named) == 1 else ''} the model's width, but configs never "
            "change a trial's speed in the model: every trial runs at the profile's seconds per iteration; "
            "profile the widest config (or tune widths in separate experiments)")
