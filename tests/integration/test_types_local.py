"""A plan with an instance type per stage, run for real on the local provider: stage 0 on
``local.1gpu``, the last stage on ``local.2gpu``. At the SYNC between them the 1-GPU instances
are released and a 2-GPU instance is launched, and the ledger bills each at its own type's price."""

import dataclasses

import pytest

import rubberband as rb
from rubberband.executor.run import execute
from rubberband.plan import plan_allocation
from rubberband.plan.plan import check_plan
from rubberband.profiles.cloud import CloudCatalog
from rubberband.simulator.model import billed_seconds

from .conftest import ROOT, trainer

pytestmark = pytest.mark.integration

SPACE = {"lr": {"loguniform": [0.01, 0.3]}, "hidden": [32, 64]}


def two_type_plan(model):
    """SHA(2 trials, then 1): stage 0 one GPU per trial on two local.1gpu instances, the last
    stage both GPUs of one local.2gpu; predicted again on both types' profiles."""
    catalog = CloudCatalog.load(ROOT / "cloud_profiles" / "local" / "local.yaml")
    spec = rb.ExperimentSpec.from_stages([(2, 2), (1, 2)])
    one, two = catalog.get("local.1gpu"), catalog.get("local.2gpu")
    base = plan_allocation(spec, (2, 2), model, one, deadline_s=600, samples=20)
    plan = dataclasses.replace(base, instances=(2, 1), instance_types=("local.1gpu", "local.2gpu"),
                               type_clouds={"local.1gpu": one, "local.2gpu": two})
    return check_plan(plan, spec, model, catalog, samples=20), {"local.1gpu": one, "local.2gpu": two}


def test_a_plan_changes_instance_type_at_the_sync_and_bills_each_type_at_its_price(tmp_path, model):
    plan, clouds = two_type_plan(model)
    assert [c.instance_type for c in plan.stage_clouds] == ["local.1gpu", "local.2gpu"]
    assert plan.instances == (2, 1) and plan.gpus_per_trial == (1, 2)

    result = execute(plan, trainer("Tiny"), SPACE, metric="val_loss", mode="min", seed=1,
                     runs_dir=tmp_path / "runs", latency_scale=0.2)

    ledger = result.ledger
    launched = [i for i in ledger["instances"] if i["launched_s"] is not None]
    by_type = {t: [i for i in launched if i["instance_type"] == t] for t in clouds}
    assert {t: len(v) for t, v in by_type.items()} == {"local.1gpu": 2, "local.2gpu": 1}
    # Each instance at its own type's price, billed by its type's rules.
    for t, recs in by_type.items():
        for i in recs:
            assert i["price_usd_per_hour"] == pytest.approx(clouds[t].price_usd_per_hour)
            life = i["released_s"] - i["launched_s"]
            assert i["cost_usd"] == pytest.approx(billed_seconds(life, clouds[t].billing) * i["price_usd_per_hour"] / 3600)
    assert set(ledger["by_type"]) == set(clouds)
    assert ledger["by_type"]["local.2gpu"]["cost_usd"] == pytest.approx(sum(i["cost_usd"] for i in by_type["local.2gpu"]))
    assert result.actual["cost_usd"] == pytest.approx(sum(i["cost_usd"] for i in launched))
    assert set(ledger["markets"]) == {"on-demand local.1gpu", "on-demand local.2gpu"}

    # The 1-GPU instances were released at the SYNC ending stage 0 (gone before the 2-GPU
    # instance, asked for at that SYNC, was ready); the 2-GPU one lived to the end.
    sync = ledger["stage_windows"][0][1]
    (big,) = by_type["local.2gpu"]
    assert big["stage_requested"] == 1 and big["requested_s"] >= sync - 1e-6
    for i in by_type["local.1gpu"]:
        assert i["release_reason"] == "released" and i["stage_requested"] == 0
        assert sync - 1e-6 <= i["released_s"] <= big["ready_s"]
    assert big["released_s"] >= ledger["stage_windows"][1][1] - 1e-6

    # The job finished: the winner trained on one GPU, then on both GPUs of the 2-GPU instance.
    winner = result.trials[result.best["trial"]]
    h0, h1 = winner["history"]
    assert (h0["gpus"], h1["gpus"]) == (1, 2) and len(set(h1["instances"])) == 1
    assert winner["ranks_in_sync"] is True
    assert [s["instance_type"] for s in result.stages] == ["local.1gpu", "local.2gpu"]
    # Predicted vs actual: the plan's mean cost against what the ledger billed, figured here from both.
    billed = sum(i["cost_usd"] for i in launched)
    assert plan.predicted.mean_cost_usd > 0 and result.predicted["cost_usd"] == plan.predicted.mean_cost_usd
    assert result.error("cost_usd") == pytest.approx((billed - plan.predicted.mean_cost_usd) / plan.predicted.mean_cost_usd)
    assert "local.2gpu: 1 instance(s) launched" in result.table()
    # Nothing left running (the fixture checks the cluster's processes too).
    assert all(i["released_s"] is not None for i in ledger["instances"])


# A catalog and profile where a type per stage is the cheapest plan: 3 one-GPU trials are
# cheapest on three 1-GPU instances, the last trial on both GPUs of one 2-GPU instance (cheaper
# than two 1-GPU ones), and launching costs little (short latencies in the profile).
CATALOG = """
provider: local
region: local
defaults:
  billing: {model: per_instance, granularity_s: 1, minimum_s: 0}
  provision_latency_s: {dist: normal, mean: 0.5, std: 0.05}
  init_latency_s: {dist: normal, mean: 1.0, std: 0.1}
instance_types:
  local.1gpu: {gpus_per_instance: 1, gpu_model: logical, price_usd_per_hour: 1.0}
  local.2gpu: {gpus_per_instance: 2, gpu_model: logical, price_usd_per_hour: 1.75}
"""
PROFILE = """
name: scaling
measured_on: {gpu_model: logical}
iter_latency_s:
  1: {dist: normal, mean: 1.0, std: 0.05}
  2: {dist: normal, mean: 0.6, std: 0.03}
"""


def test_run_with_instance_type_auto_plans_a_type_per_stage_and_runs_it(tmp_path, _isolated_state):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "catalog.yaml").write_text(CATALOG)
    (tmp_path / "profile.yaml").write_text(PROFILE)
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"""
name: types-auto
stages: [[3, 10], [1, 30]]
model_profile: profile.yaml
cloud: {{profile: catalog.yaml, instance_type: auto}}
deadline: 35s
samples: 100
trainer: {trainer('Tiny')}
metric: val_loss
search_space: {{lr: [0.05, 0.1]}}
""")
    env = {**os.environ, "RUBBERBAND_STATE_DIR": str(_isolated_state), "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_AUTH_MODE": "disabled"}
    # --no-replan: the trainer is far faster than the profile says, and a re-plan would
    # rightly move the last stage back onto the 1-GPU instances it has.
    out = subprocess.run([sys.executable, "-m", "rubberband", "run", str(exp), "--provider", "local", "--no-replan",
                          "--runs-dir", str(tmp_path / "runs")], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "on local.1gpu + local.2gpu, a type per stage" in out.stdout
    result = json.loads((Path(out.stdout.strip().splitlines()[-1].split("run directory: ")[1]) / "result.json").read_text())
    assert [s["instance_type"] for s in result["stages"]] == ["local.1gpu", "local.2gpu"]
    launched = {t: d["markets"]["on-demand"]["instances"] for t, d in result["ledger"]["by_type"].items()}
    assert launched == {"local.1gpu": 3, "local.2gpu": 1}
    assert {i["instance_type"]: i["price_usd_per_hour"] for i in result["ledger"]["instances"]} == \
        {"local.1gpu": 1.0, "local.2gpu": 1.75}
    assert "local.2gpu: 1 instance(s) launched" in out.stdout
