"""`rubberband.Tuner`: the Python entry in Ray Tune's habits — plan, print the plan, run it, return results.

::

    import rubberband as rb
    from ray import tune                      # or rubberband's own: rb.loguniform, rb.choice, ...

    tuner = rb.Tuner(train_fn, param_space={"lr": tune.loguniform(1e-3, 1e-1)},
                     tune_config=rb.TuneConfig(metric="val_loss", mode="min", num_samples=16,
                                               sha=dict(min_iters=2, max_iters=16, eta=2), deadline="20m"),
                     cloud=rb.Cloud(provider="local", profile="profiles/tune_function_local.yaml",
                                    cloud_profile="cloud_profiles/local/local.yaml", instance_type="local.2gpu"))
    results = tuner.fit()
    best = results.get_best_result()          # .config, .metrics, .checkpoint, .path

``fit`` builds the experiment an experiment file would give (``TuneConfig`` and ``Cloud`` are
its fields) and resolves it as every command does (``rubberband.request.resolve``), plans it
(``plan_request``), prints the plan as ``rubberband run`` does, and runs it through the
library's run path: ``rubberband.executor.run.execute`` on ``local`` and ``aws``, or a
rehearsal in virtual time on ``sim`` (``rubberband.executor.rehearse.rehearse``: the trainer
is not run there, its metrics are synthetic learning curves; the configs are drawn from the
search space as in a run).
"""

from __future__ import annotations

import importlib.util
import io
import math
import os
import sys
import sysconfig
import tarfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rubberband.errors import SpecError

# Keys of a run's per-stage history that are bookkeeping, not metrics the trainer reported.
_HISTORY_KEYS = {"stage", "iters", "gpus", "step", "instances", "trials_per_gpu", "gpu_ids", "restarts", "redone",
                 "start_s", "end_s", "failed", "instance_type", "market"}


@dataclass(frozen=True)
class TuneConfig:
    """How to tune (Ray Tune's ``TuneConfig``, with a deadline and a budget).

    Args:
        metric, mode: what ranks trials (``mode`` ``"min"`` or ``"max"``); ``metric`` defaults to
            a ``Trainer`` class's own, and a function trainable must name it.
        num_samples: trials to start, as Ray Tune's: each grid point (``grid_search`` axes crossed)
            is repeated ``num_samples`` times. With ``sha`` it is the first stage's trial count.
        sha: ``dict(min_iters=..., max_iters=..., eta=2)`` (and ``num_trials`` instead of
            ``num_samples``): successive halving. ``hyperband``: ``dict(min_iters, max_iters, eta=3)``,
            which sizes its brackets itself. ``stages``: ``[(num_trials, iters), ...]``. One of the three.
        deadline: seconds or ``"20m"``; ``budget``: dollars, a hard cap (with no deadline the
            plan is the fastest within it).
        search: ``"random"`` (default), ``"grid"`` or ``"optuna"`` (TPE fed by the completed rungs).
        seed, samples, policy, confidence, max_failures: as an experiment file's.
        surrogate: an experiment file's ``surrogate:`` (DESIGN §4.6), e.g. ``dict(width_ratio=8,
            transfer=["lr"], model_profile="profiles/w16.yaml")``: tune a μP copy that many times
            narrower (a ``Trainer`` class with ``width_keys``), then train the winner at full width.
    """

    metric: str | None = None
    mode: str = "min"
    num_samples: int | None = None
    sha: Mapping[str, int] | None = None
    hyperband: Mapping[str, int] | None = None
    stages: Sequence[Sequence[int]] | None = None
    deadline: float | str | None = None
    budget: float | None = None
    search: str = "random"
    seed: int = 0
    samples: int | None = None
    policy: str | None = None
    confidence: float | None = None
    max_failures: int = 0
    surrogate: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Cloud:
    """Where to run, and the profiles that plan it.

    Args:
        provider: ``"sim"`` (a rehearsal in virtual time), ``"local"`` (Ray nodes on this machine)
            or ``"aws"``.
        profile: the model profile (a YAML path, a ``ModelProfile`` or its mapping) — what
            ``rubberband profile`` measures.
        cloud_profile: the cloud profile's YAML (a region file such as
            ``cloud_profiles/aws/us-east-1.yaml``).
        instance_type: one of its types, or ``"auto"`` for the cheapest.
        market: ``"on-demand"``, ``"spot"`` or ``"auto"``. ``overrides``: cloud-profile overrides.
        cluster: ``aws``: the Ray cluster YAML. ``runs_dir``: where runs write (``local``, ``aws``).
    """

    provider: str = "sim"
    profile: Any = None
    cloud_profile: str | os.PathLike[str] | None = None
    instance_type: str = "auto"
    market: str = "on-demand"
    overrides: Mapping[str, Any] | None = None
    cluster: str | os.PathLike[str] | None = None
    runs_dir: str | os.PathLike[str] = field(default_factory=lambda: os.environ.get("RUBBERBAND_RUNS_DIR", "runs"))


@dataclass(frozen=True)
class Result:
    """One trial's outcome (Ray Tune's ``Result``): its ``config``, the ``metrics`` it reported
    last, its latest ``checkpoint`` (a ``rubberband.Checkpoint``, ``None`` when it has none or
    the run was a rehearsal), ``path`` (its directory in the run), ``error`` (why it failed)."""

    trial_id: str
    config: dict[str, Any]
    metrics: dict[str, Any]
    path: str | None
    error: str | None = None
    _blob: str | None = field(default=None, repr=False)     # the run's checkpoint file for this trial

    @property
    def checkpoint(self) -> Any:
        """The trial's latest checkpoint as a directory (unpacked under ``path`` on first use)."""
        if self._blob is None or self.path is None or not os.path.isfile(self._blob):
            return None
        from rubberband import function_api

        dest = Path(self.path) / "checkpoint"
        if not dest.is_dir():
            blob = Path(self._blob).read_bytes()
            tmp = dest.with_name("checkpoint.tmp")
            tmp.mkdir(parents=True, exist_ok=True)
            if blob.startswith(function_api.STATE_MAGIC):        # a function trainable's reported files
                files = function_api.unpack_state(blob).files
                if files is None:
                    return None
                with tarfile.open(fileobj=io.BytesIO(files), mode="r") as tar:
                    tar.extractall(tmp, filter="data")
            else:                                                # a Trainer class's state, as saved
                (tmp / "checkpoint.pt").write_bytes(blob)
            tmp.replace(dest)
        return function_api.Checkpoint.from_directory(dest)


class ResultGrid:
    """Every trial's ``Result`` (Ray Tune's ``ResultGrid``): iterate it, index it, ``len`` it.

    ``run`` is the run's own report (``RunResult``: predicted vs actual JCT and cost, the
    ledger, every stage) and ``experiment_path`` its directory (``None`` for a rehearsal).
    """

    def __init__(self, results: list[Result], run: Any, metric: str, mode: str, best: str | None):
        self._results, self.run, self._metric, self._mode, self._best = results, run, metric, mode, best
        self.experiment_path: str | None = run.run_dir or None

    def __iter__(self) -> Iterator[Result]:
        return iter(self._results)

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, i: int) -> Result:
        return self._results[i]

    @property
    def errors(self) -> list[str]:
        return [r.error for r in self._results if r.error]

    @property
    def num_errors(self) -> int:
        """Trials whose own code failed (after their retries)."""
        return len(self.errors)

    @property
    def num_terminated(self) -> int:
        return len(self._results) - self.num_errors

    def get_best_result(self, metric: str | None = None, mode: str | None = None) -> Result:
        """The best trial: with no arguments the run's own pick (the best final metric among the
        trials that trained longest: SHA's winner); with ``metric``/``mode``, the best last
        reported value of ``metric`` over all trials (Ray Tune's ``scope="last"``).

        Raises:
            SpecError: no trial reported ``metric``.
        """
        if metric is None and mode is None and self._best is not None:
            return next(r for r in self._results if r.trial_id == self._best)
        metric, mode = metric or self._metric, mode or self._mode
        scored = [r for r in self._results if isinstance(r.metrics.get(metric), (int, float))
                  and math.isfinite(r.metrics[metric])]
        if not scored:
            raise SpecError(f"metric: no trial reported {metric!r}; pass one the trainer reports")
        return (min if mode == "min" else max)(scored, key=lambda r: r.metrics[metric])

    def get_dataframe(self) -> Any:
        """One row per trial: its metrics, ``config/<key>`` columns, ``trial_id``, ``error``.

        Raises:
            ImportError: pandas is not installed.
        """
        try:
            import pandas as pd  # type: ignore[import-untyped]
        except ImportError:
            raise ImportError("ResultGrid.get_dataframe needs pandas; install it with `pip install pandas`") from None
        rows = []
        for r in self._results:
            rows.append({"trial_id": r.trial_id, **r.metrics, **{f"config/{k}": v for k, v in _flat(r.config).items()},
                         "error": r.error, "path": r.path})
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        return f"ResultGrid<{len(self)} trials, {self.num_errors} errors, run {self.run.run_id}>"


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


class Tuner:
    """Plan a tuning job for a deadline (or budget), print the plan, run it (see the module docstring).

    Args:
        trainable: a function of ``config`` in Ray Tune's style (``rubberband.report`` or
            ``ray.tune.report``), or a ``rubberband.Trainer`` class.
        param_space: hyperparameter name -> a domain: rubberband's (``rb.loguniform``...), Ray
            Tune's (``tune.loguniform``...), a YAML form, a list, or a constant.
        tune_config: a ``TuneConfig``; ``cloud``: a ``Cloud``. ``verbose``: print the plan,
            progress and the result (``False``: warnings only).
    """

    def __init__(self, trainable: Any, *, param_space: Mapping[str, Any] | None = None,
                 tune_config: TuneConfig | None = None, cloud: Cloud | None = None, verbose: bool = True):
        from rubberband.executor.search_space import Search

        self.trainable = trainable
        self.tune_config = tune_config or TuneConfig()
        self.cloud = cloud or Cloud()
        self.verbose = verbose
        if not isinstance(self.tune_config, TuneConfig):
            raise SpecError("tune_config: expected rubberband.TuneConfig(metric=..., mode=..., sha=dict(...), ...)")
        if not isinstance(self.cloud, Cloud):
            raise SpecError("cloud: expected rubberband.Cloud(provider=..., profile=..., cloud_profile=...)")
        try:       # a malformed space or algorithm fails here, naming the key
            self.search = Search.of(param_space or {}, self.tune_config.search)
        except SpecError as exc:
            raise SpecError(_python_names(str(exc))) from None

    # --- the request: the experiment an experiment file would give, resolved once ------------
    def experiment(self) -> dict[str, Any]:
        """The experiment mapping ``TuneConfig`` and ``Cloud`` stand for (an experiment file's fields)."""
        tc, cloud = self.tune_config, self.cloud
        # The search space and its algorithm are the Tuner's own (``self.search``): they may hold
        # domain objects no experiment file can, and ``request`` sets the algorithm it resolved.
        data: dict[str, Any] = {"name": getattr(self.trainable, "__name__", "tuner"), "seed": tc.seed,
                                "mode": tc.mode, "max_failures": tc.max_failures}
        data.update(self._schedule())
        if cloud.profile is None:
            raise SpecError("Cloud.profile: give the model profile (a YAML path such as profiles/tune_function_local.yaml, "
                            "which `rubberband profile` writes, or a ModelProfile)")
        profile = cloud.profile.to_dict() if hasattr(cloud.profile, "to_dict") else cloud.profile
        data["model_profile"] = os.fspath(profile) if isinstance(profile, os.PathLike) else profile
        if cloud.cloud_profile is None:
            raise SpecError("Cloud.cloud_profile: give the cloud profile's YAML, e.g. cloud_profiles/aws/us-east-1.yaml "
                            "(or cloud_profiles/local/local.yaml for the local provider)")
        data["cloud"] = {"profile": os.fspath(cloud.cloud_profile), "instance_type": cloud.instance_type,
                         "market": cloud.market, **({"overrides": dict(cloud.overrides)} if cloud.overrides else {})}
        metric = tc.metric or getattr(self.trainable, "metric", None)
        if metric is None:
            raise SpecError("TuneConfig.metric: name the metric your function reports, e.g. "
                            "TuneConfig(metric='val_loss', mode='min')")
        data["metric"] = metric
        for key, value in (("deadline", tc.deadline), ("samples", tc.samples), ("policy", tc.policy),
                           ("confidence", tc.confidence), ("cluster", cloud.cluster)):
            if value is not None:
                data[key] = os.fspath(value) if isinstance(value, os.PathLike) else value
        if tc.surrogate is not None:
            surrogate = dict(tc.surrogate) if isinstance(tc.surrogate, Mapping) else tc.surrogate
            if isinstance(surrogate, dict) and isinstance(surrogate.get("model_profile"), os.PathLike):
                surrogate["model_profile"] = os.fspath(surrogate["model_profile"])
            data["surrogate"] = surrogate
            # ``surrogate.transfer`` names keys of the search space, which is the Tuner's own
            # (``self.search``): the experiment is told their names only, each one value.
            data["search_space"] = {name: [None] for name in self.search.space.names()}
        return data

    def _schedule(self) -> dict[str, Any]:
        """``sha:``, ``hyperband:`` or ``stages:``; SHA's trial count from ``num_samples`` as Ray Tune counts it."""
        tc = self.tune_config
        given = [k for k in ("sha", "hyperband", "stages") if getattr(tc, k) is not None]
        if len(given) != 1:
            raise SpecError("TuneConfig: give one of sha=dict(min_iters=1, max_iters=16, eta=2), hyperband=dict(...) "
                            "or stages=[(num_trials, iters), ...]" + (f" (found {', '.join(given)})" if given else ""))
        kind = given[0]
        if kind == "sha":
            sha = dict(tc.sha or {})
            if "num_trials" in sha and tc.num_samples is not None:
                raise SpecError("TuneConfig.num_samples: sha gives num_trials already; drop one of them")
            if "num_trials" not in sha:
                num = 1 if tc.num_samples is None else tc.num_samples
                if isinstance(num, bool) or not isinstance(num, int) or num < 1:
                    raise SpecError(f"TuneConfig.num_samples: expected a positive whole number, got {num!r}")
                sha["num_trials"] = num * max(1, self.search.space.grid_size())
            return {"sha": sha}
        if tc.num_samples is not None:
            raise SpecError(f"TuneConfig.num_samples: {kind} sets its own trial counts; drop num_samples")
        if kind == "hyperband":
            return {"hyperband": dict(tc.hyperband or {})}
        return {"stages": [list(s) for s in tc.stages or ()]}

    def request(self) -> Any:
        """The job resolved as every command resolves one (``rubberband.request.resolve``).

        Raises:
            SpecError: one line naming the argument (``TuneConfig.sha.max_iters``, ``Cloud.profile``...).
        """
        from rubberband.request import Overrides, resolve

        tc = self.tune_config
        overrides = Overrides()
        if tc.budget is not None:
            if isinstance(tc.budget, bool) or not isinstance(tc.budget, (int, float)) or not tc.budget > 0:
                raise SpecError(f"TuneConfig.budget: expected a positive amount of dollars, e.g. 50, got {tc.budget!r}")
            # A budget alone plans the fastest job within it; a deadline given beside it is kept too.
            overrides = Overrides(budget_usd=float(tc.budget),
                                  deadline=None if tc.deadline is None else str(tc.deadline))
        try:
            req = resolve(self.experiment(), overrides)
        except SpecError as exc:
            raise SpecError(_python_names(str(exc))) from None
        return replace(req, experiment=replace(req.experiment, search=self.search.algorithm))

    # --- fit ---------------------------------------------------------------------------------
    def fit(self) -> ResultGrid:
        """Plan, print the plan, run it on the cloud's provider; return every trial's result.

        Raises:
            SpecError: bad arguments (one line naming them); InfeasibleDeadlineError: no plan
            meets the deadline.
        """
        from rubberband.executor.search_space import check_search
        from rubberband.plan.show import plan_table, summary_line
        from rubberband.profiles.by_gpu import model_of
        from rubberband.providers import base as providers
        from rubberband.request import plan_request

        provider = providers.get(self.cloud.provider, "Cloud.provider")
        req = self.request()
        exp = req.experiment
        trainer = self._trainer(provider.starts_cluster)
        doubts = list(req.warnings)
        try:
            doubts += check_search(self.search.space, self.search.algorithm,
                                   None if len(req.spec.bracket_starts) > 1 else req.spec.stages[0].num_trials)
        except SpecError as exc:
            raise SpecError(_python_names(str(exc))) from None
        self._warn(doubts)
        plan = plan_request(req)
        self._warn([w for w in plan.warnings if w not in doubts])
        self._say(plan_table(plan) + "\n" + summary_line(plan.predicted, plan.deadline_s) + "\n")
        model = model_of(req.models, plan.cloud, "plan.cloud.instance_type")
        replan = model if math.isfinite(plan.deadline_s) else None    # the closed loop needs a deadline to keep
        # A surrogate job (DESIGN §4.6): ``req.models`` are the surrogate's, these the target stage's.
        target = model_of(req.target_models, plan.cloud, "plan.cloud.instance_type") \
            if req.target_models is not None else None
        ratio = exp.surrogate.width_ratio if exp.surrogate is not None and req.spec.target_stage is not None else None
        budget = None
        if self.tune_config.budget is not None:
            from rubberband.scheduler.safety import check_budget

            budget = check_budget(float(self.tune_config.budget), exp.spec, model, plan.cloud, target_model=target)
        if provider.starts_cluster:
            from rubberband.executor.run import execute, progress_printer

            if ratio is not None:       # surrogates at width / S, the target at full width
                from rubberband.surrogate import SurrogateJob

                trainer = SurrogateJob(trainer, ratio)

            run = execute(plan, trainer, self.search, provider=provider.name, metric=exp.metric, mode=exp.mode,
                          seed=req.seed, runs_dir=Path(self.cloud.runs_dir),
                          on_event=progress_printer() if self.verbose else None,
                          cluster_config=providers.cluster_yaml_for(provider, None, exp.cluster, "Cloud.cluster"),
                          replan_with=replan, safety_net=model, budget_usd=budget, max_failures=exp.max_failures,
                          time_attr=exp.time_attr, surrogate_ratio=ratio, target_model=target)
        else:
            from rubberband.executor.rehearse import rehearse

            run = rehearse(plan, req.models, plan.cloud, seed=req.seed, mode=exp.mode, metric=exp.metric,
                           replan_with=replan, safety_net=model, budget_usd=budget, search_space=self.search,
                           target_model=req.target_models, replan_target=target, width_ratio=ratio)
        self._say(run.table())
        return _grid(run, exp.metric, exp.mode)

    def _trainer(self, runs_it: bool) -> Any:
        """The trainable as the workers will load it: checked, and named so they can import it.

        A module-level function or class the workers can import by name goes as ``module:Name``
        (as ``trainer:`` in an experiment file); one of a module they cannot (beside a script)
        as ``path/file.py:Name``; one of ``__main__`` or a local one as the object itself, which
        Ray pickles by value.
        """
        from rubberband import function_api

        t = self.trainable
        if function_api.is_function_trainable(t):
            self._warn(function_api.check_function(t, getattr(t, "__name__", repr(t))))
        elif not (isinstance(t, type) and all(callable(getattr(t, m, None))
                                              for m in ("build_model", "build_optimizer", "build_data"))):
            raise SpecError(f"trainable: expected a function of config or a rubberband.Trainer class, got {t!r}")
        if not runs_it:
            return t
        module = getattr(t, "__module__", None)
        qualname = getattr(t, "__qualname__", "")
        if module in (None, "__main__") or "<" in qualname or "." in qualname:
            return t
        if getattr(sys.modules.get(module), qualname, None) is not t:
            return t
        spec = importlib.util.find_spec(module)
        origin = getattr(spec, "origin", None)
        if origin and _worker_importable(origin):
            return f"{module}:{qualname}"
        if origin and origin.endswith(".py"):
            return f"{os.path.abspath(origin)}:{qualname}"
        return t

    def _warn(self, lines: Sequence[str]) -> None:
        for line in dict.fromkeys(lines):
            print(f"warning: {line}", file=sys.stderr)

    def _say(self, text: str) -> None:
        if self.verbose:
            print(text, flush=True)


def _worker_importable(origin: str) -> bool:
    """Whether a module file lies under what a worker's ``sys.path`` has: the installed packages,
    rubberband's own tree (the local provider puts it on ``PYTHONPATH``) and ``PYTHONPATH``."""
    roots = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
             str(Path(__file__).resolve().parents[1]),
             *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
    path = os.path.abspath(origin)
    return any(path.startswith(os.path.abspath(r) + os.sep) for r in roots)


def _grid(run: Any, metric: str, mode: str) -> ResultGrid:
    results = []
    for tid, t in run.trials.items():
        trained = [h for h in t.get("history") or [] if "failed" not in h]
        last = trained[-1] if trained else {}
        # "metric" is the scheduler's name for the ranked value (a rehearsal's only one): named as the job's
        metrics = {k: v for k, v in last.items() if k not in _HISTORY_KEYS and k != "metric"}
        if t.get("metric") is not None:
            metrics.setdefault(metric, t["metric"])
        # A run's history counts each TRAIN's iterations; a rehearsal's, the step reached.
        metrics["training_iteration"] = sum(h["iters"] for h in trained) if all("iters" in h for h in trained) \
            else int(last.get("step", 0))
        path = blob = None
        if run.run_dir:
            path = str(Path(run.run_dir) / "trials" / tid)
            blob = str(Path(run.run_dir) / "checkpoints" / f"{tid}.pt")
        results.append(Result(tid, dict(t.get("config") or {}), metrics, path, t.get("failed"), blob))
    return ResultGrid(results, run, metric, mode, run.best.get("trial") if run.best else None)


# An experiment file's field names, as the Python arguments that set them.
_FIELDS = [("model_profile", "Cloud.profile"), ("cloud.profile", "Cloud.cloud_profile"),
           ("cloud.instance_type", "Cloud.instance_type"), ("instance_type", "Cloud.instance_type"),
           ("search_space", "param_space"), ("cloud.market", "Cloud.market"),
           ("cloud.overrides", "Cloud.overrides"), ("cluster", "Cloud.cluster")] + \
          [(k, f"TuneConfig.{k}") for k in ("sha", "hyperband", "stages", "deadline", "samples", "policy",
                                             "confidence", "max_failures", "search", "mode", "seed", "surrogate")]


def _python_names(message: str) -> str:
    for yaml_name, python_name in _FIELDS:
        if message.startswith(yaml_name) and message[len(yaml_name):len(yaml_name) + 1] in (":", ".", "["):
            return python_name + message[len(yaml_name):]
    return message

