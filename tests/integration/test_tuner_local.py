"""`rubberband.Tuner(...).fit()` on the `local` provider with a Ray Tune search-space object: a
function trainable of this module runs on the workers, the promoted trial resumes from its
checkpoint, and the best result carries that checkpoint."""

import json
import os
import tempfile

import pytest

import rubberband as rb

from .conftest import ROOT

pytestmark = pytest.mark.integration


def train_tiny(config):
    """Ray Tune's style, without the training: a step counter restored from the checkpoint."""
    start = 0
    checkpoint = rb.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "state.json")) as fh:
                start = json.load(fh)["iteration"]
    for iteration in range(start, 100):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as fh:
                json.dump({"iteration": iteration + 1}, fh)
            rb.report({"val_loss": config["lr"] / (iteration + 1), "iteration": iteration + 1},
                      checkpoint=rb.Checkpoint.from_directory(d))


def test_tuner_fit_runs_a_function_with_ray_tune_search_objects_on_local(tmp_path):
    tune = pytest.importorskip("ray.tune")
    tuner = rb.Tuner(
        train_tiny, param_space={"lr": tune.grid_search([0.5, 0.1])},
        tune_config=rb.TuneConfig(metric="val_loss", mode="min", stages=[(2, 1), (1, 1)], deadline="5m", samples=100),
        cloud=rb.Cloud(provider="local", profile=ROOT / "profiles" / "tune_function_local.yaml",
                       cloud_profile=ROOT / "cloud_profiles" / "local" / "local.yaml", instance_type="local.2gpu",
                       runs_dir=tmp_path / "runs"))
    grid = tuner.fit()
    assert len(grid) == 2 and grid.num_errors == 0
    best = grid.get_best_result()
    assert best.config == {"lr": 0.1} and best.metrics["iteration"] == 2       # resumed: 1 + 1, not 1 again
    assert best.metrics["val_loss"] == pytest.approx(0.05) and best.metrics["training_iteration"] == 2
    with best.checkpoint.as_directory() as d:
        with open(os.path.join(d, "state.json")) as fh:
            assert json.load(fh) == {"iteration": 2}
    assert grid.experiment_path.startswith(str(tmp_path / "runs"))
