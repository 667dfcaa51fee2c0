"""Ray node provider of the `aws` provider: every node is an EC2 instance launched with boto3.

Loaded by Ray's autoscaler (``provider: {type: external, module: ...}``) in the head node's
monitor process, like ``LocalNodeProvider``; both specialise ``RubberbandNodeProvider``
(``providers.node_provider``: node ids, the ``rb-instance-<n>`` resource, ``release.json``,
the event log). What it adds:

- ``run_instances`` with the node config of the user's Ray cluster YAML (AMI, subnets, security
  groups, IAM instance profile), on the node type's market (spot adds ``InstanceMarketOptions``),
  tagged with the run id, cluster name, market and that market's price; capacity errors retried with exponential backoff, each attempt logged as a
  ``launch_error`` event (the executor prints them and reports a launch that never succeeds);
- ``terminate_instances`` when the autoscaler or the executor releases a node;
- a describe of the run's instances every update: an instance EC2 shut down behind our back
  (a spot reclaim) is dropped, logged as ``terminated`` with ``reason: interrupted``, and the
  autoscaler launches a replacement for the still-pending request;
- ledger times from EC2 itself: ``running`` at the instance's ``LaunchTime`` and
  ``terminated`` at the time in its ``StateTransitionReason`` (else when it was seen gone).

Bootstrapping: against real EC2 the instance's user data runs the YAML's setup commands and
``ray start --address=<head>`` (rubberband never SSHes to its instances). Against an emulator
on this machine (moto: ``AWS_ENDPOINT_URL`` on a loopback address) there is no machine behind
an instance, so each is mirrored by a local raylet with the instance type's logical GPUs.
"""

from __future__ import annotations

import time

from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE

from rubberband.nodes import INSTANCE_PREFIX, SPOT
from rubberband.providers.aws import (
    GONE_STATES,
    TAG_CLUSTER,
    TAG_INSTANCE,
    TAG_MARKET,
    TAG_PRICE,
    TAG_RAY_CLUSTER,
    TAG_RUN,
    Ec2,
    LaunchError,
    launch_time,
    safe_error,
    termination_time,
    worker_user_data,
)
from rubberband.providers.base import ProviderEvent, Release
from rubberband.providers.node_provider import INSTANCE_TAG, RubberbandNodeProvider

EC2_ID_TAG = "ec2-instance-id"     # on a node's provider tags, once its instance is launched
STOPPED_STATES = ("stopping", "stopped")     # a spot reclaim with InstanceInterruptionBehavior stop


class AwsNodeProvider(RubberbandNodeProvider):
    """EC2 instances through boto3, mirrored by local raylets when EC2 is an emulator."""

    def __init__(self, provider_config, cluster_name):
        super().__init__(provider_config, cluster_name)
        self._region = provider_config["region"]
        self._run_id = provider_config["run_id"]
        self._node_config = provider_config["node_config"]
        self._node_configs = dict(provider_config.get("node_configs") or {})    # per Ray node type (market)
        self._mirror = provider_config.get("mirror", "local") == "local"
        self._price = float(provider_config["price_usd_per_hour"])
        self._setup = list(provider_config.get("setup_commands", []))
        self._setup_by_type = dict(provider_config.get("setup_commands_by_type") or {})   # per Ray node type
        self._head_address = provider_config.get("head_address") or provider_config.get("gcs_address")
        self._attempts = int(provider_config.get("launch_attempts", 6))
        self._backoff = float(provider_config.get("launch_backoff_s", 2.0))
        self._ec2 = Ec2(self._region)
        self._terminating: set[str] = set()           # EC2 ids we terminated ourselves
        self._retry_terminate: dict[str, tuple[str, str, str]] = {}   # EC2 id -> (node id, instance, reason)
        self._last_check = 0.0

    # --- launch --------------------------------------------------------------------------
    def _boot(self, node_id, instance, node_config, tags, resources, labels, provision):
        # Against an emulator, wait out the cloud's queueing the profile describes (scaled);
        # against EC2 the queue is real and the wait is EC2's own.
        time.sleep(provision if self._mirror else 0.0)
        if not self._known(node_id):     # released before anything was launched
            self._event(event=ProviderEvent.TERMINATED, node_id=node_id, instance=instance, reason=Release.CANCELLED)
            return
        node_type = self._node_type(tags)
        launch_config = self._node_configs.get(node_type, self._node_config)
        price = self._types.get(node_type, {}).get("price_usd_per_hour") or self._price
        ec2_tags = {TAG_RUN: self._run_id, TAG_CLUSTER: self.cluster_name, TAG_INSTANCE: instance,
                    TAG_PRICE: f"{price:.6g}", TAG_MARKET: self._market(tags), TAG_RAY_CLUSTER: self.cluster_name,
                    TAG_RAY_USER_NODE_TYPE: node_type, "Name": f"rb-{self._run_id}-{instance[len(INSTANCE_PREFIX):]}"}
        user_data = None
        if not self._mirror:
            gpus = int(resources.get("GPU", 0))
            extra = {k: v for k, v in resources.items() if k not in ("CPU", "GPU", "memory", "object_store_memory")}
            setup = self._setup_by_type.get(node_type, self._setup)
            user_data = worker_user_data(setup, self._head_address, node_id, node_type, gpus, extra)

        def report(err: LaunchError) -> None:
            self._event(event=ProviderEvent.LAUNCH_ERROR, node_id=node_id, instance=instance, code=err.code,
                        message=safe_error(RuntimeError(err.message)).split(": ", 1)[-1],
                        attempt=err.attempt, retry_in_s=err.retry_in_s, region=self._region,
                        instance_type=launch_config.get("InstanceType"))

        def cancelled() -> bool:
            return not self._known(node_id)

        try:
            ec2 = self._ec2.launch(launch_config, ec2_tags, client_token=f"{self._run_id}-{instance}",
                                   user_data=user_data, attempts=self._attempts, backoff_s=self._backoff,
                                   on_error=report, should_stop=cancelled)
        except Exception as exc:
            # Given up. Capacity may come back (the autoscaler asks again); a config mistake
            # (bad AMI, missing instance profile, no permission) will not: the executor stops.
            self._forget(node_id, quiet=True)
            self._event(event=ProviderEvent.LAUNCH_FAILED, node_id=node_id, instance=instance, error=safe_error(exc),
                        code=getattr(exc, "code", type(exc).__name__), fatal=not getattr(exc, "retryable", False))
            return
        ec2_id = ec2["InstanceId"]
        with self.lock:
            alive = self._tag(node_id, EC2_ID_TAG, ec2_id)
            # Logged under the lock: a release of this node is logged after it, never before.
            self._event(event=ProviderEvent.RUNNING, node_id=node_id, instance=instance, ec2_id=ec2_id, region=self._region,
                        instance_type=ec2.get("InstanceType"),
                        market=SPOT if ec2.get("InstanceLifecycle") == "spot" else "on-demand", t_ec2=launch_time(ec2))
        if not alive:    # released while launching: never leave it running
            self._terminate_ec2(node_id, instance, ec2_id, reason=Release.RELEASED)
            return
        if not self._mirror:
            return       # the instance joins the cluster by itself (user data)
        raylet = self._start_raylet(node_id, node_config, tags, resources, labels)
        if raylet is not False:
            self._event(event=ProviderEvent.READY, node_id=node_id, instance=instance, ec2_id=ec2_id,
                        raylet_pid=getattr(raylet, "pid", None))

    # --- terminate -----------------------------------------------------------------------
    def _terminate_ec2(self, node_id, instance, ec2_id, reason):
        self._terminating.add(ec2_id)
        try:
            self._ec2.terminate([ec2_id])
        except Exception as exc:
            # Still billing: say so, and try again on every update until EC2 takes it.
            self._event(event=ProviderEvent.TERMINATE_ERROR, node_id=node_id, instance=instance, ec2_id=ec2_id, error=safe_error(exc))
            self._retry_terminate[ec2_id] = (node_id, instance, reason)
            return
        self._retry_terminate.pop(ec2_id, None)
        t = None
        try:
            gone = self._ec2.instances(run_id=self._run_id, instance_ids=[ec2_id], states=GONE_STATES)
            t = termination_time(gone[0]) if gone else None
        except Exception:
            pass      # the time is then when we asked
        self._event(event=ProviderEvent.TERMINATED, node_id=node_id, instance=instance, ec2_id=ec2_id, reason=reason, t_ec2=t)

    def terminate_node(self, node_id):
        entry = self._forget(node_id)
        if entry is None:
            return
        ec2_id = entry["tags"].get(EC2_ID_TAG)
        if ec2_id is None:
            # Still launching: the boot thread sees the node gone, terminates whatever it
            # launched and logs it (or logs that nothing was launched).
            return
        self._terminate_ec2(node_id, entry["tags"].get(INSTANCE_TAG), ec2_id, reason=Release.RELEASED)

    # --- watch ---------------------------------------------------------------------------
    def _drop(self, node_id, reason, t_ec2=None):
        """Forget a node whose instance is gone (or broken), stopping its mirror raylet."""
        entry = self._forget(node_id, quiet=True)
        if entry is None:
            return
        instance, ec2_id = entry["tags"].get(INSTANCE_TAG), entry["tags"].get(EC2_ID_TAG)
        if reason == Release.LOST and ec2_id:
            # The machine's raylet died: the instance is no use to the cluster and still bills.
            self._terminate_ec2(node_id, instance, ec2_id, reason=Release.LOST)
            return
        self._event(event=ProviderEvent.TERMINATED, node_id=node_id, instance=instance, ec2_id=ec2_id, reason=reason, t_ec2=t_ec2)

    def _check_ec2(self):
        now = time.time()
        if now - self._last_check < 1.0:
            return
        self._last_check = now
        watched = self._tagged(EC2_ID_TAG)
        if not watched:
            return
        try:
            gone = self._ec2.instances(run_id=self._run_id, instance_ids=list(watched), states=GONE_STATES + STOPPED_STATES)
        except Exception as exc:
            self._event(event=ProviderEvent.DESCRIBE_ERROR, instance="-", error=safe_error(exc))
            return
        for inst in gone:
            ec2_id = inst["InstanceId"]
            if ec2_id in self._terminating:
                continue
            # Shut down behind our back: a spot reclaim (or someone's console click).
            if inst.get("State", {}).get("Name") in STOPPED_STATES:
                # A spot instance stopped by EC2 still holds its volumes: finish it off.
                entry = self._forget(watched[ec2_id], quiet=True)
                if entry is not None:
                    self._terminate_ec2(watched[ec2_id], entry["tags"].get(INSTANCE_TAG), ec2_id,
                                        reason=Release.INTERRUPTED)
                continue
            self._drop(watched[ec2_id], reason=Release.INTERRUPTED, t_ec2=termination_time(inst) or now)

    def _update(self):
        for ec2_id, (node_id, instance, reason) in list(self._retry_terminate.items()):
            self._terminate_ec2(node_id, instance, ec2_id, reason)
        super()._update()

    def _watch(self):
        self._check_ec2()

    def _lost(self, node_id):
        self._drop(node_id, reason=Release.LOST)
