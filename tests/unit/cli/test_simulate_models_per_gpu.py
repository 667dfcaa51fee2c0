"""`rubberband simulate` of an experiment with a model profile per GPU model: each stage runs
by its type's GPU model's profile, and a type with none is one line naming it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rubberband import load_experiment
from rubberband.profiles import Normal
from rubberband.simulator import simulate
from rubberband.testing.builders import model_profile, write_profile

from .helpers import assert_one_line_error, run

ROOT = Path(__file__).resolve().parents[3]
TYPES = "p3.8xlarge,p3.8xlarge,g5.12xlarge,g5.12xlarge"


def _profile(tmp_path: Path, gpu: str, one_gpu_s: float) -> Path:
    model = model_profile({1: Normal(one_gpu_s, 1.0), 2: Normal(one_gpu_s / 1.9, 0.5), 4: Normal(one_gpu_s / 3.5, 0.3)},
                          startup_s=5.0, sync_s=1.0, name=f"m-{gpu}", measured_on={"gpu_model": gpu})
    return write_profile(tmp_path / f"{gpu}.yaml", model)


def _experiment(tmp_path: Path, instance_type: str = "p3.8xlarge") -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(f"""
sha: {{num_trials: 16, min_iters: 2, max_iters: 16, eta: 2}}
model_profile: {{V100: {_profile(tmp_path, 'V100', 12.0)}, A10G: {_profile(tmp_path, 'A10G', 36.0)}}}
cloud:
  profile: {ROOT / 'cloud_profiles' / 'aws' / 'us-east-1.yaml'}
  instance_type: {instance_type}
deadline: 1h
samples: 50
""")
    return str(path)


def test_each_stage_runs_by_its_types_profile(tmp_path, capsys):
    exp_path = _experiment(tmp_path)
    code, out, err = run(capsys, "simulate", exp_path, "--allocation", "8,4,4,4", "--instance-types", TYPES, "--json")
    assert code == 0, err
    stages = json.loads(out)["stages"]
    exp = load_experiment(exp_path)
    kwargs = dict(samples=50, seed=0, instance_types=TYPES.split(","))
    want = simulate(exp.spec, [8, 4, 4, 4], exp.models, exp.catalog, **kwargs)
    v100 = simulate(exp.spec, [8, 4, 4, 4], exp.models["V100"], exp.catalog, **kwargs)
    assert [s["mean_duration_s"] for s in stages] == [s.mean_duration_s for s in want.stages]
    # The A10G stages are not the V100 profile's (what simulate ran before).
    assert stages[3]["mean_duration_s"] > 1.5 * v100.stages[3].mean_duration_s


def test_one_instance_type_runs_by_its_profile(tmp_path, capsys):
    exp_path = _experiment(tmp_path)
    code, out, err = run(capsys, "simulate", exp_path, "--allocation", "8,4,4,4", "--instance-type", "g5.12xlarge",
                         "--json")
    assert code == 0, err
    exp = load_experiment(exp_path)
    want = simulate(exp.spec, [8, 4, 4, 4], exp.models["A10G"], exp.cloud_for("g5.12xlarge"), samples=50, seed=0)
    assert np.isclose(json.loads(out)["jct_s_mean"], want.mean_jct_s, rtol=1e-9)


def test_a_type_without_a_profile_is_one_line(tmp_path, capsys):
    exp_path = _experiment(tmp_path)
    code, out, err = run(capsys, "simulate", exp_path, "--allocation", "8,4,4,4",
                         "--instance-types", "p3.8xlarge,p3.8xlarge,g6.12xlarge,g6.12xlarge")
    assert code != 0
    assert_one_line_error(err, "instance_types[2]", "g6.12xlarge has L4 GPUs", "V100, A10G")
    code, out, err = run(capsys, "simulate", exp_path, "--allocation", "8,4,4,4", "--instance-type", "g6.12xlarge")
    assert code != 0
    assert_one_line_error(err, "instance_type: g6.12xlarge has L4 GPUs", "V100, A10G")

