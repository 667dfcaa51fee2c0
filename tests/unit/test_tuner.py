"""`rubberband.Tuner`: the Python entry in Ray Tune's habits, on the `sim` provider (a rehearsal)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import rubberband as rb
from rubberband import function_api
from rubberband.errors import SpecError
from rubberband.executor.search_space import sample_configs
from rubberband.plan.show import plan_table
from rubberband.request import plan_request, resolve

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "tune_function_local.yaml"
LOCAL = ROOT / "cloud_profiles" / "local" / "local.yaml"
SIM = rb.Cloud(provider="sim", profile=str(PROFILE), cloud_profile=str(LOCAL), instance_type="local.2gpu")


def train_fn(config):
    """A Ray-Tune-style function (never run on sim: a rehearsal plays the trainer)."""
    for i in range(100):
        rb.report({"val_loss": config["lr"] / (i + 1)}, checkpoint=None)


def tune_config(**changes) -> rb.TuneConfig:
    base = dict(metric="val_loss", mode="min", num_samples=8, sha=dict(min_iters=2, max_iters=16, eta=2),
                deadline="90s", samples=100)
    return rb.TuneConfig(**{**base, **changes})


def ray_space() -> dict:
    tune = pytest.importorskip("ray.tune")
    return {"lr": tune.loguniform(0.005, 0.5), "momentum": tune.uniform(0.5, 0.95), "wd": tune.choice([0.0, 1e-4])}


def test_fit_on_sim_with_ray_tune_search_space_objects(capsys):
    space = ray_space()
    grid = rb.Tuner(train_fn, param_space=space, tune_config=tune_config(), cloud=SIM).fit()
    assert len(grid) == 8 and grid.num_errors == 0 and grid.experiment_path is None
    assert [r.config for r in grid] == sample_configs(space, 8, seed=0)        # drawn as a run draws them
    best = grid.get_best_result()
    assert best.trial_id == grid.run.best["trial"] and best.config == grid.run.best["config"]
    assert best.metrics["val_loss"] == grid.run.best["metric"] and best.metrics["training_iteration"] == 16
    assert best.checkpoint is None                                           # a rehearsal writes nothing
    # Ray Tune's scope="last": eliminated trials reported at lower rungs
    by_last = grid.get_best_result(metric="val_loss", mode="min")
    assert by_last.metrics["val_loss"] == min(r.metrics["val_loss"] for r in grid)
    frame = grid.get_dataframe()
    assert list(frame["trial_id"]) == [r.trial_id for r in grid]
    assert {"val_loss", "training_iteration", "config/lr", "config/momentum", "config/wd"} <= set(frame.columns)


def test_fit_prints_the_plan_the_cli_prints(capsys):
    tuner = rb.Tuner(train_fn, param_space={"lr": rb.loguniform(0.005, 0.5)}, tune_config=tune_config(), cloud=SIM)
    tuner.fit()
    out = capsys.readouterr().out
    assert plan_table(plan_request(tuner.request())) in out
    assert "predicted vs actual" in out


def test_the_request_is_the_one_an_experiment_file_resolves_to(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({
        "name": "train_fn", "sha": {"num_trials": 8, "min_iters": 2, "max_iters": 16, "eta": 2},
        "model_profile": str(PROFILE), "cloud": {"profile": str(LOCAL), "instance_type": "local.2gpu"},
        "deadline": "90s", "samples": 100, "metric": "val_loss", "mode": "min"}))
    from_file = resolve(str(path))
    from_python = rb.Tuner(train_fn, tune_config=tune_config(), cloud=SIM).request()
    for name in ("spec", "models", "instance_type", "market", "deadline_s", "budget_usd", "policy", "samples", "seed"):
        assert getattr(from_python, name) == getattr(from_file, name), name
    assert from_python.experiment.metric == "val_loss" and from_python.experiment.search == "random"


def test_num_samples_repeats_the_grid_as_ray_tune_does():
    space = {"lr": rb.grid_search([0.01, 0.1, 1.0]), "wd": rb.uniform(0, 1)}
    grid = rb.Tuner(train_fn, param_space=space, tune_config=tune_config(num_samples=2, search="grid"), cloud=SIM,
                    verbose=False).fit()
    assert [r.config["lr"] for r in grid] == [0.01, 0.1, 1.0] * 2


def test_a_budget_alone_plans_the_fastest_job_within_it():
    tuner = rb.Tuner(train_fn, tune_config=tune_config(deadline=None, budget=1.0), cloud=SIM, verbose=False)
    req = tuner.request()
    assert req.budget_usd == 1.0 and req.deadline_s is None
    assert rb.Tuner(train_fn, tune_config=tune_config(budget=1.0), cloud=SIM).request().deadline_s == 90


@pytest.mark.skipif(importlib.util.find_spec("optuna") is None, reason="Optuna is not installed")
def test_hyperband_with_optuna_on_sim_samples_later_brackets_from_tpe():
    space = {"lr": rb.loguniform(0.005, 0.5), "momentum": rb.uniform(0.5, 0.95)}

    def fit(search):
        config = tune_config(num_samples=None, sha=None, hyperband=dict(min_iters=1, max_iters=9, eta=3),
                             search=search, deadline="10m")
        return rb.Tuner(train_fn, param_space=space, tune_config=config, cloud=SIM, verbose=False).fit()

    tpe, rand = fit("optuna"), fit("random")
    first = [r.config for r in tpe if r.trial_id.startswith("b0-")]
    later = [r.config for r in tpe if not r.trial_id.startswith("b0-")]
    assert first == [r.config for r in rand if r.trial_id.startswith("b0-")]
    assert later != [r.config for r in rand if not r.trial_id.startswith("b0-")]
    assert [r.config for r in fit("optuna")] == [r.config for r in tpe]         # deterministic given the seed


@pytest.mark.parametrize("kwargs, message", [
    (dict(tune_config=tune_config(sha=None)), r"^TuneConfig: give one of sha=dict\("),
    (dict(tune_config=tune_config(sha=None, hyperband=dict(min_iters=1, max_iters=9))),
     r"^TuneConfig\.num_samples: hyperband sets its own trial counts; drop num_samples$"),
    (dict(tune_config=tune_config(metric=None)), r"^TuneConfig\.metric: name the metric your function reports"),
    (dict(tune_config=tune_config(sha=dict(min_iters=4))), r"^TuneConfig\.sha\.max_iters: missing required field"),
    (dict(tune_config=tune_config(sha=dict(min_iters=4, max_iters=2))), r"^max_iters: 2 is below min_iters 4"),
    (dict(tune_config=tune_config(deadline="soon")), r"^TuneConfig\.deadline: expected a duration"),
    (dict(tune_config=tune_config(search="bohb")), r"^TuneConfig\.search: unknown algorithm 'bohb'"),
    (dict(tune_config=tune_config(search="grid")), r"^TuneConfig\.search: grid has no grid axis"),
    (dict(tune_config=tune_config(budget=-1)), r"^TuneConfig\.budget: expected a positive amount"),
    (dict(cloud=rb.Cloud(provider="sim", cloud_profile=str(LOCAL))), r"^Cloud\.profile: give the model profile"),
    (dict(cloud=rb.Cloud(provider="sim", profile=str(PROFILE), cloud_profile=str(LOCAL), instance_type="local.9gpu")),
     r"^Cloud\.instance_type: 'local\.9gpu' is not in .*did you mean `local\.4gpu`"),
    (dict(cloud=rb.Cloud(provider="gcp", profile=str(PROFILE), cloud_profile=str(LOCAL))), r"^Cloud\.provider: "),
    (dict(param_space={"lr": {"loguniform": [0, 1]}}), r"^param_space\.lr: loguniform: low must be positive"),
])
def test_bad_arguments_are_one_line_naming_the_python_argument(kwargs, message):
    with pytest.raises(SpecError, match=message):
        fit(**{"tune_config": tune_config(), "cloud": SIM, **kwargs})


def fit(trainable=train_fn, **kwargs):
    return rb.Tuner(trainable, verbose=False, **kwargs).fit()


def test_a_trainable_must_be_a_function_of_config_or_a_trainer_class():
    with pytest.raises(SpecError, match=r"^trainable: expected a function of config or a rubberband.Trainer class"):
        fit(42, tune_config=tune_config(), cloud=SIM)
    with pytest.raises(SpecError, match=r"must take one argument, the trial's config"):
        fit(lambda a, b: None, tune_config=tune_config(), cloud=SIM)


def test_workers_get_the_trainable_by_name_where_they_can_import_it(tmp_path):
    from rubberband.examples import digits

    def local_fn(config):
        rb.report({"val_loss": 1.0})

    assert rb.Tuner(train_fn)._trainer(True) == f"{__name__}:train_fn"
    assert rb.Tuner(digits.DigitsMLP)._trainer(True) == "rubberband.examples.digits:DigitsMLP"
    assert rb.Tuner(local_fn)._trainer(True) is local_fn                 # pickled by value
    assert rb.Tuner(train_fn)._trainer(False) is train_fn               # a rehearsal loads nothing
    elsewhere = tmp_path / "user_train.py"                             # beside a script: not on the workers' path
    elsewhere.write_text("def train(config):\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import user_train
        assert rb.Tuner(user_train.train)._trainer(True) == f"{elsewhere}:train"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("user_train", None)


def test_a_results_checkpoint_is_the_directory_the_function_reported(tmp_path):
    from rubberband.tuner import Result

    src = tmp_path / "src"
    src.mkdir()
    (src / "state.txt").write_text("step 7")
    blob = function_api.pack_state(function_api.TrialState(function_api._directory_of(rb.Checkpoint(src)), 7, 7))
    (tmp_path / "t000.pt").write_bytes(blob)
    result = Result("t000", {}, {}, str(tmp_path / "trials" / "t000"), _blob=str(tmp_path / "t000.pt"))
    with result.checkpoint.as_directory() as d:
        assert (Path(d) / "state.txt").read_text() == "step 7"
    assert result.checkpoint.path == str(tmp_path / "trials" / "t000" / "checkpoint")
    never = function_api.pack_state(function_api.TrialState(None, 0, 7))
    (tmp_path / "t001.pt").write_bytes(never)
    assert Result("t001", {}, {}, str(tmp_path / "trials" / "t001"), _blob=str(tmp_path / "t001.pt")).checkpoint is None


def test_get_dataframe_names_pandas_when_it_is_missing(monkeypatch):
    grid = rb.Tuner(train_fn, tune_config=tune_config(num_samples=2), cloud=SIM, verbose=False).fit()
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="needs pandas; install it with `pip install pandas`"):
        grid.get_dataframe()


def test_the_python_api_names_load_no_sdk():
    code = ("import sys, rubberband as rb\nrb.Tuner, rb.TuneConfig, rb.Cloud, rb.uniform, rb.grid_search\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'torch', 'boto3', 'optuna')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_a_surrogate_job_fits_on_sim_and_its_best_result_is_the_target_trial(capsys):
    """DESIGN §4.6 through the Python API: SHA on the μP surrogate (its profile), then the
    winner's config at full width by the file's own (the target's) profile."""
    from rubberband.examples.digits import DigitsMLP

    cloud = rb.Cloud(provider="sim", profile=str(ROOT / "profiles" / "demo_digits_w128_local.yaml"),
                     cloud_profile=str(LOCAL), instance_type="local.2gpu")
    config = tune_config(metric="val_loss", num_samples=None, sha=dict(num_trials=8, min_iters=2, max_iters=16, eta=2),
                         surrogate=dict(width_ratio=8, transfer=["lr"], target_iters=16,
                                        model_profile=str(ROOT / "profiles" / "demo_digits_w16_local.yaml")))
    tuner = rb.Tuner(DigitsMLP, param_space={"hidden": 128, "lr": rb.loguniform(0.005, 0.5)}, tune_config=config,
                     cloud=cloud)
    assert tuner.request().spec.target_stage == 4         # 8x2, 4x4, 2x8, 1x2, then the target
    grid = tuner.fit()
    surrogate = grid.run.surrogate
    winner, target = surrogate["winner"]["trial"], surrogate["target"]["trial"]
    assert target == f"target-{winner}" and grid.get_best_result().trial_id == target
    assert len(grid) == 8 + 1 and grid.get_best_result().config == surrogate["winner"]["config"]
    assert "target trial" in capsys.readouterr().out
    with pytest.raises(SpecError, match=r"^TuneConfig.surrogate.transfer: .lr. is not a key"):
        rb.Tuner(DigitsMLP, param_space={"hidden": 128}, tune_config=config, cloud=cloud).request()
