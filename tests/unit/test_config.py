"""Experiment files: loading the shipped examples, path resolution, the job forms, and errors."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import yaml

from rubberband import Billing, BillingModel, ExperimentSpec, Market, SpecError, load_experiment
from rubberband.config import experiment_from_dict
from rubberband.errors import RubberbandWarning
from rubberband.profiles import Constant, DataCost, Normal

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml"))
MODEL = ROOT / "profiles" / "resnet101_cifar10_p3.yaml"
AWS = ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml"


def base(**changes) -> dict:
    data = {
        "name": "t",
        "sha": {"num_trials": 32, "min_iters": 1, "max_iters": 50, "eta": 3},
        "model_profile": str(MODEL),
        "cloud": {"profile": str(AWS), "instance_type": "p3.8xlarge"},
        "deadline": "20m",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def test_there_are_shipped_experiments():
    assert {p.name for p in EXPERIMENTS} >= {"resnet101_cifar10.yaml", "resnet50_sha64.yaml", "resnet50_sha512.yaml"}


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_every_shipped_experiment_loads(path):
    exp = load_experiment(path)
    assert exp.spec.num_stages() >= 1
    assert exp.model.gpu_counts[0] == 1
    assert exp.cloud.gpus_per_instance >= 1
    assert exp.cloud.instance_type == exp.instance_type
    assert exp.deadline_s and exp.deadline_s > 0


def test_resnet101_cifar10_resolves_as_the_paper_job():
    exp = load_experiment(ROOT / "experiments" / "resnet101_cifar10.yaml")
    assert exp.name == "resnet101-cifar10"
    assert exp.spec.stages == ExperimentSpec.sha(32, 1, 50, 3).stages
    assert exp.deadline_s == 1200.0
    assert (exp.policy, exp.samples, exp.seed) == ("optimal", 1000, 0)
    assert (exp.metric, exp.mode) == ("val_acc", "max")
    cloud = exp.cloud
    assert cloud.instance_type == "p3.8xlarge"
    assert cloud.price_usd_per_hour == 12.24
    # The experiment's overrides replace the region file's latencies; data merges key by key.
    assert cloud.provision_latency_s == Constant(15.0)
    assert cloud.init_latency_s == Constant(15.0)
    assert cloud.data == DataCost(0.15, 0.0)


def test_resnet50_sha512_keeps_the_region_default_provisioning():
    exp = load_experiment(ROOT / "experiments" / "resnet50_sha512.yaml")
    assert exp.spec.get_stage(exp.spec.num_stages() - 1) == (1, 2052)
    assert exp.cloud.init_latency_s == Constant(1.0)
    assert exp.cloud.provision_latency_s == Normal(30.0, 8.0)
    assert exp.samples == 200


def test_relative_paths_resolve_against_the_experiment_file(tmp_path, monkeypatch):
    folder = tmp_path / "jobs"
    folder.mkdir()
    data = base(model_profile=os.path.relpath(MODEL, folder))
    data["cloud"]["profile"] = os.path.relpath(AWS, folder)
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)          # somewhere else: the paths must not depend on it
    exp = load_experiment(path)
    assert exp.model.name == "resnet101-cifar10-bs1024"
    assert exp.name == "t"


def test_name_defaults_to_the_file_stem(tmp_path):
    path = tmp_path / "my_job.yaml"
    path.write_text(yaml.safe_dump(base(name=None)))
    assert load_experiment(path).name == "my_job"


def test_defaults():
    exp = experiment_from_dict(base(deadline=None))
    assert exp.deadline_s is None
    assert (exp.policy, exp.samples, exp.seed, exp.metric, exp.mode) == ("optimal", 1000, 0, "loss", "min")
    assert exp.market is Market.ON_DEMAND
    assert exp.confidence is None
    assert exp.trainer is None
    assert exp.search_space == {}


@pytest.mark.parametrize(
    "stages",
    [[[32, 1], [10, 3], [3, 9], [1, 37]],
     [{"num_trials": 32, "iters": 1}, {"num_trials": 10, "iters": 3}, [3, 9], {"num_trials": 1, "iters": 37}]],
)
def test_explicit_stages(stages):
    exp = experiment_from_dict(base(sha=None, stages=stages))
    assert exp.spec.stages == ExperimentSpec.sha(32, 1, 50, 3).stages


def test_hyperband_job_is_its_brackets_chained():
    exp = experiment_from_dict(base(sha=None, hyperband={"min_iters": 1, "max_iters": 81}))
    assert exp.spec.eta == 3                     # HyperBand's default eta
    assert exp.spec.brackets() == ExperimentSpec.hyperband(1, 81, 3)


def test_inline_model_profile():
    exp = experiment_from_dict(base(model_profile={"name": "inline", "iter_latency_s": {1: 4.0, 2: 2.2}}))
    assert exp.model.name == "inline"
    assert exp.model.latency(2) == Constant(2.2)


def test_spot_market_and_auto_instance_type():
    spot = experiment_from_dict(base(cloud={"profile": str(AWS), "instance_type": "p3.8xlarge", "market": "spot"}))
    assert spot.cloud.hourly_usd == 1.4129
    auto = experiment_from_dict(base(cloud={"profile": str(AWS), "instance_type": "auto"}))
    assert auto.auto_instance_type
    assert auto.cloud.instance_type == auto.catalog.instance_types[0]


def test_trainer_file_resolves_to_an_absolute_path(tmp_path):
    (tmp_path / "train.py").write_text("class Train: pass\n")
    exp = experiment_from_dict(base(trainer="train.py:Train"), base=tmp_path)
    assert exp.trainer == f"{(tmp_path / 'train.py').resolve()}:Train"
    assert experiment_from_dict(base(trainer="my_pkg.models:Train")).trainer == "my_pkg.models:Train"


def test_search_space_forms_are_accepted():
    space = {
        "lr": {"loguniform": [1e-4, 1e-1]},
        "momentum": {"uniform": [0.8, 0.99]},
        "batch": [128, 256],
        "depth": {"choice": [18, 50]},
        "width": {"quniform": [32, 256, 32]},
        "noise": {"randn": [0, 1]},
        "optimizer": "sgd",
    }
    assert experiment_from_dict(base(search_space=space)).search_space == space


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"cloud": None}, r"^experiment\.cloud: missing required field"),
        ({"model_profile": None}, r"^experiment\.model_profile: missing required field"),
        ({"dealine": "20m"}, r"^experiment\.dealine: unknown key \(did you mean `deadline`\?\)"),
        ({"sha": {"num_trials": 0, "min_iters": 1, "max_iters": 50}}, r"^sha\.num_trials: must be at least 1"),
        ({"sha": {"num_trials": 32, "min_iters": 1, "max_iters": 50, "eta": 1}}, r"^sha\.eta: must be at least 2"),
        ({"sha": {"num_trials": 32, "min_iters": 1}}, r"^sha\.max_iters: missing required field"),
        ({"sha": {"num_trials": 32, "min_iters": 10, "max_iters": 5}}, r"^max_iters: 5 is below min_iters 10"),
        ({"sha": None, "stages": [[4, 1], [2, 0]]}, r"^stages\[1\]\.iters: must be at least 1"),
        ({"sha": None, "stages": [[4, 1], [8, 2]]}, r"^stages\[1\]\.num_trials: 8 is more than the 4 trials"),
        ({"sha": None, "stages": [[4, 1, 2]]}, r"^stages\[0\]: expected \[num_trials, iters\]"),
        ({"sha": None, "stages": []}, r"^stages: expected a non-empty list"),
        ({"sha": None}, r"^experiment: give exactly one of `sha:`, `stages:` or `hyperband:`"),
        ({"stages": [[4, 1]]}, r"^experiment: give exactly one of .*\(found sha, stages\)"),
        ({"hyperband": {"min_iters": 1, "max_iters": 9, "eta": 1}, "sha": None}, r"^hyperband\.eta: must be at least 2"),
        ({"cloud": {"profile": str(AWS)}}, r"^cloud\.instance_type: missing required field"),
        ({"cloud": {"profile": str(AWS), "instance_type": "p3.8xlarge", "region": "x"}}, r"^cloud\.region: unknown key"),
        ({"cloud": {"profile": str(AWS), "instance_type": "p3.8xlarg"}}, r"instance_type: 'p3\.8xlarg'.*did you mean `p3\.8xlarge`"),
        ({"cloud": {"profile": "nope.yaml", "instance_type": "p3.8xlarge"}}, r"^cloud\.profile: no such file 'nope\.yaml'"),
        ({"cloud": {"profile": str(AWS), "instance_type": "p3.8xlarge", "overrides": {"init": 1}}}, r"^cloud\.overrides\.init: unknown key"),
        ({"cloud": {"profile": str(AWS), "instance_type": "p3.8xlarge", "overrides": [1]}}, r"^cloud\.overrides: expected a mapping"),
        ({"cloud": {"profile": str(AWS), "instance_type": "p3.8xlarge", "overrides": {"price_usd_per_hour": 0}}},
         r"^cloud\.overrides\.price_usd_per_hour: must be greater than 0, got 0$"),
        ({"cloud": {"profile": str(AWS), "instance_type": "p3.8xlarge", "market": "spot", "overrides": {"spot_price_usd_per_hour": 0}}},
         r"^cloud\.overrides\.spot_price_usd_per_hour: must be greater than 0, got 0$"),
        ({"cloud": {"profile": str(AWS), "instance_type": "auto", "overrides": {"price_usd_per_hour": -1}}},
         r"^cloud\.overrides\.price_usd_per_hour: must be greater than 0, got -1$"),
        ({"cloud": {"profile": str(AWS), "instance_type": "p3.8xlarge", "overrides": {"billing": {"granularity_s": 0}}}},
         r"^cloud\.overrides\.billing\.granularity_s: must be greater than 0, got 0$"),
        ({"model_profile": "nope.yaml"}, r"^model_profile: no such file 'nope\.yaml'"),
        ({"deadline": "soon"}, r"^deadline: expected a duration such as 90s, 20m or 1\.5h, got 'soon'"),
        ({"deadline": -5}, r"^deadline: must be a positive duration"),
        ({"policy": "greedyy"}, r"^policy: unknown value 'greedyy' \(did you mean `greedy`\?\)"),
        ({"samples": 0}, r"^samples: must be at least 1"),
        ({"seed": -1}, r"^seed: must be at least 0"),
        ({"mode": "median"}, r"^mode: unknown value 'median'.*min, max"),
        ({"confidence": 1.5}, r"^confidence: must be between 0 and 1"),
        ({"confidence": 0}, r"^confidence: must be between 0 and 1"),
        ({"trainer": "not a trainer!"}, r"^trainer: expected `package\.module:Name`"),
        ({"trainer": "missing.py:Train"}, r"^trainer: no such file 'missing\.py'"),
        ({"search_space": {"lr": {"logunif": [1e-4, 1e-1]}}}, r"^search_space\.lr: unknown value 'logunif' \(did you mean `loguniform`\?\)"),
        ({"search_space": {"lr": {"loguniform": [0, 1]}}}, r"^search_space\.lr\.loguniform: low must be positive"),
        ({"search_space": {"lr": {"uniform": [2, 1]}}}, r"^search_space\.lr\.uniform: high 1 must exceed low 2"),
        ({"search_space": {"lr": []}}, r"^search_space\.lr: an empty list"),
        ({"search_space": [1, 2]}, r"^search_space: expected a mapping"),
        ({"global_batch_size": 0}, r"^global_batch_size: must be at least 1"),
    ],
)
def test_errors_name_the_field(changes, pattern):
    with pytest.raises(SpecError, match=pattern):
        experiment_from_dict(base(**changes))


def test_a_partial_billing_override_merges_with_the_profiles_billing():
    # us-east-1 bills per instance by the second with a 60 s minimum; only the minimum changes.
    overrides = {"billing": {"minimum_s": 0}, "data": {"dataset_gb": 2.0}}
    exp = experiment_from_dict(base(cloud={"profile": str(AWS), "instance_type": "p3.8xlarge", "overrides": overrides}))
    assert exp.cloud.billing == Billing(BillingModel.PER_INSTANCE, granularity_s=1.0, minimum_s=0.0)
    assert (exp.cloud.data.dataset_gb, exp.cloud.data.price_usd_per_gb) == (2.0, 0.0)


def test_error_messages_are_one_line():
    for changes in ({"dealine": "20m"}, {"cloud": {"profile": str(AWS), "instance_type": "p3.8xlarg"}}):
        with pytest.raises(SpecError) as info:
            experiment_from_dict(base(**changes))
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        ("", r"the file is empty"),
        ("a: [1, 2", r"not valid YAML at line 1"),
        ("- 1\n- 2\n", r"expected a YAML mapping at the top level, got list"),
        (bytes(range(256)), r"not a text file"),
    ],
    ids=["empty", "not-yaml", "list", "binary"],
)
def test_file_level_errors(tmp_path, content, pattern):
    path = tmp_path / "job.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(SpecError, match=pattern):
        load_experiment(path)


def test_missing_experiment_file(tmp_path):
    with pytest.raises(SpecError, match="experiment: no such file"):
        load_experiment(tmp_path / "absent.yaml")


def test_a_model_profile_given_instead_silences_the_replaced_ones_warning(tmp_path):
    slow = tmp_path / "slow.yaml"
    slow.write_text("name: slow\niter_latency_s: {1: 4.0, 2: 5.0}\n")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(base(model_profile=str(slow))))
    with pytest.warns(RubberbandWarning, match=r"^model profile 'slow': more GPUs per trial make an iteration slower"):
        load_experiment(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RubberbandWarning)
        assert load_experiment(path, model_profile=MODEL).model.name == "resnet101-cifar10-bs1024"


# --- one model profile per GPU model (issue #14 item 4) ---------------------------------------
A10G = {"name": "on-a10g", "iter_latency_s": {1: {"dist": "constant", "value": 100.0}, 4: {"dist": "constant", "value": 30.0}}}


def test_model_profile_may_give_one_profile_per_gpu_model():
    exp = experiment_from_dict(base(model_profile={"V100": str(MODEL), "A10G": A10G}))
    assert set(exp.models) == {"V100", "A10G"}
    assert exp.model is exp.models["V100"]                   # p3.8xlarge has V100s
    assert exp.models["A10G"].measured_on["gpu_model"] == "A10G"  # the key says what it was measured on
    assert exp.model_for_planning == exp.models
    g5 = experiment_from_dict(base(model_profile={"V100": str(MODEL), "A10G": A10G},
                                   cloud={"profile": str(AWS), "instance_type": "g5.12xlarge"}))
    assert g5.model.name == "on-a10g"
    single = experiment_from_dict(base())
    assert single.models == {} and single.model_for_planning is single.model
    assert set(experiment_from_dict(base(model_profile={"v100": str(MODEL)})).models) == {"V100"}   # the catalog's spelling


@pytest.mark.parametrize("profiles, instance_type, match", [
    ({"V1OO": str(MODEL)}, "p3.8xlarge", r"^model_profile\.V1OO: 'V1OO' is no GPU model of .*us-east-1\.yaml; its types have A100, .*V100"),
    ({"V100": str(MODEL), "v100": str(MODEL)}, "p3.8xlarge", r"^model_profile\.v100: V100 and v100 name one GPU model; keep one"),
    ({"A10G": str(MODEL)}, "g5.xlarge", r"^model_profile\.A10G: profile 'resnet101-cifar10-bs1024' was measured on V100, not A10G; list it under V100"),
    ({"A10G": A10G}, "p3.8xlarge", r"^cloud\.instance_type: p3\.8xlarge has V100 GPUs but the model profiles cover A10G only; add a V100"),
    ({}, "p3.8xlarge", r"^model_profile: expected a profile's path, or a mapping of GPU model to profile path"),
    ({"V100": "nope.yaml"}, "p3.8xlarge", r"^model_profile\.V100: no such file 'nope\.yaml'"),
])
def test_bad_per_gpu_model_profiles_are_one_line_errors(profiles, instance_type, match):
    with pytest.raises(SpecError, match=match):
        experiment_from_dict(base(model_profile=profiles, cloud={"profile": str(AWS), "instance_type": instance_type}))


def test_time_attr_names_the_metric_that_counts_iterations():
    assert experiment_from_dict(base()).time_attr is None
    assert experiment_from_dict(base(time_attr="epoch")).time_attr == "epoch"


@pytest.mark.parametrize("bad", ["", "  ", 3, ["epoch"]])
def test_a_bad_time_attr_is_one_line_naming_the_field(bad):
    with pytest.raises(SpecError, match=r"^time_attr: expected the name of the metric that counts a trial's iterations"):
        experiment_from_dict(base(time_attr=bad))
