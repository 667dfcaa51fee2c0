"""Experiment files: the YAML a user writes, checked against a schema and turned into values.

This module sits at the edge of the pure core: it ties a spec, a model profile and a cloud
catalog together, so it imports both `spec` and `profiles` (which never import it)."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rubberband.errors import RubberbandWarning, SpecError
from rubberband.profiles.by_gpu import model_of
from rubberband.profiles.cloud import OVERRIDABLE, CloudCatalog, CloudProfile, Market
from rubberband.profiles.model import ModelProfile
from rubberband.profiles.spot import resolve_trace_file
from rubberband.schema import check_mapping, choice, did_you_mean, integer, load_yaml, number
from rubberband.spec.experiment import ExperimentSpec, Surrogate, search_algorithm
from rubberband.units import parse_duration

POLICIES = ("optimal", "greedy", "static", "naive-elastic")
SAMPLERS = ("choice", "grid", "uniform", "loguniform", "randint", "quniform", "qloguniform", "randn")

_TOP_OPTIONAL = [
    "name", "description", "sha", "stages", "hyperband", "deadline", "policy", "samples", "seed",
    "confidence", "trainer", "search_space", "metric", "mode", "global_batch_size", "cluster", "max_failures",
    "search",
    "surrogate",
    "time_attr",
]
_TRAINER = re.compile(r"^[A-Za-z0-9_./-]+(\.py)?(:[A-Za-z_][A-Za-z0-9_]*)?$")


@dataclass(frozen=True)
class Experiment:
    """A loaded experiment file: what to tune, on what, by when, and how to train it."""

    name: str
    spec: ExperimentSpec
    model: ModelProfile
    catalog: CloudCatalog
    instance_type: str
    market: Market | str = Market.ON_DEMAND          # or "auto": the planner chooses per stage
    cloud_overrides: dict[str, Any] = field(default_factory=dict)
    deadline_s: float | None = None
    policy: str = "optimal"
    samples: int = 1000
    seed: int = 0
    confidence: float | None = None
    trainer: str | None = None
    search_space: dict[str, Any] = field(default_factory=dict)
    metric: str = "loss"
    mode: str = "min"
    global_batch_size: int | None = None
    path: str | None = None
    sha: dict[str, int] | None = None
    cluster: str | None = None      # a Ray cluster YAML for `--provider aws`
    models: dict[str, ModelProfile] = field(default_factory=dict)   # GPU model -> its profile, when several
    max_failures: int = 0           # retries of a trial whose own code fails (Ray Tune's FailureConfig)
    search: str = "random"          # how each bracket's configs are drawn (spec/experiment.py: SEARCH_ALGORITHMS)
    surrogate: Surrogate | None = None   # tune a μP copy width_ratio times narrower (issue #24)
    # With `surrogate:`, ``spec`` ends in the target stage, ``model`` (the file's own
    # `model_profile`) is the full-width target's and this the surrogate's (`surrogate.model_profile`).
    surrogate_model: ModelProfile | None = None
    time_attr: str | None = None    # the metric that counts a function trainable's iterations (None: its reports)

    def job_models(self) -> tuple[ModelProfile | dict[str, ModelProfile], ModelProfile | dict[str, ModelProfile] | None]:
        """``(model, target_model)`` for ``simulate``/``compile_plan``: the tuning stages' profile
        and the target stage's (``None`` without a target stage).

        Raises:
            SpecError: naming ``surrogate.model_profile`` when the job has a target stage but no
                surrogate profile to tune by.
        """
        if self.spec.target_stage is None:
            return self.model_for_planning, None
        if self.surrogate_model is None:
            raise SpecError("surrogate.model_profile: planning the surrogate stages needs the surrogate's own profile; "
                            "measure it (`rubberband profile` at width / width_ratio) and name it here, or see "
                            "`rubberband whatif --surrogate-ratio` for an approximation")
        return self.surrogate_model, self.model_for_planning

    @property
    def model_for_planning(self) -> ModelProfile | dict[str, ModelProfile]:
        """What the planner weighs types by: one profile, or one per GPU model."""
        return dict(self.models) if self.models else self.model

    def spec_with_trials(self, num_trials: int) -> ExperimentSpec:
        """The same SHA job started with another number of trials (what-if sweeps)."""
        if not self.sha:
            raise SpecError("--trials: sweeping the number of trials needs an experiment defined with `sha:`")
        spec = ExperimentSpec.sha(num_trials, self.sha["min_iters"], self.sha["max_iters"], self.sha.get("eta", 2))
        return spec if self.surrogate is None else self.surrogate.job(spec)

    @property
    def auto_instance_type(self) -> bool:
        return self.instance_type == "auto"

    @property
    def cloud(self) -> CloudProfile:
        """The cloud profile of the chosen instance type (the first type when ``auto``)."""
        name = self.catalog.instance_types[0] if self.auto_instance_type else self.instance_type
        return self.cloud_for(name)

    def cloud_for(self, instance_type: str) -> CloudProfile:
        """The cloud profile of ``instance_type`` with this experiment's overrides applied."""
        return self.catalog.get(instance_type, self.type_market, self.cloud_overrides)

    @property
    def type_market(self) -> Market:
        """The market an instance type is priced at: on-demand when the planner chooses (``auto``)."""
        return self.market if isinstance(self.market, Market) else Market.ON_DEMAND


def _resolve(path_value: Any, base: Path, where: str) -> Path:
    if not isinstance(path_value, str) or not path_value.strip():
        raise SpecError(f"{where}: expected a path to a YAML file")
    path = Path(path_value)
    if not path.is_absolute():
        path = (base / path).resolve()
    if not path.is_file():
        raise SpecError(f"{where}: no such file {path_value!r} (paths are relative to the experiment file)")
    return path


def _parse_spec(data: dict, where: str) -> ExperimentSpec:
    given = [k for k in ("sha", "stages", "hyperband") if k in data]
    if len(given) != 1:
        raise SpecError(
            f"{where}: give exactly one of `sha:`, `stages:` or `hyperband:` to define the job"
            + (f" (found {', '.join(given)})" if given else "")
        )
    kind = given[0]
    if kind == "sha":
        sha = check_mapping(data["sha"], "sha", required=["num_trials", "min_iters", "max_iters"], optional=["eta"])
        return ExperimentSpec.sha(
            integer(sha["num_trials"], "sha.num_trials"), integer(sha["min_iters"], "sha.min_iters"),
            integer(sha["max_iters"], "sha.max_iters"), _eta(sha.get("eta", 2), "sha.eta"),
        )
    if kind == "hyperband":
        hb = check_mapping(data["hyperband"], "hyperband", required=["min_iters", "max_iters"], optional=["eta"])
        brackets = ExperimentSpec.hyperband(
            integer(hb["min_iters"], "hyperband.min_iters"), integer(hb["max_iters"], "hyperband.max_iters"),
            _eta(hb.get("eta", 3), "hyperband.eta"),
        )
        return ExperimentSpec.chain(brackets)
    stages = data["stages"]
    if not isinstance(stages, list) or not stages:
        raise SpecError("stages: expected a non-empty list such as [[32, 1], [10, 3]] or [{num_trials: 32, iters: 1}]")
    spec = ExperimentSpec()
    for i, stage in enumerate(stages):
        if isinstance(stage, dict):
            stage = check_mapping(stage, f"stages[{i}]", required=["num_trials", "iters"])
            n, k = stage["num_trials"], stage["iters"]
        elif isinstance(stage, list) and len(stage) == 2:
            n, k = stage
        else:
            raise SpecError(f"stages[{i}]: expected [num_trials, iters] or {{num_trials: N, iters: K}}, got {stage!r}")
        spec = spec.add_stage(integer(n, f"stages[{i}].num_trials"), integer(k, f"stages[{i}].iters"))
    return spec


def _eta(value: Any, where: str) -> int:
    eta = integer(value, where, minimum=-(2**63))
    if eta < 2:
        raise SpecError(f"{where}: must be at least 2 (an eta of 1 never stops a trial), got {value!r}")
    return eta


def _parse_search_space(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SpecError("search_space: expected a mapping of hyperparameter name to a list or {loguniform: [low, high]}")
    for name, dom in value.items():
        where = f"search_space.{name}"
        if isinstance(dom, list):
            if not dom:
                raise SpecError(f"{where}: an empty list has nothing to choose from")
        elif isinstance(dom, dict):
            if len(dom) != 1:
                raise SpecError(f"{where}: expected one sampler such as {{loguniform: [1e-4, 1e-1]}}, got {dom!r}")
            (kind, args), = dom.items()
            choice(kind, f"{where}", SAMPLERS)
            if kind in ("choice", "grid"):
                if not isinstance(args, list) or not args:
                    raise SpecError(f"{where}.{kind}: expected a non-empty list")
            elif kind == "randn":
                if not isinstance(args, list) or len(args) != 2:
                    raise SpecError(f"{where}.randn: expected [mean, std]")
            else:
                if not isinstance(args, list) or len(args) not in (2, 3):
                    raise SpecError(f"{where}.{kind}: expected [low, high] (and a step q for q-samplers)")
                low, high = (number(a, f"{where}.{kind}") for a in args[:2])
                if high <= low:
                    raise SpecError(f"{where}.{kind}: high {high:g} must exceed low {low:g}")
                if kind in ("loguniform", "qloguniform") and low <= 0:
                    raise SpecError(f"{where}.{kind}: low must be positive for a log scale, got {low:g}")
        elif not isinstance(dom, (int, float, str, bool)):
            raise SpecError(f"{where}: expected a constant, a list or a sampler mapping")
    return dict(value)


def load_experiment(path: str | Path | Mapping[str, Any], *, model_profile: str | Path | None = None,
                    cloud_overrides: str | Path | None = None) -> Experiment:
    """Load and validate an experiment YAML file.

    Args:
        path: the experiment YAML, or its mapping built in Python (``rubberband.Tuner``: paths
            in it are relative to the working directory).
        model_profile: a model profile YAML used instead of the experiment's ``model_profile``
            (e.g. one ``rubberband profile`` measured on this machine).
        cloud_overrides: a YAML mapping of cloud-profile overrides (e.g. the ``.cloud.yaml``
            ``rubberband profile`` writes) applied over the experiment's ``cloud.overrides``;
            its keys replace the experiment's.

    Raises:
        SpecError: a one-line message naming the field, for any malformed input.
    """
    if isinstance(path, Mapping):
        data, base, where = dict(path), Path.cwd(), None
    else:
        data, base, where = load_yaml(Path(path), "experiment"), Path(path).parent, str(path)
    with warnings.catch_warnings():
        if model_profile is not None:   # the experiment's own profile is replaced: its doubts are not this job's
            warnings.simplefilter("ignore", RubberbandWarning)
        exp = experiment_from_dict(data, base=base, path=where)
    return with_measured(exp, model_profile, cloud_overrides)


def with_measured(exp: Experiment, model_profile: str | Path | None = None,
                  cloud_overrides: str | Path | None = None) -> Experiment:
    """``exp`` with another model profile file and extra cloud overrides (see ``load_experiment``)."""
    changes: dict[str, Any] = {}
    if model_profile is not None:
        changes["model"] = ModelProfile.from_dict(load_yaml(model_profile, "--model-profile"), where=str(model_profile))
        changes["models"] = {}      # a measured profile replaces the experiment's, one or several
    if cloud_overrides is not None:
        extra = check_mapping(load_yaml(cloud_overrides, "--cloud-overrides"), str(cloud_overrides), optional=OVERRIDABLE)
        changes["cloud_overrides"] = {**exp.cloud_overrides, **extra}
    if not changes:
        return exp
    measured = replace(exp, **changes)
    if "cloud_overrides" in changes:
        try:   # the experiment alone was valid, so whatever fails now is the file's
            for name in (measured.catalog.instance_types if measured.auto_instance_type else [measured.instance_type]):
                measured.cloud_for(name)
        except SpecError as exc:
            raise SpecError(f"--cloud-overrides {cloud_overrides}: {exc}") from None
    return measured


def experiment_from_dict(data: dict, base: str | Path = ".", path: str | None = None) -> Experiment:
    """Build an ``Experiment`` from its YAML mapping; relative paths resolve against ``base``."""
    base = Path(base)
    data = check_mapping(data, "experiment", required=["model_profile", "cloud"], optional=_TOP_OPTIONAL)
    spec = _parse_spec(data, "experiment")

    cloud = check_mapping(data["cloud"], "cloud", required=["profile", "instance_type"], optional=["market", "overrides"])
    catalog = CloudCatalog.load(_resolve(cloud["profile"], base, "cloud.profile"))
    instance_type = str(cloud["instance_type"])
    models = _load_models(data["model_profile"], base, catalog)
    model = _model_for_type(models, catalog, instance_type)
    market_name = choice(cloud.get("market", "on-demand"), "cloud.market", [m.value for m in Market] + ["auto"])
    market = "auto" if market_name == "auto" else Market(market_name)
    if market == "auto" and instance_type in catalog.types and catalog.types[instance_type].get("spot_price_usd_per_hour") is None \
            and "spot_price_usd_per_hour" not in (cloud.get("overrides") or {}):
        raise SpecError(f"cloud.market: auto weighs spot against on-demand but {instance_type} has no spot price; "
                        "set market: on-demand, or give cloud.overrides.spot_price_usd_per_hour")
    overrides = cloud.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise SpecError("cloud.overrides: expected a mapping such as {init_latency_s: {dist: constant, value: 15}}")
    if "spot" in overrides:   # a trace file named here sits beside the experiment
        overrides = {**overrides, "spot": resolve_trace_file(overrides["spot"], base)}

    exp = Experiment(
        name=str(data.get("name") or (Path(path).stem if path else "experiment")),
        spec=spec,
        model=model,
        catalog=catalog,
        instance_type=instance_type,
        market=market,
        cloud_overrides=dict(overrides),
        deadline_s=parse_duration(data["deadline"], "deadline") if data.get("deadline") is not None else None,
        policy=choice(data.get("policy", "optimal"), "policy", POLICIES),
        samples=integer(data.get("samples", 1000), "samples"),
        seed=integer(data.get("seed", 0), "seed", minimum=0),
        confidence=_confidence(data.get("confidence")),
        trainer=_trainer(data.get("trainer"), base),
        search_space=_parse_search_space(data.get("search_space")),
        metric=str(data.get("metric", "loss")),
        mode=choice(data.get("mode", "min"), "mode", ["min", "max"]),
        global_batch_size=integer(data["global_batch_size"], "global_batch_size") if data.get("global_batch_size") is not None else None,
        path=path,
        sha=dict(data["sha"]) if "sha" in data else None,
        cluster=str(_resolve(data["cluster"], base, "cluster")) if data.get("cluster") is not None else None,
        models={str(k): v for k, v in models.items() if k is not None},
        max_failures=_max_failures(data.get("max_failures", 0)),
        search=search_algorithm(data.get("search"), "search"),
        time_attr=_time_attr(data.get("time_attr")),
    )
    _check_search(exp)
    if data.get("surrogate") is not None:
        surrogate = Surrogate.from_dict(data["surrogate"], exp.search_space)
        exp = replace(exp, surrogate=surrogate, spec=surrogate.job(spec),
                      surrogate_model=ModelProfile.load(_resolve(surrogate.model_profile, base, "surrogate.model_profile"))
                      if surrogate.model_profile is not None else None)
    if not exp.auto_instance_type:
        exp.cloud_for(instance_type)  # unknown type -> did-you-mean error now, not at plan time
    else:
        for name in catalog.instance_types:
            exp.cloud_for(name)
    return exp


def measured_gpu_model(model: ModelProfile, catalog: CloudCatalog) -> str | None:
    """The GPU model a profile was measured on, where it says (``measured_on.gpu_model``, or
    the catalog's entry for ``measured_on.instance_type``)."""
    measured = model.measured_on or {}
    gpu = measured.get("gpu_model") or catalog.types.get(measured.get("instance_type", ""), {}).get("gpu_model")
    return str(gpu) if gpu is not None else None


def _load_models(value: Any, base: Path, catalog: CloudCatalog) -> dict[str | None, ModelProfile]:
    """``model_profile:`` as ``{GPU model: profile}``: one profile (a path or an inline mapping,
    keyed ``None``), or a mapping of GPU model to a profile's path (or inline mapping), one per
    GPU model (issue #14: the planner compares types across GPU models by their own curves)."""
    if not isinstance(value, dict):
        return {None: ModelProfile.load(_resolve(value, base, "model_profile"))}
    if "iter_latency_s" in value:       # an inline profile, not a mapping of GPU models
        return {None: ModelProfile.from_dict(value, "model_profile")}
    if not value:
        raise SpecError("model_profile: expected a profile's path, or a mapping of GPU model to profile path "
                        "such as {V100: profiles/a.yaml, A10G: profiles/b.yaml}")
    known = sorted({str(e["gpu_model"]) for e in catalog.types.values() if e.get("gpu_model") is not None})
    models: dict[str | None, ModelProfile] = {}
    seen: dict[str, str] = {}
    for gpu, entry in value.items():
        where = f"model_profile.{gpu}"
        gpu = str(gpu)
        if gpu.lower() in seen:
            raise SpecError(f"{where}: {seen[gpu.lower()]} and {gpu} name one GPU model; keep one profile per GPU model")
        seen[gpu.lower()] = gpu
        canonical = {k.lower(): k for k in known}
        if gpu.lower() not in canonical:
            raise SpecError(f"{where}: {gpu!r} is no GPU model of {catalog.path or catalog.region}"
                            f"{did_you_mean(gpu, known)}; its types have {', '.join(known)}")
        gpu = canonical[gpu.lower()]      # spelled as the catalog does
        model = (ModelProfile.from_dict(entry, where) if isinstance(entry, dict)
                 else ModelProfile.load(_resolve(entry, base, where)))
        measured = measured_gpu_model(model, catalog)
        if measured is not None and measured != gpu:
            raise SpecError(f"{where}: profile {model.name!r} was measured on {measured}, not {gpu}; "
                            f"list it under {measured}")
        if measured is None:    # the key says which GPUs it was measured on: the planner needs to know
            model = model.replace(measured_on={**model.measured_on, "gpu_model": gpu})
        models[gpu] = model
    return models


def _model_for_type(models: dict[str | None, ModelProfile], catalog: CloudCatalog, instance_type: str) -> ModelProfile:
    """The profile an experiment's own instance type runs by (the first one under ``auto``)."""
    if None in models or instance_type == "auto" or instance_type not in catalog.types:
        return next(iter(models.values()))
    typed = {gpu: m for gpu, m in models.items() if gpu is not None}      # None is not in models here
    return model_of(typed, catalog.get(instance_type), "cloud.instance_type")


def _confidence(value: Any) -> float | None:
    if value is None:
        return None
    conf = number(value, "confidence")
    if not 0 < conf < 1:
        raise SpecError(f"confidence: must be between 0 and 1 (e.g. 0.9 for P(JCT <= deadline) >= 90%), got {value!r}")
    return conf


def _check_search(exp: Experiment) -> None:
    """The search algorithm can search the space (``search_space.check_search``); its doubts are warnings."""
    from rubberband.executor.search_space import check_search

    for doubt in check_search(exp.search_space, exp.search, None if len(exp.spec.bracket_starts) > 1
                              else exp.spec.stages[0].num_trials):
        warnings.warn(doubt, RubberbandWarning, stacklevel=3)


def _time_attr(value: Any) -> str | None:
    """``time_attr``: the metric a function trainable reports its iteration count under
    (Ray Tune's ``time_attr``, e.g. ``training_iteration`` or ``epoch``; ``function_api``).

    Raises:
        SpecError: one line naming ``time_attr`` when it is not a metric name.
    """
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"time_attr: expected the name of the metric that counts a trial's iterations "
                        f"(e.g. training_iteration or epoch), got {value!r}")
    return value.strip()


def _max_failures(value: Any) -> int:
    """Retries of a failing trial: the scheduler restarts a trial at most MAX_TRIAL_RESTARTS times."""
    from rubberband.scheduler import MAX_TRIAL_RESTARTS

    n = integer(value, "max_failures", minimum=0)
    if n > MAX_TRIAL_RESTARTS:
        raise SpecError(f"max_failures: at most {MAX_TRIAL_RESTARTS} retries of a trial, got {n}")
    return n


def _trainer(value: Any, base: Path) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _TRAINER.match(value):
        raise SpecError(f"trainer: expected `package.module:Name` or `path/to/file.py:Name`, got {value!r}")
    file_part = value.split(":")[0]
    if file_part.endswith(".py"):
        file_path = Path(file_part)
        if not file_path.is_absolute():
            file_path = base / file_path
        if not file_path.is_file():
            raise SpecError(f"trainer: no such file {file_part!r} (paths are relative to the experiment file)")
        return f"{file_path.resolve()}:{value.split(':')[1]}" if ":" in value else str(file_path.resolve())
    return value
