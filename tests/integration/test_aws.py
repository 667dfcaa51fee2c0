"""The aws provider end to end: Ray's autoscaler, real boto3 against moto, each EC2 instance
mirrored by a local Ray node with the instance type's logical GPUs, real DDP trials."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import pytest

import rubberband as rb
from rubberband.executor.run import execute
from rubberband.plan import plan_allocation
from rubberband.providers.local import LocalCluster, _session_pids
from rubberband.testing.ec2_faults import Ec2FaultProxy
from tests.conftest import (
    FAKE_KEY_ID,
    FAKE_SECRET,
    running_rubberband_instances,
    write_cluster_yaml,
)

from .conftest import ROOT, after_checkpoint, trainer
from .tiny_trainer import Slow

pytestmark = [pytest.mark.integration, pytest.mark.aws]

SPACE = {"lr": {"loguniform": [0.01, 0.3]}}
AWS = ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml"


def _instances(endpoint, run_id=None, states=None):
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
    filters = [{"Name": "tag-key", "Values": ["rubberband:run-id"]}]
    if run_id:
        filters = [{"Name": "tag:rubberband:run-id", "Values": [run_id]}]
    if states:
        filters.append({"Name": "instance-state-name", "Values": list(states)})
    return [i for r in ec2.describe_instances(Filters=filters)["Reservations"] for i in r["Instances"]]


def _tags(inst):
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


def _plan(model, stages, allocation, market="on-demand"):
    cloud = rb.CloudProfile.load(AWS, "g5.xlarge", market=market)
    return plan_allocation(rb.ExperimentSpec.from_stages(stages), allocation,
                           model.replace(iter_latency_s={1: model.iter_latency_s[1]}), cloud, deadline_s=3600, samples=20)


def _files_text(*roots):
    for root in roots:
        for path in Path(root).rglob("*"):
            if path.is_file() and path.stat().st_size < 20_000_000:
                try:
                    yield path, path.read_bytes().decode("utf-8", "replace")
                except OSError:
                    continue


def _experiment(tmp_path, name, stages, trainer_name, market="on-demand", credentials=False):
    """An experiment file on spot/on-demand g5.xlarge next to its cluster YAML (`cluster.yaml`)."""
    write_cluster_yaml(tmp_path / "cluster.yaml", "g5.xlarge", credentials=credentials)
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"""
name: {name}
stages: {stages}
model_profile: {ROOT / 'profiles' / 'demo_digits_local.yaml'}
cloud: {{profile: {AWS}, instance_type: g5.xlarge, market: {market}}}
cluster: cluster.yaml
deadline: 1h
trainer: {trainer(trainer_name)}
metric: val_loss
search_space: {{lr: [0.05, 0.1]}}
""")
    return exp


def test_run_on_aws_launches_tags_scales_down_and_terminates(tmp_path, moto_ec2, model):
    # Stage 0: 2 trials on 2 g5.xlarge (1 GPU each); stage 1: the winner on 1 instance.
    exp = _experiment(tmp_path, "aws-e2e", [[2, 2], [1, 2]], "Tiny", market="spot", credentials=True)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("AWS_ACCESS_KEY_ID")          # the cluster YAML's aws_credentials must be what works
    env.pop("AWS_SECRET_ACCESS_KEY")
    out = subprocess.run([sys.executable, "-m", "rubberband", "run", str(exp), "--provider", "aws", "--allocation", "2,1",
                          "--latency-scale", "0.05", "--runs-dir", str(tmp_path / "runs")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = Path(out.stdout.strip().splitlines()[-1].split("run directory: ")[1])
    result = json.loads((run_dir / "result.json").read_text())
    run_id = result["run_id"]

    launched = _instances(moto_ec2, run_id)
    ledger = {i["provider_id"]: i for i in result["ledger"]["instances"]}
    assert len(launched) == 2 and set(ledger) == {i["InstanceId"] for i in launched}
    for inst in launched:
        tags = _tags(inst)
        assert tags["rubberband:run-id"] == run_id and tags["rubberband:cluster"] == f"rb-{run_id}"
        assert tags["ray-cluster-name"] == f"rb-{run_id}" and tags["rubberband:instance"] == ledger[inst["InstanceId"]]["instance_id"]
        assert inst["InstanceType"] == "g5.xlarge" and inst["ImageId"] == "ami-12345678"
        assert inst.get("InstanceLifecycle") == "spot"                      # the plan priced spot
        assert inst["State"]["Name"] == "terminated"
        # Ledger times are EC2's: LaunchTime (whole seconds) relative to the run's start.
        rec = ledger[inst["InstanceId"]]
        assert rec["market"] == "spot" and rec["price_usd_per_hour"] == pytest.approx(0.4246)
        assert rec["released_s"] > rec["launched_s"] >= rec["requested_s"] - 1.0
    first_out = min(result["ledger"]["instances"], key=lambda i: i["released_s"])
    assert first_out["released_s"] <= result["ledger"]["stage_windows"][0][1] + 5.0   # scaled down at the SYNC
    assert [s["actual"]["instances"] for s in result["stages"]] == [2, 1]
    assert result["actual"]["cost_usd"] == pytest.approx(2 * 60 * 0.4246 / 3600, rel=0.5)  # two spot minimums
    assert running_rubberband_instances(moto_ec2) == []
    assert LocalCluster.known() == []

    # The head's cluster config is Ray's format with our provider, and no secret anywhere.
    cfg = json.loads((run_dir / "cluster.json").read_text())
    assert cfg["provider"]["module"].endswith("AwsNodeProvider") and cfg["provider"]["region"] == "us-east-1"
    temp_dir = f"/tmp/rb-{run_id[-8:]}"
    for path, text in _files_text(run_dir, temp_dir):
        assert FAKE_SECRET not in text and FAKE_KEY_ID not in text, path
    assert FAKE_SECRET not in out.stdout + out.stderr and FAKE_KEY_ID not in out.stdout + out.stderr


def test_spot_interruption_restarts_the_trial_on_a_replacement(tmp_path, moto_ec2, model):
    # 20 iterations (~6 s) leave the provider time to see the reclaim before the trial ends.
    plan = _plan(model, [(2, 20)], (2,), market="spot")
    run_id = "spot-interrupt"
    run_dir = tmp_path / "runs" / run_id
    reclaimed = {}

    def reclaim(kind, data):
        if kind == "gang" and data["trial"] == "t000" and not reclaimed:
            instance = data["instances"][0]

            def terminate_on_ec2():
                inst = next(i for i in _instances(moto_ec2, run_id, ["running"])
                            if _tags(i)["rubberband:instance"] == instance)
                # AWS reclaims the spot instance: straight to EC2, behind the executor's back.
                boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_ec2).terminate_instances(
                    InstanceIds=[inst["InstanceId"]])
                reclaimed.update(instance=instance, ec2_id=inst["InstanceId"])

            after_checkpoint(run_dir, "t000", terminate_on_ec2)

    seen = []
    result = execute(plan, trainer("Slow"), SPACE, provider="aws", metric="val_loss", seed=2, runs_dir=tmp_path / "runs",
                     latency_scale=0.05, on_event=lambda k, d: (seen.append((k, d)), reclaim(k, d)), run_id=run_id,
                     cluster_config=write_cluster_yaml(tmp_path / "c.yaml", spot=True))
    assert reclaimed, "the test never found the instance to reclaim"
    t0 = result.trials["t000"]
    assert t0["restarts"] >= 1 and t0["step"] == 20 * Slow.steps_per_iter       # resumed and finished
    ledger = {i["provider_id"]: i for i in result.ledger["instances"]}
    assert ledger[reclaimed["ec2_id"]]["release_reason"] == "interrupted"
    assert len(ledger) >= 3 and all(i["released_s"] is not None for i in ledger.values())   # replacement billed
    assert result.actual["cost_usd"] >= 3 * 60 * 0.4246 / 3600 * 0.99
    assert any(k == "provider" and d.get("reason") == "interrupted" for k, d in seen)
    assert running_rubberband_instances(moto_ec2) == []


def test_a_mixed_stage_launches_its_spot_and_on_demand_instances_tagged_with_the_market(tmp_path, moto_ec2, model):
    # One stage of 2 trials on 2 g5.xlarge: one spot, one on-demand (a plan's per-stage mix).
    import dataclasses

    plan = dataclasses.replace(_plan(model, [(2, 1)], (2,)), spot_instances=(1,))
    result = execute(plan, trainer("Tiny"), SPACE, provider="aws", runs_dir=tmp_path / "runs", latency_scale=0.05,
                     run_id="spot-mix", cluster_config=write_cluster_yaml(tmp_path / "c.yaml"))
    launched = {i["InstanceId"]: i for i in _instances(moto_ec2, "spot-mix")}
    assert len(launched) == 2
    markets = {_tags(i)["rubberband:market"]: i for i in launched.values()}
    assert set(markets) == {"spot", "on-demand"}
    assert markets["spot"].get("InstanceLifecycle") == "spot" and markets["on-demand"].get("InstanceLifecycle") is None
    assert float(_tags(markets["spot"])["rubberband:price-usd-per-hour"]) == pytest.approx(0.4246)
    assert float(_tags(markets["on-demand"])["rubberband:price-usd-per-hour"]) == pytest.approx(plan.cloud.price_usd_per_hour)
    ledger = {i["provider_id"]: i for i in result.ledger["instances"]}
    for ec2_id, inst in launched.items():
        assert ledger[ec2_id]["market"] == _tags(inst)["rubberband:market"]
        assert inst["State"]["Name"] == "terminated"
    assert result.ledger["markets"]["spot"]["instances"] == 1 and result.ledger["markets"]["on-demand"]["instances"] == 1
    assert running_rubberband_instances(moto_ec2) == []


def test_capacity_errors_are_retried_and_reported(tmp_path, moto_ec2, model, monkeypatch):
    proxy = Ec2FaultProxy(moto_ec2, fail={"RunInstances": 2}).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    try:
        plan = _plan(model, [(1, 1)], (1,))
        seen = []
        result = execute(plan, trainer("Tiny"), SPACE, provider="aws", runs_dir=tmp_path / "runs", latency_scale=0.05,
                         on_event=lambda k, d: seen.append((k, d)), launch_backoff_s=0.3,
                         cluster_config=write_cluster_yaml(tmp_path / "c.yaml"))
    finally:
        proxy.stop()
    errors = result.ledger["launch_errors"]
    assert [e["code"] for e in errors] == ["InsufficientInstanceCapacity"] * 2
    assert [e["retry_in_s"] for e in errors] == [0.3, 0.6]
    provider = [d for k, d in seen if k == "provider"]
    assert [d.get("code") for d in provider] == ["InsufficientInstanceCapacity"] * 2, provider
    assert len(result.ledger["instances"]) == 1 and result.trials["t000"]["step"] > 0
    assert running_rubberband_instances(moto_ec2) == []


def test_an_exception_terminates_every_instance(tmp_path, moto_ec2, model):
    plan = _plan(model, [(2, 1)], (2,))
    with pytest.raises(Exception, match="boom"):
        execute(plan, trainer("Failing"), SPACE, provider="aws", runs_dir=tmp_path / "runs", latency_scale=0.05,
                cluster_config=write_cluster_yaml(tmp_path / "c.yaml"))
    assert _instances(moto_ec2), "the run should have launched instances"
    assert running_rubberband_instances(moto_ec2) == []
    assert LocalCluster.known() == []


def _start_cli_run(tmp_path, state, endpoint):
    exp = _experiment(tmp_path, "aws-interrupted", [[2, 40]], "Slow")
    env = {**os.environ, "RUBBERBAND_STATE_DIR": str(state), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "rubberband", "run", str(exp), "--provider", "aws", "--allocation", "2",
                             "--latency-scale", "0.05", "--runs-dir", str(tmp_path / "runs")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    # Read progress on a thread (a chatty run must never block on a full pipe).
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    deadline = time.time() + 120
    while not any("stage 0" in line for line in list(lines)) and time.time() < deadline:
        time.sleep(0.2)
    while len(running_rubberband_instances(endpoint)) < 2 and time.time() < deadline:
        time.sleep(0.5)
    time.sleep(2.0)
    assert len(running_rubberband_instances(endpoint)) == 2, "the run should hold 2 instances"
    (head,) = LocalCluster.known("aws")
    return proc, head, env


def test_sigint_terminates_every_instance(tmp_path, _isolated_state, moto_ec2):
    proc, head, _ = _start_cli_run(tmp_path, _isolated_state, moto_ec2)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=90)
    assert proc.returncode == 130
    assert running_rubberband_instances(moto_ec2) == []
    assert _session_pids(head.sid) == []


def test_sigkill_then_down_terminates_every_instance(tmp_path, _isolated_state, moto_ec2):
    proc, head, env = _start_cli_run(tmp_path, _isolated_state, moto_ec2)
    proc.kill()
    proc.wait(timeout=30)
    assert len(running_rubberband_instances(moto_ec2)) == 2, "a SIGKILLed driver cannot clean up"
    down = subprocess.run([sys.executable, "-m", "rubberband", "down", "--provider", "aws"], env=env,
                          capture_output=True, text=True, timeout=90)
    assert down.returncode == 0, down.stderr
    assert "terminated 2 instance(s)" in down.stdout and "spend stopped: $2.0120/h" in down.stdout
    assert running_rubberband_instances(moto_ec2) == []
    assert _session_pids(head.sid) == []
    status = subprocess.run([sys.executable, "-m", "rubberband", "status", "--provider", "aws"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "no running rubberband instances" in status.stdout


def test_profile_on_aws_times_launches_from_ec2_and_terminates_everything(tmp_path, moto_ec2):
    from rubberband.profiler import profile

    exp = _experiment(tmp_path, "aws-profile", [[2, 1]], "Tiny")
    out = tmp_path / "profiles" / "tiny_g5.yaml"
    result = profile(exp, provider="aws", iters=1, repeats=1, out=out, runs_dir=tmp_path / "runs", latency_scale=0.05)
    model = rb.ModelProfile.load(out)
    assert model.measured_on["provider"] == "aws" and model.measured_on["instance_type"] == "g5.xlarge"
    assert model.gpu_counts == (1,) and model.extra["profiling"]["cost_usd"] > 0
    assert len(model.extra["profiling"]["samples"]["cloud"]["init_latency_s"]) == 2
    assert result.provision_latency_s.mean >= 0
    launched = _instances(moto_ec2)
    assert len(launched) == 2 and all(_tags(i)["rubberband:run-id"].startswith("profile-") for i in launched)
    assert running_rubberband_instances(moto_ec2) == []
    assert LocalCluster.known() == []


def test_a_two_type_plan_launches_each_type_as_its_own_ray_node_type(tmp_path, moto_ec2, model):
    # Stage 0: 2 trials on 2 g5.xlarge; the last stage: the winner on a g5.2xlarge, launched
    # from the YAML's second worker type once the g5.xlarge pair is released at the SYNC.
    import dataclasses

    from rubberband.plan.plan import check_plan
    from rubberband.profiles.cloud import CloudCatalog

    catalog = CloudCatalog.load(AWS)
    one_gpu = model.replace(iter_latency_s={1: model.iter_latency_s[1]})
    base = _plan(model, [(2, 1), (1, 1)], (2, 1))
    plan = check_plan(dataclasses.replace(base, instance_types=("g5.xlarge", "g5.2xlarge"),
                                          type_clouds={"g5.xlarge": catalog.get("g5.xlarge"),
                                                       "g5.2xlarge": catalog.get("g5.2xlarge")}),
                      base.spec, one_gpu, catalog, samples=5)
    path = write_cluster_yaml(tmp_path / "c.yaml")
    cfg = json.loads(path.read_text())
    cfg["available_node_types"]["wide_workers"] = {
        "node_config": {"InstanceType": "g5.2xlarge", "ImageId": "ami-22222222"}, "min_workers": 0, "max_workers": 1}
    path.write_text(json.dumps(cfg))
    result = execute(plan, trainer("Tiny"), SPACE, provider="aws", runs_dir=tmp_path / "runs", latency_scale=0.05,
                     run_id="two-types", cluster_config=path)

    launched = {i["InstanceId"]: i for i in _instances(moto_ec2, "two-types")}
    by_type = {}
    for inst in launched.values():
        by_type.setdefault(inst["InstanceType"], []).append(inst)
        assert inst["State"]["Name"] == "terminated"
    assert {t: len(v) for t, v in by_type.items()} == {"g5.xlarge": 2, "g5.2xlarge": 1}
    (wide,) = by_type["g5.2xlarge"]
    assert wide["ImageId"] == "ami-22222222" and _tags(wide)["ray-user-node-type"] == "wide_workers"
    assert {_tags(i)["ray-user-node-type"] for i in by_type["g5.xlarge"]} == {"gpu_workers"}
    assert float(_tags(wide)["rubberband:price-usd-per-hour"]) == pytest.approx(1.212)
    ledger = {i["provider_id"]: i for i in result.ledger["instances"]}
    for ec2_id, inst in launched.items():
        assert ledger[ec2_id]["instance_type"] == inst["InstanceType"]
        assert ledger[ec2_id]["price_usd_per_hour"] == pytest.approx(catalog.get(inst["InstanceType"]).price_usd_per_hour)
    assert ledger[wide["InstanceId"]]["requested_s"] >= result.ledger["stage_windows"][0][1] - 1e-6
    assert set(result.ledger["by_type"]) == {"g5.xlarge", "g5.2xlarge"}
    assert running_rubberband_instances(moto_ec2) == []
