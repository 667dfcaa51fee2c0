"""`rubberband plan` with a type per stage, packed stages, profiles per GPU model and --zone."""

from __future__ import annotations

import json
from pathlib import Path

from rubberband.errors import SpecError
from rubberband.profiles import Normal
from rubberband.testing.builders import model_profile, write_profile

from .helpers import assert_one_line_error, run

ROOT = Path(__file__).resolve().parents[3]
CATALOG = ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml"
TRACES = ROOT / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json"


ITER_S = {1: Normal(12.0, 1.2), 2: Normal(6.3, 0.63), 4: Normal(3.45, 0.35), 8: Normal(2.0, 0.2)}
PACKED = {2: Normal(15.6, 1.5), 4: Normal(26.4, 2.6)}


def profile(tmp_path: Path, name: str = "m.yaml", packed: dict | None = None,
            measured_on: dict | None = None) -> Path:
    """A model profile file: ``packed`` latencies by trials per GPU; measured on a p3.16xlarge
    unless ``measured_on`` says where."""
    return write_profile(tmp_path / name, model_profile(
        ITER_S, startup_s=5.0, sync_s=1.0, name="m", packed_iter_latency_s=packed, gpu_memory_gb_per_trial=3.0,
        measured_on=measured_on or {"instance_type": "p3.16xlarge"}))


def experiment(tmp_path: Path, model: str, sha: str = "{num_trials: 27, min_iters: 4, max_iters: 108, eta: 3}",
               instance_type: str = "auto", deadline: str = "50m") -> str:
    """An experiment on us-east-1 with 1 s INITs and a data cost per launch; 27 trials by default."""
    path = tmp_path / "exp.yaml"
    path.write_text(f"""
sha: {sha}
model_profile: {model}
cloud:
  profile: {CATALOG}
  instance_type: {instance_type}
  overrides: {{init_latency_s: {{dist: constant, value: 1}}, data: {{dataset_gb: 20, price_usd_per_gb: 0.02}}}}
deadline: {deadline}
samples: 60
""")
    return str(path)


def test_plan_shows_a_type_per_stage_and_writes_it(capsys, tmp_path):
    out_file = tmp_path / "plan.json"
    code, out, err = run(capsys, "plan", experiment(tmp_path, str(profile(tmp_path))), "--out", str(out_file))
    assert code == 0, err
    assert "a type per stage" in out.splitlines()[0]
    header = out.splitlines()[1].split()
    assert "type" in header and "per" not in header
    types = json.loads(out_file.read_text())["instance_types"]
    assert len(set(types)) > 1 and all(t in out for t in types)
    assert "optimal, type per stage" in out
    assert "skipped types: no T4 model profile: g4dn.xlarge, g4dn.2xlarge and 5 more" in out
    # The plan file runs as written: `run --plan` checks it against the experiment.
    code, out, err = run(capsys, "run", experiment(tmp_path, str(profile(tmp_path))), "--plan", str(out_file),
                         "--provider", "sim", "--json")
    assert code == 0, err


def test_plan_shows_packed_stages(capsys, tmp_path):
    exp = experiment(tmp_path, str(profile(tmp_path, packed=PACKED)), sha="{num_trials: 256, min_iters: 1, max_iters: 64, eta: 4}",
                     instance_type="p3.2xlarge", deadline="1h")
    code, out, err = run(capsys, "plan", exp, "--json")
    assert code == 0, err
    assert 4 in json.loads(out)["trials_per_gpu"]
    code, out, err = run(capsys, "plan", exp)
    assert "per GPU" in out.splitlines()[1]
    considered = out.split("considered plans (* chosen)")[1]
    assert "p3.2xlarge (4 per GPU)" in considered


def test_plan_by_profiles_per_gpu_model(capsys, tmp_path):
    v100 = profile(tmp_path, "v100.yaml", measured_on={"gpu_model": "V100"})
    t4 = profile(tmp_path, "t4.yaml", measured_on={"gpu_model": "T4"})
    exp = experiment(tmp_path, f"{{V100: {v100}, T4: {t4}}}", sha="{num_trials: 8, min_iters: 2, max_iters: 8, eta: 2}",
                     deadline="2h")
    code, out, err = run(capsys, "plan", exp, "--json")
    assert code == 0, err
    data = json.loads(out)
    planned = {c["instance_type"] for c in data["considered"] if c["policy"].startswith("optimal")}
    assert any(t.startswith("g4dn") for t in planned) and any(t.startswith("p3") for t in planned)
    assert "g5.xlarge" in data["info"]["skipped"] and not any(t.startswith("g4dn") for t in data["info"]["skipped"])


def test_plan_zone_keeps_the_cheapest_zone_and_names_it(capsys, tmp_path):
    path = tmp_path / "zones.yaml"
    path.write_text(f"""
sha: {{num_trials: 8, min_iters: 2, max_iters: 8, eta: 2}}
model_profile: {profile(tmp_path, measured_on={"instance_type": "p3.2xlarge"})}
cloud:
  profile: {ROOT / 'cloud_profiles' / 'aws' / 'us-west-2.yaml'}
  instance_type: p3.2xlarge
  overrides: {{spot: {{notice_s: 120, preemption: {{trace: {{file: {TRACES}, zone: us-west-2a}}}}}}}}
deadline: 2h
samples: 30
""")
    code, out, err = run(capsys, "plan", str(path), "--zone", "us-west-2a,us-west-2b", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["info"]["zone"] in ("us-west-2a", "us-west-2b") and set(data["info"]["zones"]) == {"us-west-2a", "us-west-2b"}
    code, out, err = run(capsys, "plan", str(path), "--zone", "us-west-2a,us-west-2b")
    assert f"zone {data['info']['zone']}" in out.splitlines()[0]
    code, out, err = run(capsys, "plan", str(path), "--zone", "us-west-9z")
    assert code != 0
    assert_one_line_error(err, "--zone", "us-west-9z")


def test_validate_lists_each_gpu_models_profile(capsys, tmp_path):
    v100 = profile(tmp_path, "v100.yaml", measured_on={"gpu_model": "V100"})
    t4 = profile(tmp_path, "t4.yaml", measured_on={"gpu_model": "T4"})
    exp = experiment(tmp_path, f"{{V100: {v100}, T4: {t4}}}")
    code, out, err = run(capsys, "validate", exp)
    assert code == 0, err
    assert "model profile  m for V100 types" in out and "model profile  m for T4 types" in out
    code, out, err = run(capsys, "validate", exp, "--json")
    assert set(json.loads(out)["model_profiles"]) == {"V100", "T4"}


def test_plan_zone_keeps_an_experiments_auto_market(capsys, tmp_path):
    # In us-east-1's zones spot cannot carry this job at 0.9 within 2h: with the experiment's
    # `market: auto` the zones' plans fall back to on-demand rather than failing on spot alone.
    path = tmp_path / "east.yaml"
    text = (ROOT / "experiments" / "resnet101_spot.yaml").read_text()
    text = text.replace("../", f"{ROOT}/").replace("us-west-2.yaml", "us-east-1.yaml").replace("us-west-2a", "us-east-1a")
    path.write_text(text)
    code, out, err = run(capsys, "plan", str(path), "--zone", "us-east-1a,us-east-1c", "--samples", "40", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["spot_instances"] == [0] * 4 and data["info"]["zone"] in ("us-east-1a", "us-east-1c")


def test_a_real_run_plans_with_packing_like_a_rehearsal(capsys, tmp_path, monkeypatch):
    # Real clusters run packed stages: `run --provider local` plans with the packed latencies
    # (no note dropping them), as `run --provider sim` does.
    exp = experiment(tmp_path, str(profile(tmp_path, packed=PACKED)), sha="{num_trials: 256, min_iters: 1, max_iters: 64, eta: 4}",
                     instance_type="p3.2xlarge", deadline="1h")
    Path(exp).write_text(Path(exp).read_text() + "trainer: rubberband.examples.digits:DigitsMLP\n")
    seen = []

    def execute(plan, *args, **kwargs):
        seen.append(plan)
        raise SpecError("stopped before execution")

    monkeypatch.setattr("rubberband.executor.run.execute", execute)
    code, out, err = run(capsys, "run", exp, "--provider", "local")
    assert seen and max(seen[0].trials_per_gpu) > 1
    assert "packed" not in err and "without packing" not in err
    code, out, err = run(capsys, "run", exp, "--provider", "sim", "--json")
    assert code == 0 and max(json.loads(out)["plan"]["trials_per_gpu"]) > 1, err


def test_auto_names_the_rule_that_excluded_a_narrower_type_instead_of_infeasible(capsys):
    # issue 21: p3.2xlarge read "infeasible" under --confidence 0.9 while forcing it found a plan:
    # auto plans it only with trials of 1 GPU (never spread over narrower instances than profiled).
    cifar = str(ROOT / "experiments" / "resnet101_cifar10.yaml")
    code, out, err = run(capsys, "plan", cifar, "--instance-type", "auto", "--confidence", "0.9", "--samples", "200")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("optimal") and "p3.2xlarge" in line)
    assert "infeasible" not in row and "excluded" in row
    assert ("excluded p3.2xlarge: a trial is never spread over instances narrower than the p3.8xlarge it was profiled "
            "on, so auto plans p3.2xlarge with 1-GPU trials only, and none meets the deadline; "
            "--instance-type p3.2xlarge plans wider trials anyway (with a warning)") in out
    code, forced, _ = run(capsys, "plan", cifar, "--instance-type", "p3.2xlarge", "--confidence", "0.9",
                          "--samples", "200")
    assert code == 0 and "plan (optimal) on p3.2xlarge" in forced
    code, out, _ = run(capsys, "plan", cifar, "--instance-type", "auto", "--confidence", "0.9", "--samples", "200",
                       "--json")
    (entry,) = [c for c in json.loads(out)["considered"] if c["instance_type"] == "p3.2xlarge"]
    assert entry["excluded"].startswith("a trial is never spread over instances narrower")
