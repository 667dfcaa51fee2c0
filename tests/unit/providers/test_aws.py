"""The aws provider's EC2 code (real boto3) against a moto server: config, launch, retry, down, status."""

import json
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from rubberband.errors import ProviderError, SpecError
from rubberband.providers import aws_cluster
from rubberband.providers.aws import (
    TAG_CLUSTER,
    TAG_PRICE,
    TAG_RUN,
    Ec2,
    is_emulated_endpoint,
    load_cluster_config,
    safe_error,
    tags_of,
    termination_time,
    worker_user_data,
)
from rubberband.testing.ec2_faults import Ec2FaultProxy
from tests.conftest import (
    FAKE_KEY_ID,
    FAKE_SECRET,
    running_rubberband_instances,
    write_cluster_yaml,
)

pytestmark = pytest.mark.aws


@pytest.fixture(autouse=True)
def _state(tmp_path, monkeypatch):
    import rubberband.providers.local as local

    monkeypatch.setattr(local, "STATE_ROOT", tmp_path / "state" / "local")


def _launch(ec2, run_id="run-1", n=1, spot=False, price="1.006"):
    cfg = {"InstanceType": "g5.xlarge", "ImageId": "ami-12345678", "IamInstanceProfile": {"Name": "rubberband-worker"}}
    if spot:
        cfg["InstanceMarketOptions"] = {"MarketType": "spot"}
    return [ec2.launch(cfg, {TAG_RUN: run_id, TAG_CLUSTER: f"rb-{run_id}", TAG_PRICE: price}, client_token=f"{run_id}-{k}")
            for k in range(n)]


# --- cluster YAML -----------------------------------------------------------------------------
def test_a_ray_cluster_yaml_gives_region_node_config_and_setup(tmp_path):
    path = write_cluster_yaml(tmp_path / "c.yaml", spot=True, extra_node_config={"SubnetIds": ["subnet-1"]})
    cfg = load_cluster_config(path, "g5.xlarge")
    assert (cfg.region, cfg.node_type, cfg.instance_type, cfg.market, cfg.max_workers) == \
        ("us-east-1", "gpu_workers", "g5.xlarge", "spot", 4)
    assert cfg.node_config["IamInstanceProfile"] == {"Name": "rubberband-worker"}
    assert cfg.setup_commands == ["pip install 'rubberband[ray,torch]'"]
    assert cfg.with_market("on-demand").market == "on-demand" and cfg.market == "spot"


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["provider"].update(type="gcp"), "provider.type: expected aws"),
    (lambda c: c["provider"].update(region="mars"), "provider.region"),
    (lambda c: c["provider"].update(regoin="x"), "did you mean `region`"),
    (lambda c: c.update(max_worker=3), "did you mean `max_workers`"),
    (lambda c: c["available_node_types"]["gpu_workers"]["node_config"].pop("ImageId"), "ImageId"),
    (lambda c: c["available_node_types"]["gpu_workers"]["node_config"].update(MaxCount=3), "MaxCount: rubberband sets this"),
    (lambda c: c["available_node_types"]["gpu_workers"]["node_config"].update(InstanceType="p5.48xlarge"),
     "no worker type launches g5.xlarge"),
    (lambda c: c["available_node_types"]["gpu_workers"]["node_config"].update(
        InstanceMarketOptions={"MarketType": "capacity-block"}), "MarketType: expected spot"),
    (lambda c: c.update(max_workers=0), ": max_workers: must be at least 1, got 0"),
    (lambda c: c["available_node_types"]["gpu_workers"].update(max_workers=True),
     "available_node_types.gpu_workers.max_workers: expected an integer"),
    (lambda c: c["provider"].update(aws_credentials={"aws_access_key_id": "k", "aws_secret_acess_key": "s"}),
     "provider.aws_credentials.aws_secret_acess_key: unknown key .did you mean `aws_secret_access_key`"),
    (lambda c: c["available_node_types"]["gpu_workers"]["node_config"].update(InstanceMarketOptions={
        "MarketType": "spot", "SpotOptions": {"InstanceInteruptionBehavior": "stop"}}),
     "SpotOptions.InstanceInteruptionBehavior: unknown key .did you mean `InstanceInterruptionBehavior`"),
    (lambda c: c["available_node_types"]["gpu_workers"]["node_config"].update(SubnetIds="subnet-1"),
     "node_config.SubnetIds: expected a list of ids"),
    (lambda c: c["available_node_types"]["gpu_workers"].update(node_cofig={}), "did you mean `node_config`"),
    (lambda c: c["available_node_types"]["gpu_workers"]["node_config"].update(InstanceMarketOptions={
        "MarketType": "spot", "SpotOptions": {"SpotInstanceType": "persistent"}}), "SpotInstanceType: must be one-time"),
    (lambda c: c["available_node_types"]["gpu_workers"]["node_config"].update(DisableApiTermination=True),
     "DisableApiTermination"),
    (lambda c: c.update(setup_commands="pip install x"), "setup_commands: expected a list"),
])
def test_a_bad_cluster_yaml_is_one_line_naming_the_field(tmp_path, mutate, message):
    path = write_cluster_yaml(tmp_path / "c.yaml")
    cfg = json.loads(path.read_text())
    mutate(cfg)
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match=message) as err:
        load_cluster_config(path, "g5.xlarge")
    assert "\n" not in str(err.value) and str(err.value).startswith(f"{path}: ")


def test_the_cluster_must_launch_what_the_plan_priced(tmp_path):
    import rubberband as rb

    cloud = rb.CloudProfile.load("cloud_profiles/aws/us-east-1.yaml", "g5.xlarge")
    cfg = load_cluster_config(write_cluster_yaml(tmp_path / "c.yaml", max_workers=2), "g5.xlarge")
    assert aws_cluster.check_against_plan(cfg, cloud, 2).market == "on-demand"
    with pytest.raises(SpecError, match="max_workers: the plan needs 3"):
        aws_cluster.check_against_plan(cfg, cloud, 3)
    spot_cloud = rb.CloudProfile.load("cloud_profiles/aws/us-east-1.yaml", "g5.xlarge", market="spot")
    assert aws_cluster.check_against_plan(cfg, spot_cloud, 1).node_config["InstanceMarketOptions"]["MarketType"] == "spot"
    spot_cfg = load_cluster_config(write_cluster_yaml(tmp_path / "s.yaml", spot=True), "g5.xlarge")
    with pytest.raises(SpecError, match="launches spot but the plan was priced on-demand"):
        aws_cluster.check_against_plan(spot_cfg, cloud, 1)
    west = load_cluster_config(write_cluster_yaml(tmp_path / "w.yaml", region="us-west-2"), "g5.xlarge")
    with pytest.raises(SpecError, match="priced for us-east-1"):
        aws_cluster.check_against_plan(west, cloud, 1)
    local = rb.CloudProfile.load("cloud_profiles/local/local.yaml", "local.1gpu")
    with pytest.raises(SpecError, match="needs an aws profile"):
        aws_cluster.check_against_plan(cfg, local, 1)


def test_emulated_endpoints_are_loopback_only(monkeypatch):
    assert is_emulated_endpoint("http://127.0.0.1:5000") and is_emulated_endpoint("http://localhost:1")
    assert not is_emulated_endpoint("https://ec2.us-east-1.amazonaws.com")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_EC2", raising=False)
    assert not is_emulated_endpoint()


def test_worker_user_data_runs_setup_then_joins_the_head_with_its_identity():
    script = worker_user_data(["pip install torch"], "10.0.0.5:6379", "fff01", "gpu_workers", 4, {"rb-instance-3": 1000, "rb-slot": 1})
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash" and "pip install torch" in lines
    last = lines[-1]
    assert last.index("ray start") > last.index("RAY_CLOUD_INSTANCE_ID=fff01")
    assert "--address=10.0.0.5:6379" in last and "--num-gpus=4" in last and "rb-instance-3" in last


# --- launch / terminate -------------------------------------------------------------------------
def test_launch_tags_the_instance_and_honours_spot(moto_ec2):
    ec2 = Ec2("us-east-1")
    (inst,) = _launch(ec2, spot=True)
    described = ec2.instances(run_id="run-1")
    assert [i["InstanceId"] for i in described] == [inst["InstanceId"]]
    tags = tags_of(described[0])
    assert tags[TAG_RUN] == "run-1" and tags[TAG_CLUSTER] == "rb-run-1" and tags[TAG_PRICE] == "1.006"
    assert described[0].get("InstanceLifecycle") == "spot"
    assert described[0]["IamInstanceProfile"]["Arn"].endswith("instance-profile/rubberband-worker")
    ec2.terminate([inst["InstanceId"]])
    assert ec2.instances(run_id="run-1") == []
    gone = ec2.instances(run_id="run-1", states=("terminated",))
    assert termination_time(gone[0]) is not None


def test_capacity_errors_are_retried_with_backoff_and_reported(moto_ec2):
    proxy = Ec2FaultProxy(moto_ec2, fail={"RunInstances": 2}).start()
    try:
        ec2 = Ec2("us-east-1", endpoint_url=proxy.url)
        errors, sleeps = [], []
        subnets = ec2.default_subnets()[:2]
        inst = ec2.launch({"InstanceType": "g5.xlarge", "ImageId": "ami-12345678", "SubnetIds": subnets},
                          {TAG_RUN: "r"}, client_token="r-1", on_error=errors.append, sleep=sleeps.append, backoff_s=1.5)
    finally:
        proxy.stop()
    Ec2("us-east-1").terminate([inst["InstanceId"]])
    assert inst["InstanceId"].startswith("i-")
    assert len(subnets) == 2 and inst["SubnetId"] == subnets[0]   # tried a, b, then a again
    assert [e.code for e in errors] == ["InsufficientInstanceCapacity"] * 2
    assert sleeps == [1.5, 3.0]                                 # exponential backoff
    assert [e.retry_in_s for e in errors] == [1.5, 3.0]


def test_capacity_errors_that_never_end_raise_with_the_code(moto_ec2):
    proxy = Ec2FaultProxy(moto_ec2, fail={"RunInstances": 99}).start()
    try:
        ec2 = Ec2("us-east-1", endpoint_url=proxy.url)
        errors = []
        with pytest.raises(ProviderError, match="InsufficientInstanceCapacity") as err:
            ec2.launch({"InstanceType": "g5.xlarge", "ImageId": "ami-12345678"}, {TAG_RUN: "r"}, client_token="r-1",
                       attempts=3, on_error=errors.append, sleep=lambda s: None)
    finally:
        proxy.stop()
    assert len(errors) == 3 and errors[-1].retry_in_s is None
    assert "after 3 attempt(s)" in str(err.value)
    assert running_rubberband_instances(moto_ec2) == []


def test_other_launch_errors_fail_at_once(moto_ec2):
    proxy = Ec2FaultProxy(moto_ec2, fail={"RunInstances": 1}, code="UnauthorizedOperation").start()
    try:
        ec2 = Ec2("us-east-1", endpoint_url=proxy.url)
        errors = []
        with pytest.raises(ProviderError, match="UnauthorizedOperation"):
            ec2.launch({"InstanceType": "g5.xlarge", "ImageId": "ami-12345678"}, {TAG_RUN: "r"}, client_token="r-1",
                       on_error=errors.append, sleep=lambda s: None)
    finally:
        proxy.stop()
    assert len(errors) == 1


# --- down / status --------------------------------------------------------------------------------
def test_down_terminates_every_rubberband_instance_in_every_region_and_reports_spend(moto_ec2):
    east, west = Ec2("us-east-1"), Ec2("us-west-2")
    _launch(east, "run-a", 2)
    _launch(west, "run-b", 1, price="2.5")
    other = boto3.client("ec2", region_name="us-east-1").run_instances(ImageId="ami-12345678", InstanceType="t3.micro",
                                                                     MinCount=1, MaxCount=1)["Instances"][0]
    status = aws_cluster.status(["us-east-1", "us-west-2"])
    assert len(status["instances"]) == 3
    assert status["usd_per_hour"] == pytest.approx(1.006 * 2 + 2.5)
    assert all(i["cost_usd"] > 0 for i in status["instances"])     # at least the billing minimum so far

    only_a = aws_cluster.down(["us-east-1", "us-west-2"], run_id="run-a")
    assert sorted(t["run_id"] for t in only_a["terminated"]) == ["run-a", "run-a"]
    assert len(running_rubberband_instances(moto_ec2)) == 1
    rest = aws_cluster.down(["us-east-1", "us-west-2"])
    assert [t["region"] for t in rest["terminated"]] == ["us-west-2"]
    assert rest["stopped_usd_per_hour"] == pytest.approx(2.5)
    assert running_rubberband_instances(moto_ec2) == []
    # Instances rubberband did not launch are never touched.
    state = boto3.client("ec2", region_name="us-east-1").describe_instances(InstanceIds=[other["InstanceId"]])
    assert state["Reservations"][0]["Instances"][0]["State"]["Name"] == "running"


def test_cli_down_and_status_print_instances_and_spend(moto_ec2, tmp_path):
    _launch(Ec2("us-west-2"), "run-z", 1)
    env = {"PATH": "/usr/bin:/bin", "RUBBERBAND_STATE_DIR": str(tmp_path / "st"), "AWS_ENDPOINT_URL": moto_ec2,
           "AWS_ACCESS_KEY_ID": FAKE_KEY_ID, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET, "AWS_DEFAULT_REGION": "us-east-1"}
    cluster = write_cluster_yaml(tmp_path / "w.yaml", region="us-west-2")

    def cli(*args):
        return subprocess.run([str(Path(sys.executable).with_name("rubberband")), *args], capture_output=True, text=True,
                              env=env, timeout=60)

    out = cli("status", "--provider", "aws", "--cluster", str(cluster))
    assert out.returncode == 0, out.stderr
    assert "run-z" in out.stdout and "g5.xlarge" in out.stdout and "1 instance(s) running" in out.stdout
    out = cli("down", "--provider", "aws", "--json")           # us-east-1 only: nothing there
    assert out.returncode == 0 and json.loads(out.stdout)["terminated"] == []
    out = cli("down", "--provider", "aws", "--region", "us-west-2")
    assert out.returncode == 0, out.stderr
    assert "terminated 1 instance(s)" in out.stdout and "spend stopped: $1.0060/h" in out.stdout
    assert running_rubberband_instances(moto_ec2) == []
    for text in (out.stdout, out.stderr):
        assert FAKE_SECRET not in text and FAKE_KEY_ID not in text


def test_errors_never_show_credentials():
    exc = RuntimeError(f"auth failed for {FAKE_KEY_ID} secret_access_key={FAKE_SECRET}")
    line = safe_error(exc)
    assert FAKE_KEY_ID not in line and FAKE_SECRET not in line


def test_the_head_config_names_the_provider_and_holds_no_secret(tmp_path, monkeypatch):
    import rubberband as rb
    from rubberband.providers.local import autoscaling_config

    cloud = rb.CloudProfile.load("cloud_profiles/aws/us-east-1.yaml", "g5.xlarge", market="spot")
    cfg = aws_cluster.check_against_plan(
        load_cluster_config(write_cluster_yaml(tmp_path / "c.yaml", credentials=True), "g5.xlarge"), cloud, 2)
    base = autoscaling_config("rb-x", cloud, 2, 6380, str(tmp_path), 1.0, 0, 1.0)
    mirrored = aws_cluster.configure(cfg, cloud, "run-x", mirror=True)(json.loads(json.dumps(base)))
    provider = mirrored["provider"]
    assert provider["module"] == "rubberband.providers.aws_node_provider.AwsNodeProvider"
    assert provider["run_id"] == "run-x" and provider["region"] == "us-east-1" and provider["mirror"] == "local"
    assert provider["node_config"]["InstanceMarketOptions"]["MarketType"] == "spot"
    assert provider["price_usd_per_hour"] == pytest.approx(0.4246)
    # One Ray node type per market, each launching the YAML's node config on its market.
    assert provider["node_configs"]["gpu_workers_spot"]["InstanceMarketOptions"]["MarketType"] == "spot"
    assert "InstanceMarketOptions" not in provider["node_configs"]["gpu_workers"]
    assert provider["node_types"]["gpu_workers_spot"] == {"instance_type": "g5.xlarge", "market": "spot",
                                                          "price_usd_per_hour": pytest.approx(0.4246)}
    assert provider["node_types"]["gpu_workers"]["market"] == "on-demand"
    slots = {name: [r for r in t["resources"] if r.startswith("rb-slot-")]
             for name, t in mirrored["available_node_types"].items()}
    assert slots == {"ray.head.default": [], "gpu_workers": ["rb-slot-g5_xlarge"], "gpu_workers_spot": ["rb-slot-g5_xlarge_spot"]}
    assert "head_address" not in provider
    assert FAKE_SECRET not in json.dumps(mirrored) and FAKE_KEY_ID not in json.dumps(mirrored)
    assert cfg.credential_env() == {"AWS_ACCESS_KEY_ID": FAKE_KEY_ID, "AWS_SECRET_ACCESS_KEY": FAKE_SECRET,
                                    "AWS_SESSION_TOKEN": None, "AWS_PROFILE": None}   # no stray token or profile
    monkeypatch.setenv("RUBBERBAND_HEAD_ADDRESS", "10.1.2.3:6380")
    real = aws_cluster.configure(cfg, cloud, "run-x", mirror=False)(json.loads(json.dumps(base)))
    assert real["provider"]["mirror"] == "none" and real["provider"]["head_address"] == "10.1.2.3:6380"
    assert real["setup_commands"] == []       # run by the instance's user data, never over SSH


def test_a_run_without_credentials_fails_before_starting_anything(tmp_path, monkeypatch):
    from rubberband.providers.aws import load_cluster_config

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ROLE_ARN",
                "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(SpecError, match="aws credentials: none found"):
        aws_cluster.check_credentials(load_cluster_config(write_cluster_yaml(tmp_path / "c.yaml"), "g5.xlarge"))
    aws_cluster.check_credentials(load_cluster_config(write_cluster_yaml(tmp_path / "k.yaml", credentials=True), "g5.xlarge"))


def test_down_uses_the_cluster_yamls_credentials_when_the_environment_has_none(moto_ec2, tmp_path, monkeypatch):
    _launch(Ec2("us-east-1"), "run-y", 1)
    cluster = write_cluster_yaml(tmp_path / "c.yaml", credentials=True)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    out = aws_cluster.down(cluster_yamls=[str(cluster)])
    assert [t["run_id"] for t in out["terminated"]] == ["run-y"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    assert running_rubberband_instances(moto_ec2) == []


def test_the_node_provider_launches_each_node_type_on_its_market_and_a_stopped_spot_instance_is_interrupted(
        moto_ec2, tmp_path, monkeypatch):
    import time

    from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE

    from rubberband.providers.aws import TAG_MARKET
    from rubberband.providers.aws_node_provider import AwsNodeProvider

    monkeypatch.setenv("RAY_FAKE_CLUSTER", "1")          # Ray's fake provider insists on it
    base = {"InstanceType": "g5.xlarge", "ImageId": "ami-12345678"}
    spot = {**base, "InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "one-time"}}}
    p = AwsNodeProvider({
        "state_dir": str(tmp_path), "provision_latency_s": 0, "seed": 0, "gcs_address": "127.0.0.1:1",
        "launch_multiple": True, "region": "us-east-1", "run_id": "run-m", "mirror": "none",
        "head_address": "127.0.0.1:1", "price_usd_per_hour": 1.006, "node_config": base,
        "node_configs": {"gpu": base, "gpu_spot": spot},
        "node_types": {"gpu": {"market": "on-demand", "price_usd_per_hour": 1.006},
                       "gpu_spot": {"market": "spot", "price_usd_per_hour": 0.4246}}}, "rb-run-m")
    for node_type in ("gpu", "gpu_spot"):
        p.create_node_with_resources_and_labels({}, {TAG_RAY_USER_NODE_TYPE: node_type}, 1, {"CPU": 1, "GPU": 1}, {})

    def events():
        return [json.loads(line) for line in open(tmp_path / "events.jsonl")]

    deadline = time.time() + 10
    while sum(e["event"] == "running" for e in events()) < 2 and time.time() < deadline:
        time.sleep(0.05)
    ec2 = Ec2("us-east-1")
    by_market = {tags_of(i)[TAG_MARKET]: i for i in ec2.instances(run_id="run-m")}
    assert set(by_market) == {"spot", "on-demand"}
    assert by_market["spot"].get("InstanceLifecycle") == "spot" and by_market["on-demand"].get("InstanceLifecycle") is None
    assert tags_of(by_market["spot"])[TAG_PRICE] == "0.4246" and tags_of(by_market["on-demand"])[TAG_PRICE] == "1.006"
    requests = {e["instance"]: e["market"] for e in events() if e["event"] == "request"}
    running = {e["instance"]: e["market"] for e in events() if e["event"] == "running"}
    assert requests == running and sorted(running.values()) == ["on-demand", "spot"]

    # EC2 stops the spot instance behind our back (a reclaim with interruption behaviour stop).
    spot_id = by_market["spot"]["InstanceId"]
    boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_ec2).stop_instances(InstanceIds=[spot_id])
    p._last_check = 0.0
    p.non_terminated_nodes({})
    (gone,) = [e for e in events() if e["event"] == "terminated"]
    assert (gone["ec2_id"], gone["reason"]) == (spot_id, "interrupted")
    assert [i["InstanceId"] for i in ec2.instances(run_id="run-m")] == [by_market["on-demand"]["InstanceId"]]
    ec2.terminate([by_market["on-demand"]["InstanceId"]])


# --- a plan with an instance type per stage ---------------------------------------------------
def _two_types_yaml(path, big_max_workers=1, drop_big=False):
    """The test cluster YAML with a second worker type, ``big_workers`` launching g5.12xlarge."""
    path = write_cluster_yaml(path, max_workers=4)
    cfg = json.loads(path.read_text())
    if not drop_big:
        cfg["available_node_types"]["big_workers"] = {
            "node_config": {"InstanceType": "g5.12xlarge", "ImageId": "ami-87654321"},
            "min_workers": 0, "max_workers": big_max_workers, "worker_setup_commands": ["echo big"]}
    path.write_text(json.dumps(cfg))
    return path


def _two_type_clouds():
    import rubberband as rb

    return [rb.CloudProfile.load("cloud_profiles/aws/us-east-1.yaml", "g5.xlarge", market="spot"),
            rb.CloudProfile.load("cloud_profiles/aws/us-east-1.yaml", "g5.12xlarge")]


def test_a_two_type_plan_gets_one_worker_type_per_instance_type_each_on_its_market(tmp_path):
    from rubberband.providers.local import autoscaling_config

    clouds = _two_type_clouds()
    room = {"g5.xlarge": 2, "g5.12xlarge": 1}
    path = _two_types_yaml(tmp_path / "c.yaml")
    cfg = aws_cluster.check_against_plan(load_cluster_config(path, list(room)), clouds, room)
    assert list(cfg.types) == ["g5.xlarge", "g5.12xlarge"]
    assert (cfg.types["g5.xlarge"].market, cfg.types["g5.12xlarge"].market) == ("spot", "on-demand")
    base = autoscaling_config("rb-x", clouds, room, 6380, str(tmp_path), 1.0, 0, 1.0)
    ray_cfg = aws_cluster.configure(cfg, clouds, "run-x", mirror=True)(json.loads(json.dumps(base)))
    provider, workers = ray_cfg["provider"], ray_cfg["available_node_types"]
    # Each type on-demand and, having a spot price, on spot (a re-plan or the safety net may move markets).
    assert {n: w["node_config"]["InstanceType"] for n, w in workers.items() if n != "ray.head.default"} == \
        {"gpu_workers": "g5.xlarge", "gpu_workers_spot": "g5.xlarge", "big_workers": "g5.12xlarge",
         "big_workers_spot": "g5.12xlarge"}
    assert (workers["big_workers"]["resources"]["GPU"], workers["big_workers"]["max_workers"]) == (4, 1)
    assert provider["node_configs"]["big_workers"]["ImageId"] == "ami-87654321"
    assert "InstanceMarketOptions" not in provider["node_configs"]["big_workers"]
    assert provider["node_configs"]["gpu_workers_spot"]["InstanceMarketOptions"]["MarketType"] == "spot"
    assert provider["node_types"]["big_workers"] == {"instance_type": "g5.12xlarge", "market": "on-demand",
                                                     "price_usd_per_hour": pytest.approx(5.672)}
    assert provider["setup_commands_by_type"]["big_workers"][-1] == "echo big"
    assert "echo big" not in provider["setup_commands_by_type"]["gpu_workers"]
    with pytest.raises(SpecError, match=r"max_workers: the plan needs 2 instances of g5.12xlarge but the cluster allows 1"):
        aws_cluster.check_against_plan(cfg, clouds, {"g5.xlarge": 2, "g5.12xlarge": 2})


def test_a_cluster_yaml_lacking_a_type_of_the_plan_is_refused_in_one_line_before_anything_starts(tmp_path, monkeypatch):
    import rubberband as rb
    from rubberband.executor.run import execute
    from rubberband.plan import plan_allocation
    from rubberband.plan.plan import check_plan
    from rubberband.profiles.cloud import CloudCatalog

    monkeypatch.setattr("rubberband.providers.local.LocalCluster.start", lambda *a, **k: pytest.fail("started"))
    catalog = CloudCatalog.load("cloud_profiles/aws/us-east-1.yaml")
    model = rb.ModelProfile.from_dict({"iter_latency_s": {1: 1.0, 4: 0.4}})
    spec = rb.ExperimentSpec.from_stages([(4, 2), (1, 2)])
    one, four = catalog.get("g5.xlarge"), catalog.get("g5.12xlarge")
    plan = plan_allocation(spec, (4, 4), model, one, deadline_s=3600, samples=2)
    import dataclasses

    plan = check_plan(dataclasses.replace(plan, instances=(4, 1), instance_types=("g5.xlarge", "g5.12xlarge"),
                                          type_clouds={"g5.xlarge": one, "g5.12xlarge": four}), spec, model, catalog, samples=2)
    path = _two_types_yaml(tmp_path / "c.yaml", drop_big=True)
    with pytest.raises(SpecError, match=r"^.*c\.yaml: available_node_types: no worker type launches g5\.12xlarge, one of "
                                        r"the plan's instance types \(g5\.xlarge, g5\.12xlarge\); have gpu_workers "
                                        r"\(g5\.xlarge\); add a worker node type with node_config\.InstanceType: "
                                        r"g5\.12xlarge, or plan without it$") as err:
        execute(plan, "x:Y", {}, provider="aws", cluster_config=str(path), runs_dir=tmp_path / "runs")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()
