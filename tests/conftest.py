"""Fixtures shared by unit and integration tests."""

import json
import urllib.request

import pytest

FAKE_KEY_ID = "AKIAFAKERUBBERBAND01"
FAKE_SECRET = "rubberbandFakeSecretKey/DoNotLogThis0000000"


@pytest.fixture(scope="session")
def _moto_server():
    """One moto EC2 server on 127.0.0.1 (a free port) for the whole session."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    yield url
    # Safety net over the whole session: no test may leave a rubberband instance running.
    leftover = running_rubberband_instances(url)
    server.stop()
    assert not leftover, f"rubberband instances left running in moto after the test session: {leftover}"


@pytest.fixture
def moto_ec2(_moto_server, monkeypatch):
    """A clean moto EC2 that boto3 (here and in child processes) talks to; yields its URL."""
    req = urllib.request.Request(f"{_moto_server}/moto-api/reset", data=b"", method="POST")
    urllib.request.urlopen(req, timeout=10).read()
    monkeypatch.setenv("AWS_ENDPOINT_URL", _moto_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_EC2"):
        monkeypatch.delenv(var, raising=False)
    import boto3

    # The IAM instance profile the test cluster YAMLs give their workers (EC2 checks it exists).
    boto3.client("iam", region_name="us-east-1", endpoint_url=_moto_server).create_instance_profile(
        InstanceProfileName="rubberband-worker")
    yield _moto_server
    # Every test must leave no rubberband instance running (checked before the next reset).
    leftover = running_rubberband_instances(_moto_server)
    assert not leftover, f"rubberband instances left running in moto by this test: {leftover}"


def running_rubberband_instances(endpoint: str, regions=("us-east-1", "us-west-2")) -> list[str]:
    """Ids of rubberband-tagged instances moto still has pending or running (any region)."""
    import boto3

    out = []
    for region in regions:
        ec2 = boto3.client("ec2", region_name=region, endpoint_url=endpoint)
        pages = ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": ["rubberband:run-id"]},
                                               {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}])
        out += [i["InstanceId"] for r in pages["Reservations"] for i in r["Instances"]]
    return out


def write_cluster_yaml(path, instance_type="g5.xlarge", region="us-east-1", max_workers=4, spot=False, extra_node_config=None,
                       credentials=False):
    node_config = {"InstanceType": instance_type, "ImageId": "ami-12345678",
                   "IamInstanceProfile": {"Name": "rubberband-worker"}}
    if spot:
        node_config["InstanceMarketOptions"] = {"MarketType": "spot"}
    node_config.update(extra_node_config or {})
    provider = {"type": "aws", "region": region, "cache_stopped_nodes": False}
    if credentials:
        provider["aws_credentials"] = {"aws_access_key_id": FAKE_KEY_ID, "aws_secret_access_key": FAKE_SECRET}
    cfg = {
        "cluster_name": "rb-test", "max_workers": max_workers, "provider": provider, "auth": {"ssh_user": "ubuntu"},
        "head_node_type": "head",
        "available_node_types": {
            "head": {"node_config": {"InstanceType": "m5.large", "ImageId": "ami-12345678"}, "resources": {}},
            "gpu_workers": {"node_config": node_config, "min_workers": 0, "max_workers": max_workers},
        },
        "setup_commands": ["pip install 'rubberband[ray,torch]'"],
    }
    path.write_text(json.dumps(cfg))   # JSON is YAML
    return path
