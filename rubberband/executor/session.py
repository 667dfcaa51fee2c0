"""One cluster lifecycle for execution and profiling: start a provider's cluster, connect Ray,
hand out the executor's ports, and leave nothing running on success, failure, Ctrl-C or SIGTERM.

``cluster_session`` is the only place that starts a cluster for ``rb.execute`` and
``rb.profile``. SIGTERM is turned into ``KeyboardInterrupt`` before the head starts (and again
after ``ray.init``, which installs its own handler), so a ``kill`` cleans up like Ctrl-C. On
the way out: the warm workers stop; on success the instances are released through the
autoscaler (so the ledger sees their real release times); Ray disconnects; the head and every
node stop; and the provider's sweep releases anything still up. A sweep that fails is logged
with the ``rubberband down`` command that finishes the job, never raised over the run's own
outcome.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rubberband.providers import base
from rubberband.providers.base import (
    ENDED,
    Clouds,
    Cluster,
    Provider,
    ProviderEvent,
    Room,
    cluster_types,
)

log = logging.getLogger("rubberband.executor")
LIFECYCLE = (ProviderEvent.REQUEST, ProviderEvent.RUNNING, ProviderEvent.READY, *ENDED)


def raise_interrupt(signum, frame):
    """A signal handler: clean up like Ctrl-C."""
    raise KeyboardInterrupt


@dataclass
class Session:
    """A running cluster session: the provider's cluster and the executor's ports over it."""

    provider: Provider
    cluster: Cluster
    config: Any = None            # the provider's checked configuration
    port: Any = None              # ClusterPort (requests and releases instances)
    runner: Any = None            # TrialRunnerPort (gangs of warm workers)
    stopped_at: float | None = None   # when the head was told to stop: the instances' last moment

    def read_events(self) -> list[dict[str, Any]]:
        """The provider's event log, timed by the provider (ledger times)."""
        return self.cluster.read_events()


@contextmanager
def cluster_session(provider: str | Provider, cloud: Clouds, max_instances: Room, run_dir: str | Path, *,
                    run_id: str, trainer: Any, seed: int = 0, config: Any = None, latency_scale: float = 1.0,
                    time_attr: str | None = None,
                    launch_attempts: int = 6, launch_backoff_s: float = 2.0,
                    release_timeout_s: float = 30.0) -> Iterator[Session]:
    """Start ``provider``'s cluster for up to ``max_instances`` instances of ``cloud`` and yield
    a ``Session``; stop everything when the block ends, however it ends.

    Args:
        provider: a registered provider's name, or the provider.
        cloud, max_instances: one instance type's profile, or every type of the plan (its own
            first), and the room in all or per type (``providers.base.cluster_types``).
        config: what ``provider.check`` returned (the checked cluster YAML for aws).
        trainer, seed, time_attr: for the trial runner's warm workers (``time_attr``: the metric
            that counts a function trainable's iterations, ``function_api``).
        release_timeout_s: after a block that ended normally, how long to wait for the
            provider to terminate the released instances before stopping the head.
    """
    prov = base.get(provider) if isinstance(provider, str) else provider
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, raise_interrupt) if main else None
    session = ray = None
    try:
        cluster = prov.start(run_id, Path(run_dir), cloud, max_instances, config, seed=seed,
                             latency_scale=latency_scale, launch_attempts=launch_attempts,
                             launch_backoff_s=launch_backoff_s)
        session = Session(prov, cluster, config)
        ray = _import_ray()
        ray.init(address=cluster.address, logging_level=logging.ERROR, log_to_driver=False)
        if main:
            signal.signal(signal.SIGTERM, raise_interrupt)     # again: ray.init installs its own
        from rubberband.executor.ray_runner import RayClusterPort, RayTrialRunner
        from rubberband.executor.spot_notice import EC2_METADATA_URL
        # Real EC2 workers read their own instance metadata; emulated nodes name their endpoint.
        metadata_url = None if cluster.requires_ready else os.environ.get("RUBBERBAND_SPOT_METADATA_URL", EC2_METADATA_URL)
        clouds = [c for c, _ in cluster_types(cloud, max_instances).values()]
        session.port = RayClusterPort(clouds[0].gpus_per_instance, prov.node_types(clouds), events=cluster.read_events,
                                      release_file=str(cluster.release_file), require_ready=cluster.requires_ready,
                                      metadata_url=metadata_url)
        session.runner = RayTrialRunner(trainer, seed=seed, time_attr=time_attr)
        yield session
        session.runner.shutdown()
        session.port.shutdown()
        wait_released(cluster, release_timeout_s)
    finally:
        try:
            if session is not None:
                _close(session, ray)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


def _import_ray():
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    return ray


def _close(session: Session, ray: Any) -> None:
    """Disconnect, stop the head and every node, then sweep; each step runs whatever the one
    before it did."""
    try:
        if session.runner is not None:
            try:
                session.runner.shutdown()
            except Exception:   # a broken cluster is stopped below anyway
                pass
        if ray is not None and ray.is_initialized():
            ray.shutdown()
    finally:
        session.stopped_at = time.time()
        try:
            session.cluster.stop()
        finally:
            sweep(session)


def wait_released(cluster: Cluster, timeout_s: float) -> None:
    """Wait until every instance the provider launched has ended (or ``timeout_s``)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        state: dict[str, str] = {}
        for e in cluster.read_events():
            if e.get("event") in LIFECYCLE and state.get(e["instance"]) not in ENDED:
                state[e["instance"]] = e["event"]
        if all(v in ENDED for v in state.values()):
            return
        time.sleep(0.2)


def sweep(session: Session) -> None:
    """The provider's sweep, guarded: a failure is one log line saying how to finish by hand."""
    cluster = session.cluster
    try:
        session.provider.sweep(cluster, session.config)
    except Exception as exc:
        log.error("%s; to make sure nothing of run %s is left running, run `rubberband down --provider %s "
                  "--run-id %s`", exc, cluster.run_id, session.provider.name, cluster.run_id)
