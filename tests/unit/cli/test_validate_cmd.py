"""`rubberband validate`: shipped experiments pass; malformed files fail with one `error:` line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rubberband import load_experiment
from rubberband.cli.main import main

ROOT = Path(__file__).resolve().parents[3]
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml"))
MODEL = ROOT / "profiles" / "resnet101_cifar10_p3.yaml"
AWS = ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml"
G5_CLUSTER = ROOT / "clusters" / "aws-g5-us-east-1.yaml"


def experiment(**changes) -> dict:
    data = {
        "name": "t",
        "sha": {"num_trials": 32, "min_iters": 1, "max_iters": 50, "eta": 3},
        "model_profile": str(MODEL),
        "cloud": {"profile": str(AWS), "instance_type": "p3.8xlarge"},
        "deadline": "20m",
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def sha(**changes) -> dict:
    return {"sha": {"num_trials": 32, "min_iters": 1, "max_iters": 50, "eta": 3, **changes}}


def write(tmp_path: Path, content: dict | str | bytes) -> Path:
    path = tmp_path / "job.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(yaml.safe_dump(content))
    return path


def run_validate(path: Path, capsys, *extra: str) -> tuple[int, str, str]:
    code = main(["validate", str(path), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_error_line(code: int, out: str, err: str, pattern: str) -> None:
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in out + err


# --- the shipped experiments --------------------------------------------------------------

@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_shipped_experiment_validates(path, capsys):
    code, out, err = run_validate(path, capsys)
    assert code == 0
    assert err == ""
    exp = load_experiment(path)
    assert out.startswith(f"experiment {exp.name}: OK ({exp.spec.describe()})")
    assert f"instance type  {exp.instance_type} in {exp.catalog.provider}/{exp.catalog.region}" in out


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_shipped_experiment_validates_as_json(path, capsys):
    code, out, err = run_validate(path, capsys, "--json")
    assert code == 0
    assert err == ""
    payload = json.loads(out)
    exp = load_experiment(path)
    assert payload["name"] == exp.name
    assert [(s["num_trials"], s["iters"]) for s in payload["stages"]] == [
        exp.spec.get_stage(i) for i in range(exp.spec.num_stages())
    ]
    assert payload["deadline_s"] == exp.deadline_s
    assert payload["instance_type"] == exp.instance_type
    assert payload["cloud"][0]["gpus_per_instance"] == exp.cloud.gpus_per_instance
    assert payload["model_profile"]["gpu_counts"] == list(exp.model.gpu_counts)


def test_json_of_the_paper_job(capsys):
    code, out, _ = run_validate(ROOT / "experiments" / "resnet101_cifar10.yaml", capsys, "--json")
    payload = json.loads(out)
    assert code == 0
    assert payload["stages"] == [
        {"num_trials": 32, "iters": 1}, {"num_trials": 10, "iters": 3},
        {"num_trials": 3, "iters": 9}, {"num_trials": 1, "iters": 37},
    ]
    assert payload["deadline_s"] == 1200
    assert payload["cloud"][0]["init_latency_s"] == {"dist": "constant", "value": 15}
    assert payload["model_profile"]["gpu_counts"] == [1, 2, 4, 8, 16, 32]


# --- malformed files ----------------------------------------------------------------------

MALFORMED = {
    "missing-cloud": (experiment(cloud=None), r"experiment\.cloud: missing required field"),
    "missing-model-profile": (experiment(model_profile=None), r"experiment\.model_profile: missing required field"),
    "unknown-top-level-key": (experiment(dealine="20m"), r"experiment\.dealine: unknown key \(did you mean `deadline`\?\)"),
    "negative-num-trials": (experiment(**sha(num_trials=-3)), r"sha\.num_trials: must be at least 1"),
    "zero-num-trials": (experiment(**sha(num_trials=0)), r"sha\.num_trials: must be at least 1"),
    "zero-min-iters": (experiment(**sha(min_iters=0)), r"sha\.min_iters: must be at least 1"),
    "zero-max-iters": (experiment(**sha(max_iters=0)), r"sha\.max_iters: must be at least 1"),
    "negative-max-iters": (experiment(**sha(max_iters=-50)), r"sha\.max_iters: must be at least 1"),
    "zero-stage-iters": (experiment(sha=None, stages=[[4, 1], [2, 0]]), r"stages\[1\]\.iters: must be at least 1"),
    "negative-stage-trials": (experiment(sha=None, stages=[{"num_trials": -4, "iters": 2}]), r"stages\[0\]\.num_trials"),
    "eta-1": (experiment(**sha(eta=1)), r"sha\.eta: must be at least 2"),
    "eta-0": (experiment(**sha(eta=0)), r"sha\.eta:"),
    "unknown-instance-type": (
        experiment(cloud={"profile": str(AWS), "instance_type": "p3.8xlarg"}),
        r"instance_type: 'p3\.8xlarg' .*\(did you mean `p3\.8xlarge`\?\)",
    ),
    "non-numeric-deadline": (experiment(deadline="soon"), r"deadline: expected a duration .* got 'soon'"),
    "empty-file": ("", r"job\.yaml: the file is empty"),
    "not-yaml": ("a: [1, 2", r"job\.yaml: not valid YAML at line 1"),
    "yaml-list": ("- 1\n- 2\n", r"job\.yaml: expected a YAML mapping at the top level, got list"),
    "binary-file": (bytes(range(256)) * 4, r"job\.yaml: not a text file"),
    "missing-model-profile-file": (experiment(model_profile="nope.yaml"), r"model_profile: no such file 'nope\.yaml'"),
    "sha-and-stages": (experiment(stages=[[4, 1]]), r"exactly one of `sha:`, `stages:` or `hyperband:`.*found sha, stages"),
    "bad-search-space-sampler": (
        experiment(search_space={"lr": {"logunif": [1e-4, 1e-1]}}),
        r"search_space\.lr: unknown value 'logunif' \(did you mean `loguniform`\?\)",
    ),
    "bad-trainer": (experiment(trainer="not a trainer!"), r"trainer: expected `package\.module:Name`"),
    "mode-median": (experiment(mode="median"), r"mode: unknown value 'median'"),
    "confidence-1.5": (experiment(confidence=1.5), r"confidence: must be between 0 and 1.* got 1\.5"),
    "unknown-cloud-override": (
        experiment(cloud={"profile": str(AWS), "instance_type": "p3.8xlarge", "overrides": {"init_latncy_s": 3}}),
        r"cloud\.overrides\.init_latncy_s: unknown key \(did you mean `init_latency_s`\?\)",
    ),
    "unknown-policy": (experiment(policy="optimall"), r"policy: unknown value 'optimall' \(did you mean `optimal`\?\)"),
    "free-instance-override": (
        experiment(cloud={"profile": str(AWS), "instance_type": "p3.8xlarge", "overrides": {"price_usd_per_hour": 0}}),
        r"^error: cloud\.overrides\.price_usd_per_hour: must be greater than 0, got 0$",
    ),
    "zero-billing-granularity-override": (
        experiment(cloud={"profile": str(AWS), "instance_type": "p3.8xlarge", "overrides": {"billing": {"granularity_s": 0}}}),
        r"^error: cloud\.overrides\.billing\.granularity_s: must be greater than 0, got 0$",
    ),
    "duplicate-key": (
        "name: t\ndeadline: 20m\nname: u\n",
        r"^error: .*job\.yaml: not valid YAML at line 3, column 1: duplicate key `name` \(first given at line 1\); keep one of them$",
    ),
}


@pytest.mark.parametrize(("content", "pattern"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_file_gives_one_error_line(tmp_path, capsys, content, pattern):
    code, out, err = run_validate(write(tmp_path, content), capsys)
    assert_one_error_line(code, out, err, pattern)


@pytest.mark.parametrize(("content", "pattern"), list(MALFORMED.values())[:4], ids=list(MALFORMED)[:4])
def test_malformed_file_with_json_flag_still_one_error_line(tmp_path, capsys, content, pattern):
    code, out, err = run_validate(write(tmp_path, content), capsys, "--json")
    assert_one_error_line(code, out, err, pattern)
    assert out == ""


def test_missing_experiment_file(tmp_path, capsys):
    code, out, err = run_validate(tmp_path / "absent.yaml", capsys)
    assert_one_error_line(code, out, err, r"experiment: no such file")


def test_eta_0_error_states_the_allowed_range(tmp_path, capsys):
    code, out, err = run_validate(write(tmp_path, experiment(**sha(eta=0))), capsys)
    assert_one_error_line(code, out, err, r"sha\.eta: must be at least 2")


@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
def test_non_finite_integer_field_is_a_spec_error(tmp_path, capsys, value):
    code, out, err = run_validate(write(tmp_path, experiment(**sha(num_trials=value))), capsys)
    assert_one_error_line(code, out, err, r"sha\.num_trials")


def test_python_dash_m_prints_one_error_line_and_exits_2(tmp_path):
    path = write(tmp_path, experiment(dealine="20m"))
    proc = subprocess.run(
        [sys.executable, "-m", "rubberband", "validate", str(path)],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: experiment.dealine: unknown key (did you mean `deadline`?)")
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stdout == ""


def test_a_profile_slower_with_more_gpus_validates_with_one_warning_line(tmp_path, capsys):
    model = tmp_path / "slow.yaml"
    model.write_text("name: slow\niter_latency_s: {1: 4.0, 2: 5.0}\n")
    code, out, err = run_validate(write(tmp_path, experiment(model_profile=str(model))), capsys)
    assert code == 0
    assert out.startswith("experiment t: OK")
    assert err.splitlines() == [
        "warning: model profile 'slow': more GPUs per trial make an iteration slower: 2 GPUs (5s) slower than 1 (4s); "
        "check the profile if the model should speed up with more GPUs"
    ]


def test_a_zero_iteration_time_is_one_error_line_naming_the_gpu_count(tmp_path, capsys):
    model = tmp_path / "zero.yaml"
    model.write_text("iter_latency_s: {1: 0, 2: 0}\n")
    code, out, err = run_validate(write(tmp_path, experiment(model_profile=str(model))), capsys)
    assert_one_error_line(code, out, err, r"^error: .*zero\.yaml\.iter_latency_s\.1: the mean time per iteration with 1 GPU per trial "
                                         r"must be greater than 0 s, got 0")


# --- what only validate checks: the cluster YAML and the trainer ---------------------------

def test_a_cluster_that_is_not_a_ray_cluster_yaml_is_one_error_line(tmp_path, capsys):
    code, out, err = run_validate(write(tmp_path, experiment(cluster=str(MODEL))), capsys)
    assert_one_error_line(code, out, err, r"^error: cluster: \S*resnet101_cifar10_p3\.yaml: .*unknown key")


def test_a_cluster_without_a_worker_for_the_instance_type_is_one_error_line(tmp_path, capsys):
    code, out, err = run_validate(write(tmp_path, experiment(cluster=str(G5_CLUSTER))), capsys)
    assert_one_error_line(code, out, err, r"^error: cluster: \S*aws-g5-us-east-1\.yaml: .*no worker type launches p3\.8xlarge")


def test_an_auto_instance_type_needs_one_type_the_cluster_launches(tmp_path, capsys):
    auto = {"profile": str(AWS), "instance_type": "auto"}
    code, out, err = run_validate(write(tmp_path, experiment(cloud=auto, cluster=str(G5_CLUSTER))), capsys)
    assert (code, err) == (0, "")
    assert out.startswith("experiment t: OK")


def test_validate_reads_the_cluster_yaml_without_importing_boto3_or_ray(tmp_path):
    path = write(tmp_path, experiment(cloud={"profile": str(AWS), "instance_type": "g5.xlarge"}, cluster=str(G5_CLUSTER)))
    probe = ("import sys; from rubberband.cli.main import main; code = main(['validate', sys.argv[1]]); "
             "print(sorted(m for m in ('boto3', 'botocore', 'ray') if m in sys.modules)); sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("experiment t: OK")
    assert proc.stdout.splitlines()[-1] == "[]"


TRAINERS = {
    "no-such-module": ("nosuchpkg.trainers:Net", None, r"^error: trainer: cannot load 'nosuchpkg\.trainers:Net': No module named 'nosuchpkg'$"),
    "no-such-class": ("rubberband.examples.digits:DigitsMPL", None, r"^error: trainer: cannot load 'rubberband\.examples\.digits:DigitsMPL'"),
    "syntax-error": ("bad.py:Net", "class Net(:\n", r"^error: trainer: cannot load '\S*bad\.py:Net': SyntaxError: "),
    "failing-import": ("bad.py:Net", "import not_installed_pkg\n", r"^error: trainer: cannot load '\S*bad\.py:Net': .*not_installed_pkg"),
    "constructor-needs-args": ("bad.py:Net", "class Net:\n    def __init__(self, depth): pass\n",
                               r"^error: trainer: cannot load '\S*bad\.py:Net': TypeError: .*depth"),
    "not-a-trainer": ("bad.py:Net", "class Net:\n    pass\n",
                      r"^error: trainer: '\S*bad\.py:Net' has no build_model, build_optimizer, build_data; subclass rubberband\.Trainer$"),
}


@pytest.mark.parametrize(("trainer", "source", "pattern"), TRAINERS.values(), ids=TRAINERS.keys())
def test_a_trainer_that_cannot_be_loaded_is_one_error_line(tmp_path, capsys, trainer, source, pattern):
    if source is not None:
        (tmp_path / "bad.py").write_text(source)
    code, out, err = run_validate(write(tmp_path, experiment(trainer=trainer)), capsys)
    assert_one_error_line(code, out, err, pattern)


def test_a_trainer_file_that_loads_validates(tmp_path, capsys):
    (tmp_path / "mine.py").write_text("from rubberband import Trainer\n\nclass Mine(Trainer):\n    pass\n")
    code, out, err = run_validate(write(tmp_path, experiment(trainer="mine.py:Mine")), capsys)
    assert (code, err) == (0, "")
    assert f"trainer        {tmp_path / 'mine.py'}:Mine" in out


def test_iters_so_far_restart_with_each_hyperband_bracket(tmp_path, capsys):
    path = write(tmp_path, experiment(sha=None, hyperband={"min_iters": 1, "max_iters": 9, "eta": 3}))
    code, out, _ = run_validate(path, capsys)
    exp = load_experiment(path)
    assert code == 0
    assert exp.spec.bracket_starts == (0, 3, 5)
    rows = [line.split() for line in out.splitlines()[4:4 + exp.spec.num_stages()]]
    # (stage, trials, iters, iters so far): each bracket's trials are new, so their count starts again.
    assert [[int(v) for v in row] for row in rows] == [
        [0, 9, 1, 1], [1, 3, 3, 4], [2, 1, 5, 9],
        [3, 5, 3, 3], [4, 1, 6, 9],
        [5, 3, 9, 9],
    ]
