"""Ray node provider of the `local` provider: instances are raylets started on this machine.

Loaded by Ray's autoscaler (``provider: {type: external, module: ...}``) inside the head
node's monitor process. Each launched node first waits out a provisioning latency (request →
running) drawn from the cloud profile and multiplied by ``latency_scale`` — the cloud's
queueing, emulated. Initialisation (running → ready) is real work on this machine: starting
the node's raylet, then the executor warming one worker per GPU; its measured distribution
is what ``cloud_profiles/local/local.yaml`` records. Every node carries a unique custom
resource ``rb-instance-<n>`` so the executor can pin a trial's workers to it, and every
request, running, ready and terminate is appended to ``<state_dir>/events.jsonl`` with a
wall-clock timestamp (and each request with its node type's instance type and market, which
the ledger prices it by): the provider's own record for the ledger and the profiler.

With ``spot_emulation`` in the provider config (``rubberband run --spot-emulation``), spot
instances are reclaimed as ``providers.spot_emulation`` describes: each gets an interruption
notice on a fake metadata endpoint (its URL is in the instance's ``ready`` event) and is killed
``notice_s`` later, logged ``terminated`` with reason ``interrupted``.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time

import numpy as np
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider
from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE

from rubberband.nodes import SPOT
from rubberband.profiles.distributions import parse_distribution
from rubberband.providers.base import ProviderEvent, Release
from rubberband.providers.spot_emulation import MetadataServer, Reclaimer, SpotEmulation, schedule

INSTANCE_RESOURCE_PREFIX = "rb-instance-"


class LocalNodeProvider(FakeMultiNodeProvider):
    """FakeMultiNodeProvider with cloud-like latencies, per-instance resources and an event log."""

    def __init__(self, provider_config, cluster_name, start_node=None):
        """Ray's autoscaler passes ``provider_config`` and ``cluster_name``. ``start_node(node_id,
        node_config, tags, resources, labels)`` starts a node's raylet and returns Ray's node
        object (``all_processes``, ``kill_all_processes``); a test passes a fake one."""
        super().__init__(provider_config, cluster_name)
        self._start_node = start_node or self._ray_node
        self._state_dir = provider_config["state_dir"]
        os.makedirs(self._state_dir, exist_ok=True)
        self._events_path = os.path.join(self._state_dir, "events.jsonl")
        self._scale = float(provider_config.get("latency_scale", 1.0))
        self._provision = parse_distribution(provider_config.get("provision_latency_s", 0), "provision_latency_s")
        self._rng = np.random.default_rng(int(provider_config.get("seed", 0)))
        self._counter = 0
        self._event_lock = threading.Lock()
        self._release_seen: set[str] = set()     # released instances seen by the last update
        self._types = dict(provider_config.get("node_types") or {})     # Ray node type -> market, price
        emulation = provider_config.get("spot_emulation")
        self._reclaimer = Reclaimer(SpotEmulation.from_dict(emulation), time.time()) if emulation else None
        self._metadata = MetadataServer().start() if emulation else None

    def _market(self, tags) -> str:
        return self._types.get(tags[TAG_RAY_USER_NODE_TYPE], {}).get("market", "on-demand")

    def _event(self, **fields) -> None:
        # Stamped under the lock: launch threads log concurrently, and the log stays in time order.
        with self._event_lock, open(self._events_path, "a") as fh:
            fields["t"] = time.time()
            fh.write(json.dumps(fields) + "\n")
            fh.flush()

    def _create_node_with_resources_and_labels(self, node_config, tags, count, resources, labels):
        with self.lock:
            node_id = self._next_hex_node_id()
            self._counter += 1
            instance = f"{INSTANCE_RESOURCE_PREFIX}{self._counter}"
            resources = copy.deepcopy(resources)
            resources[instance] = 1000
            self._nodes[node_id] = {"tags": {**tags, "rb-instance": instance, TAG_RAY_USER_NODE_TYPE: tags[TAG_RAY_USER_NODE_TYPE],
                                             "ray-node-kind": "worker", "ray-node-name": node_id,
                                             "ray-node-status": "up-to-date"},
                                    "node": None}
            provision = max(0.0, float(self._provision.sample(self._rng, 1)[0]) * self._scale)
        market = self._market(tags)
        self._event(event=ProviderEvent.REQUEST, node_id=node_id, instance=instance, node_type=tags[TAG_RAY_USER_NODE_TYPE],
                    market=market, instance_type=self._types.get(tags[TAG_RAY_USER_NODE_TYPE], {}).get("instance_type"))
        if market == SPOT and self._reclaimer is not None:
            # While the zone has no spot capacity the request waits (DESIGN §4.1).
            provision += max(0.0, self._reclaimer.capacity_at(time.time()) - time.time())
        threading.Thread(target=self._boot, args=(node_id, instance, node_config, tags, resources, labels, provision),
                         daemon=True).start()

    def _boot(self, node_id, instance, node_config, tags, resources, labels, provision):
        time.sleep(provision)
        with self.lock:
            if node_id not in self._nodes:
                return
        self._event(event=ProviderEvent.RUNNING, node_id=node_id, instance=instance)
        emulated = self._market(tags) == SPOT and self._reclaimer is not None
        if emulated:
            self._schedule_reclaim(node_id, instance, time.time())
        raylet = self._start_raylet(node_id, node_config, tags, resources, labels)
        if raylet is not False:
            extra = {"metadata_url": self._metadata.url_of(instance)} if emulated else {}
            self._event(event=ProviderEvent.READY, node_id=node_id, instance=instance, raylet_pid=getattr(raylet, "pid", None),
                        **extra)

    # --- spot emulation ------------------------------------------------------------------
    def _schedule_reclaim(self, node_id, instance, running_at):
        at = self._reclaimer.reclaim_at(running_at)
        if at != float("inf"):
            schedule(max(running_at, at - self._reclaimer.emu.notice_s), lambda: self._notice(node_id, instance, at))

    def _notice(self, node_id, instance, at):
        """The notice (none with ``notice_s: 0``), then the reclaim: for an instance still up
        and within the cap on reclaims."""
        with self.lock:
            if node_id not in self._nodes or not self._reclaimer.take():
                return
        if self._reclaimer.emu.notice_s > 0:
            self._metadata.notify(instance, at)
            self._event(event=ProviderEvent.NOTICE, node_id=node_id, instance=instance, reclaim_at=at)
        schedule(at, lambda: self._reclaim(node_id, instance))

    def _reclaim(self, node_id, instance):
        """The cloud takes the instance back: its Ray processes die with it (logged when it is
        taken, not when its processes have stopped, which takes a moment)."""
        self._forget(node_id, quiet=True, then=lambda entry: self._event(
            event=ProviderEvent.TERMINATED, node_id=node_id, instance=instance, reason=Release.INTERRUPTED))

    def _start_raylet(self, node_id, node_config, tags, resources, labels):
        """Start the node's raylet; returns its process (False if the node was released meanwhile)."""
        with self.lock:
            if node_id not in self._nodes:
                return False
            node = self._start_node(node_id, node_config, tags, resources, labels)
            self._nodes[node_id]["node"] = node
        return self._raylet(node)

    def _ray_node(self, node_id, node_config, tags, resources, labels):
        """Start a raylet exactly as the fake provider does, under the id we registered."""
        with self.lock:
            saved_next = self._next_node_id
            self._next_node_id = int(node_id[-5:]) - 1
            placeholder = self._nodes.pop(node_id)
            try:
                FakeMultiNodeProvider._create_node_with_resources_and_labels(self, node_config, tags, 1, resources, labels)
            finally:
                self._next_node_id = saved_next
            node = self._nodes.pop(node_id)["node"]
            self._nodes[node_id] = placeholder     # our tags (rb-instance) are a superset of the fake's
        return node

    @staticmethod
    def _raylet(node):
        if node is None:
            return None
        infos = node.all_processes.get("raylet") or []
        return infos[0].process if infos else None

    def _released(self) -> set[str]:
        path = os.path.join(self._state_dir, "release.json")
        try:
            with open(path) as fh:
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
            with self.lock:
                doomed = [nid for nid, entry in self._nodes.items() if entry["tags"].get("rb-instance") in due]
            for nid in doomed:
                self.terminate_node(nid)

    def _lost_raylets(self) -> list[str]:
        """Nodes whose raylet died behind our back (a crash, or a test pulling the plug)."""
        with self.lock:
            return [nid for nid, entry in self._nodes.items()
                    if entry.get("node") is not None and self._raylet(entry["node"]) is not None
                    and self._raylet(entry["node"]).poll() is not None]

    def _forget(self, node_id, quiet: bool = False, then=None):
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

    def non_terminated_nodes(self, tag_filters):
        self._terminate_released()
        # A lost node is gone: say so, so that the autoscaler launches a replacement.
        for nid in self._lost_raylets():
            entry = self._forget(nid, quiet=True)
            if entry is not None:
                self._event(event=ProviderEvent.TERMINATED, node_id=nid, instance=entry["tags"].get("rb-instance"),
                            reason=Release.LOST)
        return super().non_terminated_nodes(tag_filters)

    def terminate_node(self, node_id):
        entry = self._forget(node_id)
        if entry is not None:
            self._event(event=ProviderEvent.TERMINATED, node_id=node_id, instance=entry["tags"].get("rb-instance"),
                        reason=Release.RELEASED)
