"""`rubberband simulate --trials-per-gpu / --instance-types`: the columns, the JSON, the Gantt and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rubberband import load_experiment
from rubberband.simulator import simulate
from rubberband.simulator.trace import sample_timeline

from .helpers import assert_one_line_error, run

ROOT = Path(__file__).resolve().parents[3]
TYPES = "p3.8xlarge,p3.8xlarge,p3.16xlarge,p3.2xlarge"


@pytest.fixture()
def packed_job(tmp_path: Path) -> str:
    """The paper's job with a model profile that packs 2 and 4 trials to a GPU."""
    profile = yaml.safe_load((ROOT / "profiles" / "resnet101_cifar10_p3.yaml").read_text())
    one = profile["iter_latency_s"][1]["mean"]
    profile["packed_iter_latency_s"] = {2: {"dist": "constant", "value": 1.5 * one},
                                        4: {"dist": "constant", "value": 2.2 * one}}
    profile["gpu_memory_gb_per_trial"] = 3.5
    (tmp_path / "packed.yaml").write_text(yaml.safe_dump(profile))
    exp = yaml.safe_load((ROOT / "experiments" / "resnet101_cifar10.yaml").read_text())
    exp["model_profile"] = str(tmp_path / "packed.yaml")
    exp["cloud"]["profile"] = str(ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(exp))
    return str(path)


def test_packing_and_types_show_in_the_table_and_match_the_api(packed_job, capsys):
    code, out, err = run(capsys, "simulate", packed_job, "--allocation", "8,20,16,1", "--trials-per-gpu", "4,1,1,1",
                         "--instance-types", TYPES, "--samples", "50")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith("resnet101-cifar10 on p3.8xlarge, p3.16xlarge, p3.2xlarge (on-demand")
    assert lines[1].split()[:7] == ["stage", "trials", "iters", "GPUs", "GPUs/trial", "trials/GPU", "type"]
    assert [line.split()[5:9] for line in lines[3:7]] == [
        ["4", "p3.8xlarge", "2", "2"], ["1", "p3.8xlarge", "5", "3"], ["1", "p3.16xlarge", "3", "3"],
        ["1", "p3.2xlarge", "1", "1"]]
    code, out, _ = run(capsys, "simulate", packed_job, "--allocation", "8,20,16,1", "--trials-per-gpu", "4,1,1,1",
                       "--instance-types", TYPES, "--samples", "50", "--json")
    payload = json.loads(out)
    exp = load_experiment(packed_job)
    clouds = {t: exp.cloud_for(t) for t in TYPES.split(",")}
    expected = simulate(exp.spec, [8, 20, 16, 1], exp.model, clouds, samples=50, seed=exp.seed,
                        trials_per_gpu=[4, 1, 1, 1], instance_types=TYPES.split(","))
    assert payload["jct_s_mean"] == pytest.approx(expected.mean_jct_s, rel=1e-12)
    assert payload["cost_usd_mean"] == pytest.approx(expected.mean_cost_usd, rel=1e-12)
    assert payload["trials_per_gpu"] == [4, 1, 1, 1] and payload["instance_types"] == TYPES.split(",")


def test_the_gantt_of_a_packed_typed_plan(packed_job, tmp_path, capsys):
    png = tmp_path / "g.png"
    code, out, err = run(capsys, "simulate", packed_job, "--allocation", "8,20,16,1", "--trials-per-gpu", "4,1,1,1",
                         "--instance-types", TYPES, "--samples", "20", "--gantt", str(png), "--json")
    assert code == 0 and err == "", err
    payload = json.loads(out)
    assert png.stat().st_size > 10_000
    exp = load_experiment(packed_job)
    clouds = {t: exp.cloud_for(t) for t in TYPES.split(",")}
    timeline = sample_timeline(exp.spec, [8, 20, 16, 1], exp.model, clouds, seed=exp.seed, samples=20,
                               sample=payload["gantt_sample"], trials_per_gpu=[4, 1, 1, 1],
                               instance_types=TYPES.split(","))
    assert [s.instance_type for s in timeline.instances] == ["p3.8xlarge"] * 5 + ["p3.16xlarge"] * 3 + ["p3.2xlarge"]


@pytest.mark.parametrize(("argv", "needles"), [
    (["--trials-per-gpu", "8,1,1,1"], ["trials_per_gpu[0]: 8 trials per GPU has no packed_iter_latency_s"]),
    (["--trials-per-gpu", "2,2,1,1"], ["trials_per_gpu[1]: only 1-GPU trials are packed"]),
    (["--trials-per-gpu", "4,x"], ["--trials-per-gpu"]),
    (["--instance-types", "p3.8xlarge,p3.8xlarg,p3.16xlarge,p3.2xlarge"], ["p3.8xlarg", "did you mean"]),
    (["--instance-types", "p3.8xlarge,,p3.16xlarge,p3.2xlarge"], ["--instance-types: expected comma-separated"]),
    (["--instance-types", TYPES, "--instance-type", "p3.8xlarge"], ["either --instance-type"]),
])
def test_bad_packing_or_types_are_one_error_line(packed_job, capsys, argv, needles):
    code, out, err = run(capsys, "simulate", packed_job, "--allocation", "8,20,16,1", "--samples", "5", *argv)
    assert code != 0 and out == ""
    assert_one_line_error(err, *needles)
