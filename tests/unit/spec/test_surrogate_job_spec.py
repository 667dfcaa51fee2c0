"""The target stage of a surrogate job in the spec and the experiment file (DESIGN §4.6)."""

from __future__ import annotations

import pytest

from rubberband.errors import SpecError
from rubberband.spec.experiment import ExperimentSpec, Stage, Surrogate

from .test_surrogate import ROOT, SPACE, _experiment


def test_with_target_adds_one_last_stage_marked_as_the_target():
    tuning = ExperimentSpec.sha(16, 2, 40, 2)
    job = tuning.with_target(120)
    assert job.stages[-1] == Stage(1, 120, target=True) and job.target_stage == tuning.num_stages()
    assert job.tuning == tuning and tuning.target_stage is None
    assert job.describe().endswith("1x120 (target)")
    assert [b.stages for b in job.brackets()] == [tuning.stages]      # the target is no bracket's


@pytest.mark.parametrize(("build", "pattern"), [
    (lambda: ExperimentSpec.sha(4, 1, 4, 2).with_target(0), r"surrogate.target_iters: .*positive integer"),
    (lambda: ExperimentSpec.sha(4, 1, 4, 2).with_target(5).with_target(5), r"already ends in a target stage"),
    (lambda: Stage(2, 5, target=True), r"num_trials: a target stage trains the one winning config"),
    (lambda: ExperimentSpec((Stage(1, 5, target=True), Stage(1, 5))), r"stages\[0\]: the target stage .* must be the last"),
])
def test_a_misplaced_target_stage_is_one_error(build, pattern):
    with pytest.raises(SpecError, match=pattern):
        build()


def test_the_experiment_file_adds_the_target_stage_and_loads_both_profiles():
    from rubberband.config import experiment_from_dict

    sur = {"width_ratio": 8, "transfer": ["lr"], "target_iters": 60,
           "model_profile": str(ROOT / "profiles" / "demo_digits_local.yaml")}
    exp = experiment_from_dict(_experiment(sur), base=ROOT)
    assert exp.spec.stages[-1] == Stage(1, 60, target=True)
    model, target = exp.job_models()
    assert model is exp.surrogate_model and target is exp.model
    # No target_iters: as long as the tuning's longest trial (max_iters of the SHA).
    exp = experiment_from_dict(_experiment({"transfer": ["lr"]}), base=ROOT)
    assert exp.spec.stages[-1].iters == 40 and exp.surrogate_model is None
    with pytest.raises(SpecError, match=r"surrogate.model_profile: planning the surrogate stages needs"):
        exp.job_models()
    assert exp.spec_with_trials(32).target_stage is not None


@pytest.mark.parametrize(("surrogate", "pattern"), [
    ({"transfer": ["lr"], "target_iters": 0}, r"surrogate.target_iters: must be a positive integer"),
    ({"transfer": ["lr"], "target_iters": "long"}, r"surrogate.target_iters: expected a positive integer"),
    ({"transfer": ["lr"], "model_profile": 8}, r"surrogate.model_profile: expected the path"),
    ({"transfer": ["lr"], "model_profile": "nope.yaml"}, r"surrogate.model_profile: no such file"),
])
def test_bad_target_fields_are_one_line_naming_the_field(surrogate, pattern):
    from rubberband.config import experiment_from_dict

    with pytest.raises(SpecError, match=pattern):
        experiment_from_dict(_experiment(surrogate), base=ROOT)


def test_surrogate_defaults_keep_the_mup_fields():
    assert Surrogate.from_dict({"transfer": ["lr"]}, SPACE) == Surrogate(8, ("lr",))
