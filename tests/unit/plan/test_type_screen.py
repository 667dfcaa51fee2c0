"""instance_type="auto": a type too slow to run the whole job by the deadline still serves the
stages it is cheapest for (the per-stage search must not lose it with its own plan)."""

from __future__ import annotations

from pathlib import Path

from rubberband.config import experiment_from_dict
from rubberband.plan import compile_plan, simulate_plan
from rubberband.profiles import ModelProfile, Normal

ROOT = Path(__file__).resolve().parents[3]

T4 = ModelProfile({1: Normal(6.4, 0.64), 2: Normal(3.52, 0.352), 4: Normal(2.0, 0.192), 8: Normal(1.2, 0.128)},
                  trial_startup_s=Normal(5.0, 0.0001), name="resnet50-t4",
                  measured_on={"instance_type": "g4dn.12xlarge"})


def test_a_type_that_cannot_run_the_whole_job_still_serves_its_cheapest_stages():
    exp = experiment_from_dict({
        "sha": {"num_trials": 64, "min_iters": 4, "max_iters": 508, "eta": 2},
        "model_profile": {"V100": str(ROOT / "profiles" / "resnet50_cifar10_p3.yaml"), "T4": T4.to_dict()},
        "cloud": {"profile": str(ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml"), "instance_type": "auto",
                  "overrides": {"init_latency_s": {"dist": "constant", "value": 0}, "data": {"dataset_gb": 0.15}}},
        "deadline": "40m",
    })
    cloud = exp.catalog.with_overrides(exp.cloud_overrides)
    plan = compile_plan(exp.spec, exp.model_for_planning, cloud, exp.deadline_s, samples=100, instance_type="auto")
    # g4dn.xlarge (1 T4 per instance) cannot carry the whole job in 40 minutes, but it is the
    # cheapest type for the wide early stages; the last stage moves to a wide instance.
    assert plan.instance_types[0] == "g4dn.xlarge" and len(set(plan.instance_types)) > 1
    single = [c for c in plan.considered if c.get("cost_usd_mean") and "type per stage" not in c["policy"]]
    assert plan.predicted.mean_cost_usd < 0.9 * min(c["cost_usd_mean"] for c in single)
    assert simulate_plan(plan, exp.model_for_planning).mean_cost_usd == plan.predicted.mean_cost_usd


def test_a_rehearsal_runs_each_type_by_its_own_gpu_models_profile(capsys, tmp_path):
    import json

    import yaml

    from rubberband.cli.main import main

    t4 = tmp_path / "t4.yaml"
    t4.write_text(yaml.safe_dump(T4.to_dict()))
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({
        "sha": {"num_trials": 16, "min_iters": 4, "max_iters": 64, "eta": 2},
        "model_profile": {"V100": str(ROOT / "profiles" / "resnet50_cifar10_p3.yaml"), "T4": str(t4)},
        "cloud": {"profile": str(ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml"), "instance_type": "p3.8xlarge",
                  "overrides": {"init_latency_s": {"dist": "constant", "value": 0}}},
        "deadline": "40m", "samples": 100}))
    assert main(["run", str(exp), "--provider", "sim", "--instance-type", "g4dn.12xlarge", "--repeat", "20",
                 "--no-replan", "--no-safety-net", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    actual = sum(r["actual"]["jct_s"] for r in data["runs"]) / len(data["runs"])
    predicted = data["runs"][0]["predicted"]["jct_s"]
    # On the V100 profile (the experiment's first) the T4 plan would rehearse ~1.6x faster.
    assert abs(actual / predicted - 1) < 0.05, (actual, predicted)
