"""The rubberband node provider: what every provider's instances share under Ray's autoscaler.

Ray's autoscaler loads a node provider (``provider: {type: external, module: ...}``) inside the
head node's monitor process and asks it to launch and terminate nodes. ``RubberbandNodeProvider``
is the one base of rubberband's node providers (``LocalNodeProvider``, ``AwsNodeProvider``), and
this module is the only one that touches Ray's private ``FakeMultiNodeProvider``: its node
books (``_nodes`` under ``lock``) and its way of starting a raylet on this machine. What the base
keeps, for every provider alike:

- instance names: each launched node is ``rb-instance-<n>`` (``rubberband.nodes``), counted from
  1 per run, and carries that name as a Ray custom resource so the executor can pin workers to it;
- the event log ``<state_dir>/events.jsonl``: one JSON line per ``ProviderEvent`` with the
  wall-clock ``t`` it was written (a ``request`` also names the node type's instance type and
  market, which the ledger prices it by), in time order;
- the release file ``<state_dir>/release.json``: the instances the executor released, terminated
  on the autoscaler update after the one that first sees them (``_terminate_released``);
- a node whose raylet died behind our back is dropped and logged ``terminated`` (``lost``), so
  the autoscaler launches a replacement.

A provider specialises ``_boot`` (from request to running and ready, on a thread of its own),
and where it needs to ``_launch_delay``, ``_watch`` (each update), ``_lost`` and
``terminate_node``.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from typing import Any

import numpy as np
import ray._private.ray_constants as ray_constants
from ray._common.network_utils import build_address
from ray._private.node import Node
from ray._private.parameter import RayParams
from ray._private.services import get_node_ip_address
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider
from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE

from rubberband.nodes import ON_DEMAND, instance_name
from rubberband.profiles.distributions import parse_distribution
from rubberband.providers.base import EVENTS_FILE, RELEASE_FILE, ProviderEvent, Release

INSTANCE_TAG = "rb-instance"      # a node's provider tag: its instance name


class _OwnNode(Node):
    """Ray's node, its socket and log files named after it: Ray numbers them by the first
    name not on disk yet, and a raylet creates its socket only once it is up, so two nodes
    starting at once would both take ``raylet.1`` and the second raylet could never bind."""

    def _make_inc_temp(self, suffix: str = "", prefix: str = "", directory_name: str | None = None):
        node = getattr(self, "_node_id", None)
        return super()._make_inc_temp(suffix, f"{prefix}.{node[-5:]}" if node else prefix, directory_name)


class RubberbandNodeProvider(FakeMultiNodeProvider):
    """Ray's fake multi-node provider with instance names, an event log and the release file."""

    _nodes: dict[str, dict[str, Any]]      # Ray's books: node id -> {"tags": ..., "node": ... or None}

    def __init__(self, provider_config, cluster_name, start_node=None):
        """Ray's autoscaler passes ``provider_config`` and ``cluster_name``. ``start_node(node_id,
        node_config, tags, resources, labels)`` starts a node's raylet and returns Ray's node
        object (``all_processes``, ``kill_all_processes``); a test passes a fake one."""
        super().__init__(provider_config, cluster_name)
        self._start_node = start_node or self._ray_node
        self._state_dir = provider_config["state_dir"]
        os.makedirs(self._state_dir, exist_ok=True)
        self._events_path = os.path.join(self._state_dir, EVENTS_FILE)
        self._release_path = os.path.join(self._state_dir, RELEASE_FILE)
        self._scale = float(provider_config.get("latency_scale", 1.0))
        self._provision = parse_distribution(provider_config.get("provision_latency_s", 0), "provision_latency_s")
        self._rng = np.random.default_rng(int(provider_config.get("seed", 0)))
        self._counter = 0
        self._event_lock = threading.Lock()
        self._release_seen: set[str] = set()     # released instances seen by the last update
        self._types = dict(provider_config.get("node_types") or {})     # Ray node type -> market, price

    # --- what a subclass specialises ---------------------------------------------------------
    def _boot(self, node_id, instance, node_config, tags, resources, labels, provision):
        """Take a requested node to running (after ``provision`` seconds of the cloud's queueing,
        where the provider emulates it) and ready; runs on a thread of its own."""
        raise NotImplementedError

    def _launch_delay(self, market: str, provision: float) -> float:
        """How long a request on ``market`` waits before it launches: the drawn ``provision``."""
        return provision

    def _watch(self) -> None:
        """Each autoscaler update, after the releases: notice what the cloud took back."""

    def _lost(self, node_id) -> None:
        """A node whose raylet died: drop it, logged ``terminated`` (``lost``)."""
        entry = self._forget(node_id, quiet=True)
        if entry is not None:
            self._event(event=ProviderEvent.TERMINATED, node_id=node_id, instance=entry["tags"].get(INSTANCE_TAG),
                        reason=Release.LOST)

    def terminate_node(self, node_id):
        entry = self._forget(node_id)
        if entry is not None:
            self._event(event=ProviderEvent.TERMINATED, node_id=node_id, instance=entry["tags"].get(INSTANCE_TAG),
                        reason=Release.RELEASED)

    # --- node types and the event log ----------------------------------------------------
    def _node_type(self, tags) -> str:
        return tags[TAG_RAY_USER_NODE_TYPE]

    def _market(self, tags) -> str:
        return self._types.get(self._node_type(tags), {}).get("market", ON_DEMAND)

    def _event(self, **fields) -> None:
        # Stamped under the lock: launch threads log concurrently, and the log stays in time order.
        with self._event_lock, open(self._events_path, "a") as fh:
            fields["t"] = time.time()
            fh.write(json.dumps(fields) + "\n")
            fh.flush()

    # --- the node books ------------------------------------------------------------------
    def _known(self, node_id) -> bool:
        """Whether the node is still on the books (not released, reclaimed or lost)."""
        with self.lock:
            return node_id in self._nodes

    def _tag(self, node_id, key: str, value: str) -> bool:
        """Add a provider tag to a node still on the books; return whether it is."""
        with self.lock:
            if node_id in self._nodes:
                self._nodes[node_id]["tags"][key] = value
                return True
            return False

    def _tagged(self, key: str) -> dict[str, str]:
        """The nodes carrying provider tag ``key``: its value -> node id."""
        with self.lock:
            return {entry["tags"][key]: nid for nid, entry in self._nodes.items() if key in entry["tags"]}

    def _create_node_with_resources_and_labels(self, node_config, tags, count, resources, labels):
        with self.lock:
            node_id = self._next_hex_node_id()
            self._counter += 1
            instance = instance_name(self._counter)
            resources = copy.deepcopy(resources)
            resources[instance] = 1000
            node_type = self._node_type(tags)
            self._nodes[node_id] = {"tags": {**tags, INSTANCE_TAG: instance, TAG_RAY_USER_NODE_TYPE: node_type,
                                             "ray-node-kind": "worker", "ray-node-name": node_id,
                                             "ray-node-status": "up-to-date"},
                                    "node": None}
            provision = max(0.0, float(self._provision.sample(self._rng, 1)[0]) * self._scale)
        market = self._market(tags)
        self._event(event=ProviderEvent.REQUEST, node_id=node_id, instance=instance, node_type=node_type,
                    market=market, instance_type=self._types.get(node_type, {}).get("instance_type"))
        provision = self._launch_delay(market, provision)
        threading.Thread(target=self._boot, args=(node_id, instance, node_config, tags, resources, labels, provision),
                         daemon=True).start()

    # --- raylets on this machine ---------------------------------------------------------
    def _start_raylet(self, node_id, node_config, tags, resources, labels):
        """Start the node's raylet; returns its process (False if the node was released meanwhile).

        Not under the provider's lock: nodes launched together start their raylets at once, as
        a cloud's instances boot side by side, and each is ready one raylet start after it
        runs, not one per node queued before it. A node released while its raylet started is
        stopped here."""
        with self.lock:
            if node_id not in self._nodes:
                return False
        node = self._start_node(node_id, node_config, tags, resources, labels)
        with self.lock:
            kept = node_id in self._nodes
            if kept:
                self._nodes[node_id]["node"] = node
        if not kept:
            if node is not None:
                self._terminate_node({"node": node})
            return False
        return self._raylet(node)

    def _ray_node(self, node_id, node_config, tags, resources, labels):
        """Start a raylet as Ray's fake provider does, under the id we registered; safe to
        call for several nodes at once (``_OwnNode``)."""
        resources = copy.deepcopy(resources)
        gcs = self._gcs_address or build_address(get_node_ip_address(), 6379)
        params = RayParams(
            min_worker_port=0, max_worker_port=0, dashboard_port=None, dashboard_agent_listen_port=0,
            num_cpus=resources.pop("CPU", 0), num_gpus=resources.pop("GPU", 0),
            object_store_memory=resources.pop("object_store_memory", None), resources=resources, labels=labels,
            redis_address=gcs, gcs_address=gcs,
            env_vars={"RAY_OVERRIDE_NODE_ID_FOR_TESTING": node_id, "RAY_CLOUD_INSTANCE_ID": node_id,
                      "RAY_NODE_TYPE_NAME": self._node_type(tags),
                      ray_constants.RESOURCES_ENVIRONMENT_VARIABLE: json.dumps(resources),
                      ray_constants.LABELS_ENVIRONMENT_VARIABLE: json.dumps(labels)})
        return _OwnNode(params, head=False, shutdown_at_exit=False, spawn_reaper=False)

    @staticmethod
    def _raylet(node):
        if node is None:
            return None
        infos = node.all_processes.get("raylet") or []
        return infos[0].process if infos else None

    def _lost_raylets(self) -> list[str]:
        """Nodes whose raylet died behind our back (a crash, or a test pulling the plug)."""
        with self.lock:
            return [nid for nid, entry in self._nodes.items()
                    if entry.get("node") is not None and self._raylet(entry["node"]) is not None
                    and self._raylet(entry["node"]).poll() is not None]

    def _forget(self, node_id, quiet: bool = False, then=None) -> dict[str, Any] | None:
        """Drop a node from the provider's books and stop its raylet; return its entry
        (``None`` if the node is unknown). ``quiet`` ignores a raylet that will not stop;
        ``then(entry)`` runs once the node is dropped, before its processes are stopped."""
        with self.lock:
            entry = self._nodes.pop(node_id, None)
        if entry is not None and then is not None:
            then(entry)
        if entry is not None and entry.get("node") is not None:
            try:
                self._terminate_node(entry)
            except Exception:
                if not quiet:
                    raise
        return entry

    # --- releases and each update ----------------------------------------------------------
    def _released(self) -> set[str]:
        try:
            with open(self._release_path) as fh:
                return set(json.load(fh))
        except (OSError, ValueError):
            return set()

    def _terminate_released(self) -> None:
        # Instances the executor released (it emptied them at a SYNC and listed them in
        # release.json) are terminated, most recently launched first as the executor chose
        # them; Ray's idle-timeout would keep a node that a resource request still fits on,
        # and would pick which node goes by itself.
        #
        # Not on the update that first sees a release but on the next one: each autoscaler
        # update reads Ray's resource demand *before* it asks the provider for its nodes, so
        # the update that first sees the release may hold a demand read before the executor
        # lowered it, and would launch a new instance for every one terminated now. The
        # executor lowers the demand before it writes the release file, so the next update
        # reads the lowered demand.
        released = self._released()
        due = released & self._release_seen
        self._release_seen = released
        if due:
            with self.lock:     # node ids count up with the launches: the newest first
                doomed = sorted((nid for nid, entry in self._nodes.items() if entry["tags"].get(INSTANCE_TAG) in due),
                                reverse=True)
            for nid in doomed:
                self.terminate_node(nid)

    def _update(self) -> None:
        """Each autoscaler update: carry out the releases, notice what the cloud took back, and
        drop the nodes whose raylet died (so the autoscaler launches replacements)."""
        self._terminate_released()
        self._watch()
        for nid in self._lost_raylets():
            self._lost(nid)

    def non_terminated_nodes(self, tag_filters):
        self._update()
        return super().non_terminated_nodes(tag_filters)
