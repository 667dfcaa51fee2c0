"""The `aws` provider's cluster: a Ray head on this machine whose autoscaler launches EC2 workers.

``start`` checks the user's Ray cluster YAML against the plan (instance type, region, market,
``max_workers``), then starts the head exactly like the local provider with
``AwsNodeProvider`` as the autoscaler's node provider. ``sweep`` terminates whatever the run
still has in EC2 after the head stopped; ``down`` and ``status`` find rubberband instances by
tag in every region rubberband knows of.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from rubberband.errors import ProviderError, SpecError
from rubberband.providers import local
from rubberband.providers.aws import (
    GONE_STATES,
    AwsClusterConfig,
    Ec2,
    find_rubberband_instances,
    is_emulated_endpoint,
    load_cluster_config,
    safe_error,
    tags_of,
    terminate_rubberband_instances,
    termination_time,
)
from rubberband.providers.base import (
    Clouds,
    ProviderBase,
    ProviderEvent,
    Release,
    Room,
    clouds_of,
    cluster_node_types,
    cluster_types,
)
from rubberband.providers.local import LocalCluster

PROVIDER = "aws"


def check_against_plan(cfg: AwsClusterConfig, cloud: Clouds, max_instances: Room) -> AwsClusterConfig:
    """The cluster YAML must launch what the plan priced, each of its instance types (see
    ``providers.base.cluster_types``) from a worker type of its own; returns it set to each
    type's market."""
    types = cluster_types(cloud, max_instances)
    have = cfg.types
    for name, (c, room) in types.items():
        if c.provider != "aws":
            raise SpecError(f"cloud: the plan was made for the {c.provider!r} cloud profile; --provider aws needs an aws "
                            "profile (cloud.profile: cloud_profiles/aws/<region>.yaml)")
        if name not in have:
            if len(types) == 1:
                raise SpecError(f"{cfg.path}: node_config.InstanceType: {cfg.instance_type} but the plan is for {name}")
            raise SpecError(f"{cfg.path}: available_node_types: no worker type launches {name}, one of the plan's "
                            f"instance types ({', '.join(types)}); add a worker node type with "
                            f"node_config.InstanceType: {name}, or plan without it")
        worker = have[name]
        if cfg.region != c.region:
            raise SpecError(f"{cfg.path}: provider.region: launches in {cfg.region} but the plan was priced for {c.region}; "
                            f"use cloud_profiles/aws/{cfg.region}.yaml or change the region")
        if worker.market == "spot" and c.market.value != "spot":
            where = f"available_node_types.{worker.node_type}.node_config." if len(types) > 1 else ""
            raise SpecError(f"{cfg.path}: {where}InstanceMarketOptions: launches spot but the plan was priced on-demand; "
                            "set `market: spot` in the experiment's cloud section or remove InstanceMarketOptions")
        if room > worker.max_workers:
            raise SpecError(f"{cfg.path}: max_workers: the plan needs {room} instances of {name} "
                            f"but the cluster allows {worker.max_workers}; raise max_workers")
    first, *rest = types
    out = have[first].with_market(types[first][0].market.value)
    out.others = {name: have[name].with_market(types[name][0].market.value) for name in rest}
    return out


def check_credentials(cfg: AwsClusterConfig) -> None:
    """Fail before starting anything when boto3 would find no credentials."""
    try:
        import boto3
    except ImportError:
        raise SpecError("--provider aws: boto3 is not installed; pip install 'rubberband[aws]'") from None
    if cfg.credentials:
        return

    if boto3.session.Session().get_credentials() is None:
        raise SpecError("aws credentials: none found; set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, "
                        f"run on an instance with a role, or add provider.aws_credentials to {cfg.path}")


def configure(cfg: AwsClusterConfig, cloud: Clouds, run_id: str, mirror: bool,
              launch_attempts: int = 6, launch_backoff_s: float = 2.0, head_address: str | None = None):
    """Turn the local provider's cluster config into the aws one (nothing secret goes in).

    Each node type (an instance type on a market) launches its instance type's worker node
    config from the YAML on its market: the YAML's worker type name on-demand, ``<name>_spot``
    with ``InstanceMarketOptions`` (the YAML's spot options, if it gives any) on spot.
    """
    node_types = cluster_node_types(cloud)

    def apply(ray_cfg: dict[str, Any]) -> dict[str, Any]:
        provider = ray_cfg["provider"]
        workers = {t.ray_name: cfg.types[t.instance_type] for t in node_types}
        names = {t.ray_name: workers[t.ray_name].node_type + ("_spot" if t.spot else "") for t in node_types}
        provider.update({
            "module": "rubberband.providers.aws_node_provider.AwsNodeProvider",
            "region": cfg.region, "run_id": run_id, "node_config": cfg.node_config,
            "node_configs": {names[t.ray_name]: workers[t.ray_name].with_market(t.market).node_config for t in node_types},
            "node_types": {names[k]: v for k, v in provider["node_types"].items()},
            "mirror": "local" if mirror else "none",
            "price_usd_per_hour": clouds_of(cloud)[0].hourly_usd,
            "setup_commands": cfg.setup_commands,
            "setup_commands_by_type": {names[k]: w.setup_commands for k, w in workers.items()},
            "launch_attempts": launch_attempts,
            "launch_backoff_s": launch_backoff_s, "cluster_yaml": cfg.path,
        })
        if not mirror:
            # Real instances join the head over the network: give them an address they can reach.
            port = provider["gcs_address"].rsplit(":", 1)[1]
            provider["head_address"] = head_address or os.environ.get("RUBBERBAND_HEAD_ADDRESS") or f"{_primary_ip()}:{port}"
        ray_cfg["setup_commands"] = []   # run on the instance by its user data, not over SSH
        for ours, theirs in names.items():
            worker = ray_cfg["available_node_types"].pop(ours)
            worker["node_config"] = {"InstanceType": workers[ours].instance_type}
            ray_cfg["available_node_types"][theirs] = worker
        return ray_cfg
    return apply


def _primary_ip() -> str:
    """This machine's address on its default route (a UDP connect sends no packet)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def start(run_id: str, run_dir: str | Path, cloud: Clouds, cluster_yaml: str | Path | AwsClusterConfig,
          max_instances: Room, latency_scale: float = 1.0, seed: int = 0, launch_attempts: int = 6,
          launch_backoff_s: float = 2.0) -> tuple[LocalCluster, AwsClusterConfig]:
    """Start the run's head with ``AwsNodeProvider``; returns the cluster and the checked config."""
    cfg = cluster_yaml if isinstance(cluster_yaml, AwsClusterConfig) else \
        load_cluster_config(cluster_yaml, list(cluster_types(cloud, max_instances)))
    cfg = check_against_plan(cfg, cloud, max_instances)
    reap_orphans()
    mirror = is_emulated_endpoint()
    cluster = LocalCluster.start(
        run_id, run_dir, cloud, max_instances, latency_scale=latency_scale, seed=seed,
        configure=configure(cfg, cloud, run_id, mirror, launch_attempts, launch_backoff_s),
        provider=PROVIDER, meta={"regions": [cfg.region], "cluster_yaml": cfg.path, "instance_type": "+".join(cfg.types),
                                 "mirror": mirror},
        extra_env=cfg.credential_env())
    return cluster, cfg


def sweep(cluster: LocalCluster, region: str, credentials: dict[str, str] | None = None) -> list[str]:
    """After the head stopped: terminate anything of this run still in EC2 and log it.

    The provider terminates what it releases; this catches an instance launched in the last
    moment before the head went down, so nothing of the run is left billing.
    """
    ec2 = Ec2(region, credentials=credentials)
    left = ec2.instances(run_id=cluster.run_id)
    # A launch in flight when the head stopped may take a moment to show (EC2 is eventually
    # consistent): look twice.
    time.sleep(1.0)
    seen = {i["InstanceId"] for i in left}
    left += [i for i in ec2.instances(run_id=cluster.run_id) if i["InstanceId"] not in seen]
    ids = ec2.terminate(i["InstanceId"] for i in left)
    if ids:
        gone = {i["InstanceId"]: i for i in ec2.instances(run_id=cluster.run_id, instance_ids=ids,
                                                          states=GONE_STATES)}
        with open(cluster.events_path, "a") as fh:
            for inst in left:
                tags = tags_of(inst)
                t = termination_time(gone.get(inst["InstanceId"], {})) or time.time()
                fh.write(json.dumps({"event": ProviderEvent.TERMINATED,
                                     "instance": tags.get("rubberband:instance", inst["InstanceId"]),
                                     "ec2_id": inst["InstanceId"], "reason": Release.SHUTDOWN, "t": time.time(),
                                     "t_ec2": t}) + "\n")
    return ids


def known_regions(extra: list[str] | None = None) -> list[str]:
    """Regions to look in: the given ones, those of runs rubberband recorded, and the default."""
    regions = set(extra or [])
    for run in _recorded_runs():
        regions.update(run.get("regions", []))
    default = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if default:
        regions.add(default)
    return sorted(regions)


def _runs_index() -> Path:
    return local.STATE_ROOT.parent / "aws-runs"


def remember_run(run_id: str, region: str, cluster_yaml: str | None = None) -> None:
    """Record that a run launched in ``region`` from ``cluster_yaml`` (so `down` looks there,
    with that file's credentials, even after the head is gone)."""
    _runs_index().mkdir(parents=True, exist_ok=True)
    (_runs_index() / f"{run_id}.json").write_text(json.dumps(
        {"run_id": run_id, "regions": [region], "cluster_yaml": cluster_yaml, "at": time.time()}))


def _recorded_runs() -> list[dict[str, Any]]:
    """What rubberband recorded of aws runs: their heads' state files and the runs index
    (``regions``, ``cluster_yaml``)."""
    out = [c.meta for c in LocalCluster.known(PROVIDER)]
    for path in sorted(_runs_index().glob("*.json")) if _runs_index().exists() else []:
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def _recorded_yamls() -> list[str]:
    paths = [run.get("cluster_yaml") for run in _recorded_runs()]
    return [p for p in paths if p and Path(p).is_file()]


def _credentials_by_region(cluster_yamls: list[str]) -> dict[str, dict[str, str]]:
    """``provider.aws_credentials`` of cluster YAMLs, by region (a run whose only credentials
    were in its YAML must still be cleaned up by `down`)."""
    out: dict[str, dict[str, str]] = {}
    for path in cluster_yamls:
        region, creds = _auth_of(path)
        if creds:
            out.setdefault(region, creds)
    return out


def forget_run(run_id: str) -> None:
    (_runs_index() / f"{run_id}.json").unlink(missing_ok=True)


def reap_orphans() -> list[dict[str, Any]]:
    """Runs whose driver was killed: stop their heads, terminate their instances."""
    out = []
    for cluster in LocalCluster.known(PROVIDER):
        if cluster.driver_pid and not local._alive([cluster.driver_pid]):
            out += down(run_id=cluster.run_id)["terminated"]
    return out


def down(regions: list[str] | None = None, run_id: str | None = None, cluster_yamls: list[str] | None = None) -> dict[str, Any]:
    """Stop rubberband's aws heads (so nothing relaunches), then terminate every tagged instance."""
    extra = list(regions or [])
    extra += [_region_of(p) for p in cluster_yamls or []]
    creds = _credentials_by_region(list(cluster_yamls or []) + _recorded_yamls())
    heads = local.down_all(PROVIDER, run_id)
    for head in heads:
        extra += head["meta"].get("regions", [])
    where = known_regions(extra)
    if not where:
        raise SpecError("--region: no region to look in; pass --region, --cluster or set AWS_DEFAULT_REGION")
    terminated = terminate_rubberband_instances(where, run_id=run_id, credentials=creds)
    for t in terminated:
        if t["run_id"]:
            forget_run(t["run_id"])
    if run_id:
        forget_run(run_id)
    elif not terminated:
        for path in _runs_index().glob("*.json") if _runs_index().exists() else []:
            path.unlink(missing_ok=True)
    return {"regions": where, "heads": heads, "terminated": terminated,
            "stopped_usd_per_hour": sum(t["price_usd_per_hour"] for t in terminated if t["price_usd_per_hour"] == t["price_usd_per_hour"]),
            "spent_usd": sum(t["cost_usd"] or 0.0 for t in terminated)}


def status(regions: list[str] | None = None, run_id: str | None = None, cluster_yamls: list[str] | None = None) -> dict[str, Any]:
    """Running rubberband instances and their cost so far."""
    extra = list(regions or []) + [_region_of(p) for p in cluster_yamls or []]
    where = known_regions(extra)
    if not where:
        raise SpecError("--region: no region to look in; pass --region, --cluster or set AWS_DEFAULT_REGION")
    found = find_rubberband_instances(where, run_id=run_id,
                                      credentials=_credentials_by_region(list(cluster_yamls or []) + _recorded_yamls()))
    heads = [{"run_id": c.run_id, "processes": len(c.processes()), "run_dir": str(c.run_dir)}
             for c in LocalCluster.known(PROVIDER)
             if run_id is None or c.run_id == run_id]
    return {"regions": where, "instances": found, "heads": heads,
            "usd_per_hour": sum(i["price_usd_per_hour"] for i in found if i["price_usd_per_hour"] == i["price_usd_per_hour"]),
            "spent_usd": sum(i["cost_usd"] or 0.0 for i in found)}


def _auth_of(path: str) -> tuple[str, dict[str, str]]:
    """A cluster YAML's region and ``provider.aws_credentials`` (read leniently: `down` must
    work even from a file that no longer validates)."""
    from rubberband.schema import load_yaml

    data = load_yaml(path, "cluster YAML")
    given = data.get("provider")
    provider: dict[str, Any] = given if isinstance(given, dict) else {}
    region = provider.get("region")
    if not isinstance(region, str):
        raise SpecError(f"{path}: provider.region: missing; add the AWS region")
    creds = provider.get("aws_credentials")
    return region, {str(k): str(v) for k, v in creds.items()} if isinstance(creds, dict) else {}


def _region_of(path: str) -> str:
    return _auth_of(path)[0]



class AwsProvider(ProviderBase):
    """The `aws` provider: EC2 instances launched by Ray's autoscaler (``providers.base.Provider``)."""

    name = PROVIDER
    cluster_yaml = True

    def load_cluster_yaml(self, path: str | Path, instance_type: str) -> AwsClusterConfig:
        """Reads YAML only: boto3 is imported by the EC2 calls, which loading never makes."""
        return load_cluster_config(path, instance_type)

    def check(self, cloud: Clouds, max_instances: Room, cluster: str | Path | AwsClusterConfig) -> AwsClusterConfig:
        cfg = cluster if isinstance(cluster, AwsClusterConfig) else \
            load_cluster_config(cluster, list(cluster_types(cloud, max_instances)))
        cfg = check_against_plan(cfg, cloud, max_instances)
        check_credentials(cfg)
        return cfg

    def max_workers(self, config: AwsClusterConfig, instance_type: str) -> int | None:
        worker = config.types.get(instance_type)
        return worker.max_workers if worker is not None else None

    def start(self, run_id: str, run_dir: Path, cloud: Clouds, max_instances: Room, config: AwsClusterConfig, *,
              seed: int, latency_scale: float, launch_attempts: int, launch_backoff_s: float) -> LocalCluster:
        remember_run(run_id, config.region, config.path)     # so `down` looks there, even after a SIGKILL
        cluster, _ = start(run_id, run_dir, cloud, config, max_instances, latency_scale=latency_scale, seed=seed,
                           launch_attempts=launch_attempts, launch_backoff_s=launch_backoff_s)
        return cluster

    def sweep(self, cluster: LocalCluster, config: AwsClusterConfig) -> None:
        try:
            sweep(cluster, config.region, config.credentials)
        except Exception as exc:
            raise ProviderError(f"could not check EC2 in {config.region} for instances left running: "
                                f"{safe_error(exc)}") from None
        forget_run(cluster.run_id)

    def down(self, run_id: str | None, regions: list[str], cluster_yamls: list[str]) -> dict[str, Any]:
        return _ec2_call(lambda: down(regions, run_id, cluster_yamls))

    def status(self, run_id: str | None, regions: list[str], cluster_yamls: list[str]) -> dict[str, Any]:
        return _ec2_call(lambda: status(regions, run_id, cluster_yamls))


def _ec2_call(fn):
    """Run an EC2 query; turn a missing SDK, a missing credential or an AWS error into one line."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
    except ImportError:
        raise SpecError("--provider aws: boto3 is not installed; pip install 'rubberband[aws]'") from None
    try:
        return fn()
    except NoCredentialsError:
        raise ProviderError("aws: no AWS credentials found; set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
                            "AWS_PROFILE (or run `aws configure`)") from None
    except (BotoCoreError, ClientError) as exc:
        raise ProviderError(f"aws: {safe_error(exc)}") from None
