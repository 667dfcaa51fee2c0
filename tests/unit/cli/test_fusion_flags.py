"""`--fused-per-gpu` (DESIGN §4.5): `simulate` shows and simulates fused stages as the API does,
`plan` shows what it fused, and `run` runs fused stages (on `sim` here; on local Ray in
tests/integration/test_fusion_local.py), each bad input one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rubberband import load_experiment
from rubberband.simulator import simulate

from .helpers import ROOT, assert_one_line_error, run


def fused_job(tmp_path: Path, source: str = "resnet101_cifar10", profile: str = "resnet101_cifar10_p3") -> str:
    """A shipped experiment whose profile fuses: 3x the throughput at F = 8, 2x at 4."""
    data = yaml.safe_load((ROOT / "profiles" / f"{profile}.yaml").read_text())
    one = data["iter_latency_s"][1]["mean"]
    data["fused_iter_latency_s"] = {4: {"dist": "constant", "value": 2.0 * one},
                                    8: {"dist": "constant", "value": 8 / 3 * one}}
    (tmp_path / "fused.yaml").write_text(yaml.safe_dump(data))
    exp = yaml.safe_load((ROOT / "experiments" / f"{source}.yaml").read_text())
    exp["model_profile"] = str(tmp_path / "fused.yaml")
    exp["cloud"]["profile"] = str((ROOT / "experiments" / exp["cloud"]["profile"]).resolve())
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(exp))
    return str(path)


def test_simulate_fused_per_gpu_shows_the_column_and_matches_the_api(tmp_path, capsys):
    job = fused_job(tmp_path)
    code, out, err = run(capsys, "simulate", job, "--allocation", "4,10,4,1", "--fused-per-gpu", "8,1,1,1",
                         "--samples", "50")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[1].split()[:6] == ["stage", "trials", "iters", "GPUs", "GPUs/trial", "fused/GPU"]
    assert [line.split()[5] for line in lines[3:7]] == ["8", "1", "1", "1"]
    code, out, _ = run(capsys, "simulate", job, "--allocation", "4,10,4,1", "--fused-per-gpu", "8,1,1,1",
                       "--samples", "50", "--json")
    payload = json.loads(out)
    exp = load_experiment(job)
    expected = simulate(exp.spec, [4, 10, 4, 1], exp.model, exp.cloud, samples=50, seed=exp.seed,
                        fused_per_gpu=[8, 1, 1, 1])
    assert payload["jct_s_mean"] == pytest.approx(expected.mean_jct_s, rel=1e-12)
    assert payload["fused_per_gpu"] == [8, 1, 1, 1]


@pytest.mark.parametrize("argv, needles", [
    (["--fused-per-gpu", "8,1"], ["fused_per_gpu: expected 4 trials fused per GPU, one per stage"]),
    (["--fused-per-gpu", "2,1,1,1"], ["fused_per_gpu[0]: 2 trials fused per GPU has no fused_iter_latency_s",
                                      "profiled: 4, 8"]),
    (["--fused-per-gpu", "8,1,1,1", "--trials-per-gpu", "2,1,1,1"], ["fused_per_gpu[0]", "exclusive"]),
    (["--fused-per-gpu", "x"], ["--fused-per-gpu: expected comma-separated whole numbers"]),
])
def test_simulate_bad_fusion_is_one_line(tmp_path, capsys, argv, needles):
    code, out, err = run(capsys, "simulate", fused_job(tmp_path), "--allocation", "4,10,4,1", "--samples", "20", *argv)
    assert code != 0 and out == ""
    assert_one_line_error(err, *needles)


def test_plan_shows_the_fused_stages(tmp_path, capsys):
    code, out, _ = run(capsys, "plan", fused_job(tmp_path), "--samples", "50", "--deadline", "60m", "--json")
    assert code == 0
    planned = json.loads(out)
    assert any(f > 1 for f in planned["fused_per_gpu"])
    code, out, _ = run(capsys, "plan", fused_job(tmp_path), "--samples", "50", "--deadline", "60m")
    assert "fused/GPU" in out.splitlines()[1]


def demo_fused(tmp_path: Path) -> str:
    return fused_job(tmp_path, "demo", "demo_digits_local")


def test_run_takes_a_fused_allocation_to_the_executor(tmp_path, capsys, no_execution):
    code, _, err = run(capsys, "run", demo_fused(tmp_path), "--samples", "30", "--allocation", "2,2,1,1,1",
                       "--fused-per-gpu", "8,4,1,1,1")
    (plan,) = no_execution
    assert plan.fused_per_gpu == (8, 4, 1, 1, 1)


def test_run_takes_a_fused_plan_file_and_plans_with_fusion(tmp_path, capsys, no_execution):
    job = demo_fused(tmp_path)
    out_json = tmp_path / "plan.json"
    code, _, _ = run(capsys, "plan", job, "--samples", "30", "--deadline", "1h", "--out", str(out_json))
    fused = json.loads(out_json.read_text())["fused_per_gpu"]
    assert code == 0 and any(f > 1 for f in fused)
    run(capsys, "run", job, "--plan", str(out_json))
    run(capsys, "run", job, "--samples", "30", "--deadline", "1h")
    from_file, planned = no_execution
    assert list(from_file.fusion) == fused and any(f > 1 for f in planned.fusion)


def test_run_rehearses_a_fused_plan_on_sim_and_reports_the_fused_stages(tmp_path, capsys):
    code, out, err = run(capsys, "run", demo_fused(tmp_path), "--provider", "sim", "--samples", "30",
                         "--allocation", "2,2,1,1,1", "--fused-per-gpu", "8,4,1,1,1", "--runs-dir", str(tmp_path))
    assert code == 0, err
    assert "stage 0: 8 trials fused per GPU (one program per GPU)" in out
    assert "stage 1: 4 trials fused per GPU (one program per GPU)" in out
    assert out.splitlines()[[i for i, line in enumerate(out.splitlines()) if line == "predicted vs actual"][0] + 1].split()[3] \
        == "fused/GPU"


@pytest.mark.parametrize("argv, needles", [
    (["--fused-per-gpu", "8,4,1,1,1"], ["--fused-per-gpu: goes with --allocation"]),
    (["--plan", "p.json", "--fused-per-gpu", "8,4,1,1,1"], ["--fused-per-gpu: goes with --allocation",
                                                            "a plan file has its own"]),
])
def test_run_fused_per_gpu_without_an_allocation_is_one_line(tmp_path, capsys, no_execution, argv, needles):
    code, out, err = run(capsys, "run", demo_fused(tmp_path), *argv)
    assert code != 0 and out == ""
    assert_one_line_error(err, *needles)
    assert no_execution == []
