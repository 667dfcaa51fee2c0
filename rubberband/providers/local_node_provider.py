"""Ray node provider of the `local` provider: instances are raylets started on this machine.

Loaded by Ray's autoscaler (``provider: {type: external, module: ...}``) inside the head
node's monitor process. Each launched node first waits out a provisioning latency (request →
running) drawn from the cloud profile and multiplied by ``latency_scale`` — the cloud's
queueing, emulated. Initialisation (running → ready) is real work on this machine: starting
the node's raylet, then the executor warming one worker per GPU; its measured distribution
is what ``cloud_profiles/local/local.yaml`` records. Instance names, the event log and the
release file are the rubberband node provider's (``providers.node_provider``).

With ``spot_emulation`` in the provider config (``rubberband run --spot-emulation``), spot
instances are reclaimed as ``providers.spot_emulation`` describes: each gets an interruption
notice on a fake metadata endpoint (its URL is in the instance's ``ready`` event) and is killed
``notice_s`` later, logged ``terminated`` with reason ``interrupted``.
"""

from __future__ import annotations

import time
from typing import NamedTuple

from rubberband.nodes import SPOT
from rubberband.providers.base import ProviderEvent, Release
from rubberband.providers.node_provider import RubberbandNodeProvider
from rubberband.providers.spot_emulation import MetadataServer, Reclaimer, SpotEmulation, schedule


class _Emulator(NamedTuple):
    """Spot emulation's parts: when instances are reclaimed, and where their notices are served."""

    reclaimer: Reclaimer
    metadata: MetadataServer


class LocalNodeProvider(RubberbandNodeProvider):
    """Raylets on this machine with cloud-like latencies and, optionally, spot reclaims."""

    def __init__(self, provider_config, cluster_name, start_node=None):
        super().__init__(provider_config, cluster_name, start_node)
        emulation = provider_config.get("spot_emulation")
        self._spot = _Emulator(Reclaimer(SpotEmulation.from_dict(emulation), time.time()),
                               MetadataServer().start()) if emulation else None

    def _launch_delay(self, market, provision):
        if market == SPOT and self._spot is not None:
            # While the zone has no spot capacity the request waits (DESIGN §4.1).
            provision += max(0.0, self._spot.reclaimer.capacity_at(time.time()) - time.time())
        return provision

    def _boot(self, node_id, instance, node_config, tags, resources, labels, provision):
        time.sleep(provision)
        if not self._known(node_id):
            return
        self._event(event=ProviderEvent.RUNNING, node_id=node_id, instance=instance)
        spot = self._spot if self._market(tags) == SPOT else None      # reclaimed as emulated
        if spot is not None:
            self._schedule_reclaim(spot, node_id, instance, time.time())
        raylet = self._start_raylet(node_id, node_config, tags, resources, labels)
        if raylet is not False:
            extra = {"metadata_url": spot.metadata.url_of(instance)} if spot is not None else {}
            self._event(event=ProviderEvent.READY, node_id=node_id, instance=instance, raylet_pid=getattr(raylet, "pid", None),
                        **extra)

    # --- spot emulation ------------------------------------------------------------------
    def _schedule_reclaim(self, spot: _Emulator, node_id, instance, running_at):
        at = spot.reclaimer.reclaim_at(running_at)
        if at != float("inf"):
            schedule(max(running_at, at - spot.reclaimer.emu.notice_s), lambda: self._notice(spot, node_id, instance, at))

    def _notice(self, spot: _Emulator, node_id, instance, at):
        """The notice (none with ``notice_s: 0``), then the reclaim: for an instance still up
        and within the cap on reclaims."""
        with self.lock:
            if not self._known(node_id) or not spot.reclaimer.take():
                return
        if spot.reclaimer.emu.notice_s > 0:
            spot.metadata.notify(instance, at)
            self._event(event=ProviderEvent.NOTICE, node_id=node_id, instance=instance, reclaim_at=at)
        schedule(at, lambda: self._reclaim(node_id, instance))

    def _reclaim(self, node_id, instance):
        """The cloud takes the instance back: its Ray processes die with it (logged when it is
        taken, not when its processes have stopped, which takes a moment)."""
        self._forget(node_id, quiet=True, then=lambda entry: self._event(
            event=ProviderEvent.TERMINATED, node_id=node_id, instance=instance, reason=Release.INTERRUPTED))
