"""Search spaces written as Ray Tune's objects or rubberband's constructors, and the search
algorithms (random, grid, Optuna's TPE fed with completed rungs)."""

from __future__ import annotations

import importlib
import importlib.util
import math

import numpy as np
import pytest

import rubberband as rb
from rubberband.errors import SpecError
from rubberband.executor.search_space import (
    SEARCHERS,
    Choice,
    Float,
    Grid,
    Integer,
    Normal,
    Observation,
    Search,
    check_search,
    normalize,
    sample_configs,
    width_note,
)
from rubberband.spec.experiment import SEARCH_ALGORITHMS, search_algorithm


def test_the_spec_names_every_search_algorithm_the_executor_has():
    assert tuple(SEARCHERS) == SEARCH_ALGORITHMS


def test_an_unknown_search_algorithm_is_one_line_naming_the_field():
    with pytest.raises(SpecError, match=r"^search: unknown value 'optnua' \(did you mean `optuna`\?\); choose one of random, grid, optuna$"):
        search_algorithm("optnua")


# --- rubberband's constructors and Ray Tune's objects ----------------------------------------------
OWN_AND_YAML = [
    (rb.uniform(0.8, 0.99), {"uniform": [0.8, 0.99]}),
    (rb.loguniform(1e-4, 1e-1), {"loguniform": [1e-4, 1e-1]}),
    (rb.quniform(0.0, 0.5, 0.1), {"quniform": [0.0, 0.5, 0.1]}),
    (rb.randint(1, 5), {"randint": [1, 5]}),
    (rb.choice([32, 64, 128]), {"choice": [32, 64, 128]}),
    (rb.randn(2.0, 0.5), {"randn": [2.0, 0.5]}),
]


@pytest.mark.parametrize("own, yaml", OWN_AND_YAML)
def test_rubberbands_constructors_draw_what_the_yaml_forms_draw(own, yaml):
    assert sample_configs({"x": own}, 50, seed=4) == sample_configs({"x": yaml}, 50, seed=4)


def test_grid_search_is_crossed_in_order_and_cycled():
    configs = sample_configs({"a": rb.grid_search([1, 2]), "b": rb.grid_search(["x", "y"]), "c": 7}, 5)
    assert [(c["a"], c["b"], c["c"]) for c in configs] == [(1, "x", 7), (1, "y", 7), (2, "x", 7), (2, "y", 7), (1, "x", 7)]


HAS_RAY = importlib.util.find_spec("ray") is not None
tune = importlib.import_module("ray.tune") if HAS_RAY else None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="Ray Tune is not installed")


@needs_ray
@pytest.mark.parametrize("ray_domain, own", [
    (lambda: tune.uniform(0.8, 0.99), Float(0.8, 0.99)),
    (lambda: tune.loguniform(1e-4, 1e-1), Float(1e-4, 1e-1, log=True)),
    (lambda: tune.quniform(0.0, 0.5, 0.1), Float(0.0, 0.5, q=0.1)),
    (lambda: tune.qloguniform(8, 512, 8), Float(8, 512, log=True, q=8)),
    (lambda: tune.randint(1, 5), Integer(1, 5)),
    (lambda: tune.qrandint(0, 10, 2), Integer(0, 10, q=2)),
    (lambda: tune.lograndint(1, 100), Integer(1, 100, log=True)),
    (lambda: tune.choice([32, "a", [1]]), Choice((32, "a", [1]))),
    (lambda: tune.randn(2.0, 0.5), Normal(2.0, 0.5)),
    (lambda: tune.grid_search([1, 2, 3]), Grid((1, 2, 3))),
])
def test_ray_tune_objects_become_rubberbands_own_domains(ray_domain, own):
    assert normalize({"x": ray_domain()}).axes == ((("x",), own),)


@needs_ray
def test_ray_tune_domains_keep_ray_tunes_semantics():
    space = {"n": tune.randint(1, 5), "q": tune.qrandint(0, 10, 2), "lr": tune.loguniform(1e-4, 1e-1),
             "d": tune.quniform(0.0, 0.5, 0.1)}
    configs = sample_configs(space, 2000, seed=1)
    assert {c["n"] for c in configs} == {1, 2, 3, 4}                       # upper bound excluded
    assert {c["q"] for c in configs} <= {0, 2, 4, 6, 8, 10} and all(type(c["q"]) is int for c in configs)
    assert all(1e-4 <= c["lr"] < 1e-1 for c in configs)
    assert len({c["d"] for c in configs}) == 6


@needs_ray
def test_a_ray_tune_grid_crossed_with_random_axes_repeats_like_num_samples():
    space = {"lr": tune.grid_search([0.1, 0.01]), "wd": tune.uniform(0, 1)}
    configs = sample_configs(space, 6, seed=0)
    assert [c["lr"] for c in configs] == [0.1, 0.01] * 3
    assert len({c["wd"] for c in configs}) == 6


@needs_ray
def test_a_nested_param_space_gives_nested_configs():
    space = {"model": {"hidden": tune.choice([64, 128]), "act": "relu"}, "lr": rb.loguniform(1e-3, 1e-1)}
    for config in sample_configs(space, 10, seed=2):
        assert set(config) == {"model", "lr"} and config["model"]["act"] == "relu"
        assert config["model"]["hidden"] in (64, 128)


@needs_ray
def test_sample_from_is_refused_with_a_fix():
    with pytest.raises(SpecError, match=r"^search_space\.x: tune\.sample_from draws from other keys"):
        normalize({"x": tune.sample_from(lambda spec: 1)})


def test_a_bad_domain_names_its_key():
    with pytest.raises(SpecError, match=r"^search_space\.model\.lr: loguniform: low must be positive"):
        normalize({"model": {"lr": {"loguniform": [0, 1]}, "h": rb.choice([1])}})


# --- grid ---------------------------------------------------------------------------------------
def test_grid_search_needs_a_grid_axis():
    with pytest.raises(SpecError, match=r"^search: grid has no grid axis to cross"):
        check_search({"lr": rb.uniform(0, 1)}, "grid")


def test_grid_search_says_when_the_trials_do_not_repeat_the_grid_evenly():
    space = {"a": rb.grid_search([1, 2, 3]), "b": rb.grid_search([1, 2])}
    assert check_search(space, "grid", 12) == []
    (warning,) = check_search(space, "grid", 32)
    assert "the grid has 6 points and the job starts 32 trials" in warning and "start 30 or 36" in warning


# --- Optuna's TPE -------------------------------------------------------------------------------
needs_optuna = pytest.mark.skipif(importlib.util.find_spec("optuna") is None,
                                  reason="Optuna is not installed (pip install 'rubberband[optuna]')")

SPACE = {"lr": rb.loguniform(1e-4, 1.0), "layers": rb.randint(1, 9), "act": rb.choice(["relu", "tanh"]),
         "noise": rb.randn(0.0, 1.0), "epochs": 3}


def observations(n: int, iters: int, seed: int = 0) -> list[Observation]:
    """Results of ``n`` random configs at one rung: the best have lr near 1e-2 and tanh."""
    configs = sample_configs(SPACE, n, seed=seed)
    return [Observation(c, iters, abs(math.log10(c["lr"]) + 2) + (c["act"] == "relu")) for c in configs]


@needs_optuna
def test_optuna_with_too_few_results_draws_at_random():
    search = Search.of(SPACE, "optuna")
    assert search.configs(8, seed=5) == sample_configs(SPACE, 8, seed=5)
    # lr, layers and act are modelled (d = 3): a rung needs d + 3 = 6 results
    few = observations(5, 9)
    assert search.configs(8, seed=5, observations=few) == sample_configs(SPACE, 8, seed=5)
    assert search.configs(8, seed=5, observations=observations(6, 9)) != sample_configs(SPACE, 8, seed=5)


@needs_optuna
def test_optuna_is_deterministic_given_the_seed_and_the_results():
    search, seen = Search.of(SPACE, "optuna"), observations(30, 9)
    a = search.configs(10, seed=5, observations=seen)
    assert a == search.configs(10, seed=5, observations=seen)
    assert a != search.configs(10, seed=6, observations=seen)
    assert a != sample_configs(SPACE, 10, seed=5)


@needs_optuna
def test_optuna_draws_near_the_best_results_and_keeps_every_domain():
    seen = observations(40, 9)
    drawn = Search.of(SPACE, "optuna").configs(30, seed=1, observations=seen)
    random = sample_configs(SPACE, 30, seed=1)

    def loss(c):
        return abs(math.log10(c["lr"]) + 2) + (c["act"] == "relu")

    assert np.mean([loss(c) for c in drawn]) < 0.6 * np.mean([loss(c) for c in random])
    for c in drawn:
        assert 1e-4 <= c["lr"] <= 1.0 and c["layers"] in range(1, 9) and type(c["layers"]) is int
        assert c["act"] in ("relu", "tanh") and c["epochs"] == 3 and isinstance(c["noise"], float)


@needs_optuna
def test_optuna_is_fitted_on_the_highest_rung_with_enough_results():
    low = observations(20, 1)
    # Two results at the top rung are too few (d + 3 = 6): the fit uses rung 1, so the draws are
    # the same as with rung 1 alone; ranking flipped at rung 3 (with enough results) changes them.
    top = [Observation(o.config, 9, -o.metric) for o in low[:2]]
    search = Search.of(SPACE, "optuna")
    assert search.configs(6, seed=2, observations=low + top) == search.configs(6, seed=2, observations=low)
    flipped = [Observation(o.config, 3, -o.metric) for o in low[:10]]
    assert search.configs(6, seed=2, observations=low + flipped) != search.configs(6, seed=2, observations=low)


@needs_optuna
def test_optuna_maximises_when_the_mode_is_max():
    seen = [Observation(o.config, o.iters, -o.metric) for o in observations(40, 9)]
    drawn = Search.of(SPACE, "optuna").configs(30, seed=1, observations=seen, mode="max")
    assert np.mean([abs(math.log10(c["lr"]) + 2) for c in drawn]) < 1.0


def test_optuna_refuses_a_grid_axis():
    with pytest.raises(SpecError, match=r"^search_space\.lr: search: optuna draws every config from its model"):
        check_search({"lr": rb.grid_search([0.1, 0.2])}, "optuna")


# --- widths -------------------------------------------------------------------------------------
def test_a_width_in_the_search_space_gets_one_line_saying_configs_never_change_speed():
    note = width_note({"hidden": rb.choice([64, 512]), "lr": rb.uniform(0, 1)})
    assert note is not None and "\n" not in note
    assert note.startswith("search space: hidden sets the model's width") and "never change a trial's speed" in note
    assert width_note({"lr": rb.uniform(0, 1), "hidden": 64}) is None      # a constant width changes nothing
    assert width_note({"size": rb.choice([1, 2])}, width_keys=["size"]) is not None
    assert width_note({"hidden": rb.choice([1, 2])}, width_keys=["size"]) is None


# --- a HyperBand bracket's fresh trials come from TPE fitted on the brackets before -------------
def _hyperband_configs(algorithm: str, seed: int = 3) -> tuple[list[dict], list[dict]]:
    from rubberband import ExperimentSpec
    from rubberband.executor.driver import Driver
    from rubberband.plan import plan_allocation
    from rubberband.testing.builders import fake_cloud, model_profile
    from rubberband.testing.fakes import make_fakes

    exp = ExperimentSpec.chain([ExperimentSpec.sha(12, 1, 2, 2), ExperimentSpec.sha(16, 2, 2, 2)])   # 12x1 6x1 | 16x2
    iter_s = {1: 4.0, 2: 2.5}
    plan = plan_allocation(exp, (12, 6, 16), model_profile(iter_s, name="fake"), fake_cloud(2), deadline_s=1e6, samples=2)
    fakes = make_fakes(2, iter_s, provision_s=10, init_s=5)
    space = {"lr": rb.uniform(0.01, 1.0), "wd": rb.uniform(0.0, 1.0)}
    outcome = Driver(plan, fakes.cluster, fakes.runner, Search.of(space, algorithm), "loss", "min", seed=seed,
                     clock=fakes.clock).run()
    return ([t.config for t in outcome.trials.values() if t.bracket == 0],
            [t.config for t in outcome.trials.values() if t.bracket == 1])


@needs_optuna
def test_a_new_bracket_samples_from_tpe_fitted_on_the_rungs_completed_so_far():
    first, fresh = _hyperband_configs("optuna")
    rand_first, rand_fresh = _hyperband_configs("random")
    assert first == rand_first                        # nothing to fit yet: the first bracket is random
    assert fresh != rand_fresh and _hyperband_configs("optuna") == (first, fresh)
    # the fakes' loss grows with lr: TPE's draws sit lower than the random ones
    assert np.mean([c["lr"] for c in fresh]) < 0.7 * np.mean([c["lr"] for c in rand_fresh])


# --- `search:` in an experiment file, and what validate says ----------------------------------
def _experiment(tmp_path, **changes):
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[3]
    data = {"name": "t", "sha": {"num_trials": 32, "min_iters": 1, "max_iters": 50, "eta": 3},
            "model_profile": str(root / "profiles" / "resnet101_cifar10_p3.yaml"),
            "cloud": {"profile": str(root / "cloud_profiles" / "aws" / "us-east-1.yaml"), "instance_type": "p3.8xlarge"},
            "deadline": "20m", **changes}
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_an_experiment_names_its_search_algorithm(tmp_path):
    from rubberband.config import load_experiment

    assert load_experiment(_experiment(tmp_path)).search == "random"
    exp = load_experiment(_experiment(tmp_path, search="grid", search_space={"lr": {"grid": [0.1, 0.2]}}))
    assert exp.search == "grid"
    with pytest.raises(SpecError, match=r"^search: unknown value 'bohb'; choose one of random, grid, optuna$"):
        load_experiment(_experiment(tmp_path, search="bohb"))
    with pytest.raises(SpecError, match=r"^search: grid has no grid axis"):
        load_experiment(_experiment(tmp_path, search="grid", search_space={"lr": [0.1, 0.2]}))


def test_validate_says_once_that_configs_never_change_a_trials_speed(tmp_path, capsys):
    from rubberband.cli.main import main

    path = _experiment(tmp_path, search_space={"hidden": [64, 512], "lr": {"loguniform": [1e-4, 1e-1]}})
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "search space   hidden, lr (search random)" in out
    (note,) = [line for line in out.splitlines() if "never change a trial's speed" in line]
    assert note.startswith("note: search space: hidden sets the model's width")
    assert main(["validate", str(_experiment(tmp_path, search_space={"lr": [0.1, 0.2]}))]) == 0
    assert "never change" not in capsys.readouterr().out


@needs_optuna
def test_a_rehearsal_draws_configs_with_the_experiments_search(tmp_path, capsys):
    import json
    from pathlib import Path

    from rubberband.cli.main import main

    root = Path(__file__).resolve().parents[3]
    space = {"lr": {"loguniform": [0.005, 0.5]}, "momentum": {"uniform": [0.5, 0.95]}}

    def trials(search: str) -> dict:
        path = _experiment(tmp_path, sha=None, hyperband={"min_iters": 1, "max_iters": 9, "eta": 3}, deadline="10m",
                           samples=100, search=search, search_space=space,
                           model_profile=str(root / "profiles" / "tune_function_local.yaml"),
                           cloud={"profile": str(root / "cloud_profiles" / "local" / "local.yaml"),
                                  "instance_type": "local.2gpu"})
        assert main(["run", str(path), "--provider", "sim", "--json", "--runs-dir", str(tmp_path / "runs")]) == 0
        return {tid: t["config"] for tid, t in json.loads(capsys.readouterr().out)["trials"].items()}

    tpe, rand = trials("optuna"), trials("random")
    assert {t: c for t, c in tpe.items() if t.startswith("b0-")} == {t: c for t, c in rand.items() if t.startswith("b0-")}
    assert {t: c for t, c in tpe.items() if t.startswith("b1-")} != {t: c for t, c in rand.items() if t.startswith("b1-")}
    assert all(0.005 <= c["lr"] <= 0.5 for c in tpe.values())
