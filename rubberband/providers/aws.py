"""The `aws` provider's EC2 side: the user's Ray cluster YAML, and every boto3 call rubberband makes.

Nothing here imports Ray. ``AwsNodeProvider`` (Ray's autoscaler plug-in, in
``aws_node_provider.py``) launches and terminates through ``Ec2``; ``rubberband down`` and
``rubberband status`` find instances through the same class, by tag:

    rubberband:run-id    the run that launched the instance
    rubberband:cluster   the Ray cluster name of that run
    rubberband:instance  the executor's name for it (``rb-instance-<n>``, a Ray resource)
    rubberband:price-usd-per-hour  the price the run's ledger uses (so `down` can report spend)
    rubberband:market    spot or on-demand
    ray-cluster-name     Ray's own tag, so Ray tooling recognises the nodes

Credentials are never read into rubberband's own objects beyond the boto3 session: they come
from the usual chain (environment, ~/.aws, instance role) or from the cluster YAML's
``provider.aws_credentials``, which is handed to the head process in its environment and never
written to any file rubberband produces.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import os
import re
import shlex
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rubberband.errors import ProviderError, SpecError
from rubberband.schema import check_mapping, integer, load_yaml, strings

TAG_RUN = "rubberband:run-id"
TAG_CLUSTER = "rubberband:cluster"
TAG_INSTANCE = "rubberband:instance"
TAG_PRICE = "rubberband:price-usd-per-hour"
TAG_MARKET = "rubberband:market"
TAG_RAY_CLUSTER = "ray-cluster-name"
ACTIVE_STATES = ("pending", "running", "stopping", "stopped")
GONE_STATES = ("shutting-down", "terminated")

# Launch errors worth waiting out: the capacity is not there *now* (EC2's own advice is to
# retry later or elsewhere), or the API throttled us. Anything else (bad AMI, no permission,
# quota) is a mistake a retry cannot fix and fails at once.
RETRYABLE_LAUNCH_ERRORS = frozenset({
    "InsufficientInstanceCapacity", "InsufficientHostCapacity", "InsufficientReservedInstanceCapacity",
    "InsufficientCapacity", "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded",
    "RequestLimitExceeded", "Unavailable", "ServiceUnavailable", "InternalError",
})

# Keys of Ray's cluster YAML (https://docs.ray.io/en/latest/cluster/vms/references/ray-cluster-configuration.html).
RAY_CLUSTER_KEYS = (
    "cluster_name", "max_workers", "upscaling_speed", "idle_timeout_minutes", "docker", "provider", "auth",
    "available_node_types", "head_node_type", "file_mounts", "cluster_synced_files",
    "file_mounts_sync_continuously", "rsync_exclude", "rsync_filter", "initialization_commands",
    "setup_commands", "head_setup_commands", "worker_setup_commands", "head_start_ray_commands",
    "worker_start_ray_commands", "no_restart", "min_workers",
)
PROVIDER_KEYS = (
    "type", "region", "availability_zone", "cache_stopped_nodes", "use_internal_ips", "aws_credentials",
    "security_group", "cloudwatch", "key_pair", "use_node_id_as_ip", "disable_launch_config_check",
    "disable_node_updaters", "launch_multiple", "head_ip", "foreground_node_launch", "vpc_id",
)
NODE_TYPE_KEYS = ("node_config", "resources", "min_workers", "max_workers", "worker_setup_commands",
                  "labels", "docker")
CREDENTIAL_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
# EC2's RunInstances InstanceMarketOptions.SpotOptions.
SPOT_OPTION_KEYS = ("MaxPrice", "SpotInstanceType", "BlockDurationMinutes", "ValidUntil", "InstanceInterruptionBehavior")
# RunInstances parameters rubberband sets itself.
OWNED_NODE_CONFIG_KEYS = ("MinCount", "MaxCount", "UserData", "ClientToken")


def _iso(t: datetime) -> float:
    return t.replace(tzinfo=t.tzinfo or UTC).timestamp()


@dataclass
class AwsClusterConfig:
    """What rubberband takes from a Ray cluster YAML with ``provider: {type: aws}``."""

    path: str
    cluster_name: str
    region: str
    node_type: str
    node_config: dict[str, Any]
    setup_commands: list[str]
    max_workers: int
    resources: dict[str, Any] = field(default_factory=dict)
    credentials: dict[str, str] = field(default_factory=dict, repr=False)
    # The worker types of a plan's other instance types (a plan with a type per stage).
    others: dict[str, AwsClusterConfig] = field(default_factory=dict, repr=False)

    @property
    def instance_type(self) -> str:
        return str(self.node_config["InstanceType"])

    @property
    def types(self) -> dict[str, AwsClusterConfig]:
        """The worker type of each instance type the run launches, this one first."""
        return {self.instance_type: self, **self.others}

    @property
    def market(self) -> str:
        opts = self.node_config.get("InstanceMarketOptions") or {}
        return "spot" if opts.get("MarketType") == "spot" else "on-demand"

    def with_market(self, market: str) -> AwsClusterConfig:
        """The same config launching on ``market`` (spot adds ``InstanceMarketOptions``)."""
        if market == self.market:
            return self
        cfg = copy.deepcopy(self)
        if market == "spot":
            cfg.node_config["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
        else:
            cfg.node_config.pop("InstanceMarketOptions", None)
        return cfg

    def credential_env(self) -> dict[str, str | None]:
        """``provider.aws_credentials`` as the environment variables boto3 reads."""
        names = {"aws_access_key_id": "AWS_ACCESS_KEY_ID", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
                 "aws_session_token": "AWS_SESSION_TOKEN"}
        if not self.credentials:
            return {}
        # The YAML's keys replace the whole environment chain: no stray token or profile.
        env: dict[str, str | None] = {"AWS_SESSION_TOKEN": None, "AWS_PROFILE": None}
        env.update({names[k]: str(v) for k, v in self.credentials.items() if k in names})
        return env


def load_cluster_config(path: str | Path, instance_type: str | Sequence[str] | None = None) -> AwsClusterConfig:
    """Read a Ray cluster YAML and pick the worker node type that launches ``instance_type``;
    given several instance types (a plan with a type per stage, its own first), one worker
    type for each (the others in ``others``).

    Raises ``SpecError`` naming the file, the field and the fix for anything rubberband cannot run.
    """
    data = load_yaml(path, "cluster YAML")
    wanted: list[str | None] = [instance_type] if instance_type is None or isinstance(instance_type, str) else list(dict.fromkeys(instance_type))
    try:
        cfgs = [_cluster_config(data, str(path), name, wanted) for name in wanted]
    except SpecError as exc:
        raise SpecError(f"{path}: {exc}") from None
    cfgs[0].others = {c.instance_type: c for c in cfgs[1:]}
    return cfgs[0]


def _cluster_config(data: dict[str, Any], path: str, instance_type: str | None,
                    wanted: list[str | None]) -> AwsClusterConfig:
    data = check_mapping(data, "", optional=RAY_CLUSTER_KEYS)
    if data.get("provider") is None:
        raise SpecError("provider: missing; add `provider: {type: aws, region: us-east-1}`")
    provider = check_mapping(data["provider"], "provider", required=["type", "region"], optional=PROVIDER_KEYS)
    if provider["type"] != "aws":
        raise SpecError(f"provider.type: expected aws, got {provider['type']!r}")
    region = provider["region"]
    if not isinstance(region, str) or not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", region):
        raise SpecError(f"provider.region: expected an AWS region such as us-east-1, got {region!r}")
    creds = check_mapping(provider.get("aws_credentials") or {}, "provider.aws_credentials", optional=CREDENTIAL_KEYS)

    types = data.get("available_node_types")
    if not isinstance(types, dict) or not types:
        raise SpecError("available_node_types: missing; add a worker node type with node_config.InstanceType")
    head = data.get("head_node_type")
    workers = {name: check_mapping(entry, f"available_node_types.{name}", required=["node_config"],
                                   optional=NODE_TYPE_KEYS)
               for name, entry in types.items() if name != head}
    for name, entry in workers.items():
        if not isinstance(entry["node_config"], dict) or not isinstance(entry["node_config"].get("InstanceType"), str):
            raise SpecError(f"available_node_types.{name}.node_config.InstanceType: missing; name the EC2 instance type")
    if not workers:
        raise SpecError(f"available_node_types: only the head type {head!r}; add a worker node type")
    name = _worker_type(workers, instance_type, wanted)
    entry = workers[name]
    node_config = _node_config(entry["node_config"], f"available_node_types.{name}.node_config")

    commands = [c for key, value in (("setup_commands", data.get("setup_commands")),
                                     ("worker_setup_commands", data.get("worker_setup_commands")),
                                     (f"available_node_types.{name}.worker_setup_commands", entry.get("worker_setup_commands")))
                if value is not None for c in strings(value, key, "shell commands")]
    limits = [integer(v, key) for key, v in (("max_workers", data.get("max_workers")),
                                              (f"available_node_types.{name}.max_workers", entry.get("max_workers")))
              if v is not None]
    return AwsClusterConfig(
        path=path, cluster_name=str(data.get("cluster_name", "rubberband")), region=region, node_type=str(name),
        node_config=node_config, setup_commands=commands, max_workers=min(limits) if limits else 64,
        resources=dict(entry.get("resources") or {}), credentials={str(k): str(v) for k, v in creds.items()},
    )


def _worker_type(workers: dict[str, dict[str, Any]], instance_type: str | None, wanted: list[str | None]) -> str:
    """The worker node type that launches ``instance_type`` (the only one when it is ``None``),
    one of the plan's ``wanted`` types."""
    if instance_type is None:
        if len(workers) > 1:
            raise SpecError(f"available_node_types: {len(workers)} worker types ({', '.join(workers)}); "
                            "say which instance type to run (the plan's)")
        return next(iter(workers))
    matches = [n for n, e in workers.items() if e["node_config"]["InstanceType"] == instance_type]
    if not matches:
        have = ", ".join(f"{n} ({e['node_config']['InstanceType']})" for n, e in workers.items())
        if len(wanted) > 1:
            raise SpecError(f"available_node_types: no worker type launches {instance_type}, one of the plan's "
                            f"instance types ({', '.join(map(str, wanted))}); have {have}; add a worker node type "
                            f"with node_config.InstanceType: {instance_type}, or plan without it")
        raise SpecError(f"available_node_types: no worker type launches {instance_type} (the plan's instance "
                        f"type); have {have}; add one or plan for one of these")
    return matches[0]


def _node_config(node_config: dict[str, Any], where: str) -> dict[str, Any]:
    """A worker's ``RunInstances`` parameters, checked for what rubberband relies on."""
    node_config = copy.deepcopy(node_config)
    if not isinstance(node_config.get("ImageId"), str) or not node_config["ImageId"].startswith("ami-"):
        raise SpecError(f"{where}.ImageId: missing or not an AMI id; use an AMI with Ray and PyTorch "
                        "(e.g. an AWS Deep Learning AMI)")
    for key in OWNED_NODE_CONFIG_KEYS:
        if key in node_config:
            raise SpecError(f"{where}.{key}: rubberband sets this itself; remove it")
    if node_config.get("InstanceMarketOptions") is not None:
        market = check_mapping(node_config["InstanceMarketOptions"], f"{where}.InstanceMarketOptions",
                               required=["MarketType"], optional=["SpotOptions"])
        if market["MarketType"] != "spot":
            raise SpecError(f"{where}.InstanceMarketOptions.MarketType: expected spot, got {market['MarketType']!r}")
        spot = check_mapping(market.get("SpotOptions") or {}, f"{where}.InstanceMarketOptions.SpotOptions",
                             optional=SPOT_OPTION_KEYS)
        if spot.get("SpotInstanceType", "one-time") != "one-time":
            raise SpecError(f"{where}.InstanceMarketOptions.SpotOptions.SpotInstanceType: must be one-time (a persistent "
                            "request relaunches every instance rubberband terminates)")
        if spot.get("InstanceInterruptionBehavior", "terminate") != "terminate":
            raise SpecError(f"{where}.InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior: must be terminate")
    if node_config.get("DisableApiTermination"):
        raise SpecError(f"{where}.DisableApiTermination: rubberband must be able to terminate its instances; remove it")
    for key in ("SubnetIds", "SecurityGroupIds"):
        if key in node_config:
            strings(node_config[key], f"{where}.{key}", "ids")
    return node_config


def endpoint_url() -> str | None:
    """The EC2 endpoint boto3 will use when it is not AWS's (``AWS_ENDPOINT_URL[_EC2]``)."""
    return os.environ.get("AWS_ENDPOINT_URL_EC2") or os.environ.get("AWS_ENDPOINT_URL") or None


def is_emulated_endpoint(url: str | None = None) -> bool:
    """True when EC2 is an emulator on this machine (moto): its instances have no machines
    behind them, so the provider mirrors each with a local Ray node."""
    url = url if url is not None else endpoint_url()
    if not url:
        return False
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def worker_user_data(setup_commands: list[str], head_address: str, node_id: str, node_type: str,
                     gpus: int, resources: dict[str, float]) -> str:
    """The boot script of a real EC2 worker: run the setup commands, then join the head.

    Ray's own AWS provider bootstraps over SSH; rubberband never connects to its instances and
    lets cloud-init run this instead. The node announces the same identity Ray's autoscaler
    gave it (cloud instance id and node type) and the executor's instance resource.
    """
    env = {"RAY_CLOUD_INSTANCE_ID": node_id, "RAY_OVERRIDE_NODE_ID_FOR_TESTING": node_id,
           "RAY_NODE_TYPE_NAME": node_type, "RAY_USAGE_STATS_ENABLED": "0"}
    lines = ["#!/bin/bash", "set -euo pipefail", "exec > /var/log/rubberband-setup.log 2>&1"]
    lines += list(setup_commands)
    lines.append(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
                 + f" ray start --address={shlex.quote(head_address)} --num-gpus={gpus}"
                 + f" --resources={shlex.quote(json.dumps(resources, sort_keys=True))} --disable-usage-stats")
    return "\n".join(lines) + "\n"


class LaunchFailed(ProviderError):
    """RunInstances failed for good; ``retryable`` says whether waiting could have helped."""

    def __init__(self, message: str, code: str, retryable: bool):
        super().__init__(message)
        self.code, self.retryable = code, retryable


@dataclass
class LaunchError:
    """One failed RunInstances call."""

    code: str
    message: str
    attempt: int
    retry_in_s: float | None     # None: given up


class Ec2:
    """The EC2 calls rubberband makes, in one region (boto3; ``AWS_ENDPOINT_URL`` for moto)."""

    def __init__(self, region: str, endpoint_url: str | None = None, credentials: dict[str, str] | None = None):
        import boto3
        from botocore.config import Config

        self.region = region
        # Explicit credentials (a cluster YAML's provider.aws_credentials) or boto3's usual chain.
        session = boto3.session.Session(**{k: v for k, v in (credentials or {}).items()
                                           if k in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")})
        self.client = session.client("ec2", region_name=region, endpoint_url=endpoint_url,
                                     config=Config(retries={"max_attempts": 4, "mode": "standard"}))
        # No SDK retries for launches: rubberband retries them itself, with backoff, and reports each.
        self.launch_client = session.client("ec2", region_name=region, endpoint_url=endpoint_url,
                                            config=Config(retries={"total_max_attempts": 1, "mode": "standard"}))

    # --- launch --------------------------------------------------------------------------
    def default_subnets(self) -> list[str]:
        out = self.client.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])
        return [s["SubnetId"] for s in sorted(out.get("Subnets", []), key=lambda s: s.get("AvailabilityZone", ""))]

    def launch(self, node_config: dict[str, Any], tags: dict[str, str], client_token: str, user_data: str | None = None,
               attempts: int = 6, backoff_s: float = 2.0, max_backoff_s: float = 60.0,
               on_error: Callable[[LaunchError], None] | None = None, sleep: Callable[[float], None] = time.sleep,
               should_stop: Callable[[], bool] = lambda: False) -> dict[str, Any]:
        """Launch one instance; retry capacity errors with exponential backoff across subnets.

        Every failed attempt is reported through ``on_error``; the last one raises
        ``ProviderError`` with EC2's error code.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        conf = copy.deepcopy(node_config)
        subnets = conf.pop("SubnetIds", None) or ([conf.pop("SubnetId")] if conf.get("SubnetId") else [])
        user_tags = conf.pop("TagSpecifications", [])
        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        specs: list[dict[str, Any]] = [{"ResourceType": "instance", "Tags": list(tag_list)}]
        for spec in user_tags:
            if spec.get("ResourceType") == "instance":
                specs[0]["Tags"] += [t for t in spec.get("Tags", []) if t.get("Key") not in tags]
            else:
                specs.append(spec)
        if conf.get("InstanceMarketOptions", {}).get("MarketType") == "spot":
            specs.append({"ResourceType": "spot-instances-request", "Tags": list(tag_list)})
        conf.update(MinCount=1, MaxCount=1, TagSpecifications=specs, ClientToken=client_token[:64])
        if user_data is not None:
            conf["UserData"] = user_data
        delay = backoff_s
        for attempt in range(1, attempts + 1):
            if subnets:
                conf["SubnetId"] = subnets[(attempt - 1) % len(subnets)]
            try:
                out = self.launch_client.run_instances(**conf)
                return out["Instances"][0]
            except BotoCoreError as exc:
                # The request may or may not have reached EC2: retry with the same ClientToken,
                # so a launch that did happen is returned instead of duplicated.
                retry = attempt < attempts and not should_stop()
                if on_error:
                    on_error(LaunchError(type(exc).__name__, str(exc), attempt, delay if retry else None))
                if not retry:
                    raise LaunchFailed(f"EC2 RunInstances {conf.get('InstanceType')} in {self.region}: {type(exc).__name__}: "
                                       f"{exc}", type(exc).__name__, True) from None
                sleep(delay)
                delay = min(max_backoff_s, delay * 2)
                continue
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "ClientError")
                message = exc.response.get("Error", {}).get("Message", str(exc))
                retry = code in RETRYABLE_LAUNCH_ERRORS and attempt < attempts and not should_stop()
                if on_error:
                    on_error(LaunchError(code, message, attempt, delay if retry else None))
                if not retry:
                    raise LaunchFailed(f"EC2 RunInstances {conf.get('InstanceType')} in {self.region} failed after "
                                       f"{attempt} attempt(s): {code}: {message}", code,
                                       code in RETRYABLE_LAUNCH_ERRORS) from None
                sleep(delay)
                delay = min(max_backoff_s, delay * 2)
                # A new token: EC2 remembers a failed token's answer.
                conf["ClientToken"] = f"{client_token[:56]}-r{attempt}"
        raise AssertionError("unreachable")

    # --- find and terminate -------------------------------------------------------------
    def instances(self, run_id: str | None = None, instance_ids: Iterable[str] | None = None,
                  states: Iterable[str] = ACTIVE_STATES) -> list[dict[str, Any]]:
        """Instances tagged by rubberband (one run's, or every run's) in the given states."""
        filters = [{"Name": "instance-state-name", "Values": list(states)}]
        filters.append({"Name": f"tag:{TAG_RUN}", "Values": [run_id]} if run_id else {"Name": "tag-key", "Values": [TAG_RUN]})
        kwargs: dict[str, Any] = {"Filters": filters}
        if instance_ids is not None:
            kwargs["InstanceIds"] = list(instance_ids)
            if not kwargs["InstanceIds"]:
                return []
        out = []
        for page in self.client.get_paginator("describe_instances").paginate(**kwargs):
            for reservation in page.get("Reservations", []):
                out.extend(reservation.get("Instances", []))
        return out

    def terminate(self, instance_ids: Iterable[str]) -> list[str]:
        ids = sorted(set(instance_ids))
        if not ids:
            return []
        self.client.terminate_instances(InstanceIds=ids)
        return ids


def tags_of(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def launch_time(instance: dict[str, Any]) -> float:
    """EC2's LaunchTime as a Unix timestamp."""
    value = instance["LaunchTime"]
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return _iso(value)


def termination_time(instance: dict[str, Any]) -> float | None:
    """When EC2 says the instance was shut down (``StateTransitionReason``), if it says."""
    m = re.search(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (GMT|UTC)\)", instance.get("StateTransitionReason") or "")
    if not m:
        return None
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def instance_summary(instance: dict[str, Any], region: str, now: float | None = None,
                     minimum_s: float = 60.0) -> dict[str, Any]:
    """One instance as `status` and `down` show it: who launched it, how long it ran, its cost."""
    now = time.time() if now is None else now
    tags = tags_of(instance)
    try:
        price = float(tags.get(TAG_PRICE, "nan"))
    except ValueError:
        price = float("nan")
    up = max(0.0, now - launch_time(instance))
    return {
        "instance_id": instance["InstanceId"], "region": region, "instance_type": instance.get("InstanceType"),
        "state": instance.get("State", {}).get("Name"), "market": "spot" if instance.get("InstanceLifecycle") == "spot" else "on-demand",
        "run_id": tags.get(TAG_RUN), "cluster": tags.get(TAG_CLUSTER), "name": tags.get(TAG_INSTANCE),
        "uptime_s": up, "price_usd_per_hour": price,
        "cost_usd": max(up, minimum_s) * price / 3600.0 if price == price else None,
    }


def find_rubberband_instances(regions: Iterable[str], run_id: str | None = None,
                              credentials: dict[str, dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """Every rubberband instance not yet terminated, in every given region (``credentials``
    per region, from cluster YAMLs; else boto3's chain)."""
    out = []
    for region in sorted(set(regions)):
        ec2 = Ec2(region, credentials=(credentials or {}).get(region))
        out += [instance_summary(i, region) for i in ec2.instances(run_id=run_id)]
    return out


def terminate_rubberband_instances(regions: Iterable[str], run_id: str | None = None,
                                   credentials: dict[str, dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """Terminate every rubberband instance (of one run, or all) in every region; return them."""
    found = []
    for region in sorted(set(regions)):
        ec2 = Ec2(region, credentials=(credentials or {}).get(region))
        live = ec2.instances(run_id=run_id)
        ec2.terminate(i["InstanceId"] for i in live)
        found += [instance_summary(i, region) for i in live]
    return found


def safe_error(exc: BaseException) -> str:
    """An AWS error as one line without anything that looks like a credential."""
    text = f"{type(exc).__name__}: {exc}"
    text = re.sub(r"(A[SK]IA[0-9A-Z]{12,})", "<access-key>", text)
    return re.sub(r"(?i)(secret[_-]?access[_-]?key|session[_-]?token)\S*", r"\1=<redacted>", text)
