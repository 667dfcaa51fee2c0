"""The `local` provider: a Ray cluster on this machine whose instances are autoscaled raylets.

The head node is started with ``ray start --head --autoscaling-config`` in a session of its
own, so Ray's real autoscaler (v2) launches and terminates worker nodes through
``LocalNodeProvider``. A state file under ``~/.rubberband/local/`` records every cluster we
started (session id, port, run directory), so ``rubberband down --provider local`` finds and
stops a cluster even when the driver that started it was killed.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rubberband.errors import ProviderError
from rubberband.providers.base import (
    EVENTS_FILE,
    RELEASE_FILE,
    Clouds,
    ProviderBase,
    ProviderEvent,
    Room,
    cluster_node_types,
    cluster_types,
)

FAKE_HEAD_NODE_ID = "fffffffffffffffffffffffffffffffffffffffffffffffffff00000"
STATE_ROOT = Path(os.environ.get("RUBBERBAND_STATE_DIR", Path.home() / ".rubberband")) / "local"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def autoscaling_config(cluster: str, cloud: Clouds, max_instances: Room, port: int, state_dir: str,
                       latency_scale: float, seed: int, idle_timeout_s: float,
                       spot_emulation: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Ray cluster config (Ray's own format) for the local provider: one Ray node type per
    instance type and market (``local_2gpu`` and ``local_2gpu_spot``), each node carrying its
    type's GPUs and slot, each type priced and capped by its own profile and room. The
    latencies are the first type's (the local types share them)."""
    types = cluster_types(cloud, max_instances)
    first = next(iter(types.values()))[0]
    nodes = [(t, *types[t.instance_type]) for t in cluster_node_types([c for c, _ in types.values()])]
    return {
        "cluster_name": cluster,
        # The scheduler releases one type before launching the next: the cluster holds at most
        # its largest type's room.
        "max_workers": max(room for _, room in types.values()),
        "idle_timeout_minutes": idle_timeout_s / 60.0,
        "upscaling_speed": 1000,
        "provider": {
            "type": "external",
            "module": "rubberband.providers.local_node_provider.LocalNodeProvider",
            "gcs_address": f"127.0.0.1:{port}",
            "state_dir": state_dir,
            "latency_scale": latency_scale,
            "seed": seed,
            "provision_latency_s": first.provision_latency_s.to_dict(),
            "init_latency_s": first.init_latency_s.to_dict(),
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "launch_multiple": True,
            "head_node_id": FAKE_HEAD_NODE_ID,
            "node_types": {t.ray_name: {"instance_type": t.instance_type, "market": t.market,
                                        "price_usd_per_hour": c.price(t.market)} for t, c, _ in nodes},
            "spot_emulation": spot_emulation,
        },
        "auth": {"ssh_user": "ubuntu"},
        "docker": {},
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 1}, "node_config": {}, "max_workers": 0},
            **{t.ray_name: {
                # The slot is never used by a task: asking the autoscaler for N bundles of it
                # means "N instances of this type", whatever their GPUs are busy with.
                "resources": {"CPU": 1, "GPU": c.gpus_per_instance, t.slot: 1,
                              "object_store_memory": 100 * 1024 * 1024},
                "node_config": {"InstanceType": t.instance_type},
                "min_workers": 0,
                "max_workers": room,
            } for t, c, room in nodes},
        },
        "head_node_type": "ray.head.default",
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


@dataclass
class LocalCluster:
    """A running local cluster: its head's session, port and run directory."""

    run_id: str
    run_dir: Path
    port: int
    sid: int
    temp_dir: str
    provider: str = "local"
    meta: dict[str, Any] = field(default_factory=dict)
    driver_pid: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def events_path(self) -> Path:
        return self.run_dir / "provider" / EVENTS_FILE

    @property
    def release_file(self) -> Path:
        return self.run_dir / "provider" / RELEASE_FILE

    @property
    def requires_ready(self) -> bool:
        # A node mirrored on this machine logs `ready`; a real EC2 worker joins by itself.
        return bool(self.meta.get("mirror", True))

    @classmethod
    def start(cls, run_id: str, run_dir: str | Path, cloud: Clouds, max_instances: Room,
              latency_scale: float = 1.0, seed: int = 0, idle_timeout_s: float = 1.0, timeout_s: float = 120.0,
              configure: Any = None, provider: str = "local", meta: dict[str, Any] | None = None,
              extra_env: dict[str, str | None] | None = None, spot_emulation: Any = None) -> LocalCluster:
        """Start a head node with Ray's autoscaler driving ``LocalNodeProvider``.

        ``configure(cfg) -> cfg`` lets another provider (``aws``) adapt the cluster config;
        ``provider`` and ``meta`` are recorded in the state file for ``rubberband down``;
        ``extra_env`` reaches the head's processes only (never a file); ``spot_emulation`` (a
        ``SpotEmulation``) has the node provider reclaim spot instances.
        """
        run_dir = Path(run_dir).resolve()
        (run_dir / "provider").mkdir(parents=True, exist_ok=True)
        reap_orphans()
        port = _free_port()
        temp_dir = f"/tmp/rb-{run_id[-8:]}"
        cfg_path = run_dir / "cluster.json"
        cfg = autoscaling_config(f"rb-{run_id}", cloud, max_instances, port, str(run_dir / "provider"),
                                 latency_scale, seed, idle_timeout_s,
                                 spot_emulation.to_dict() if spot_emulation is not None else None)
        if configure is not None:
            cfg = configure(cfg)
        cfg_path.write_text(json.dumps(cfg, indent=2))
        env = {
            **os.environ,
            **{k: v for k, v in (extra_env or {}).items() if v is not None},
            "RAY_FAKE_CLUSTER": "1",
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            "RAY_enable_autoscaler_v2": "1",
            "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
            "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "disabled",
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]),
        }
        ray_bin = str(Path(sys.executable).with_name("ray"))
        # Fail fast on a lost node (default detection takes ~15 s).
        system = json.dumps({"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                             "health_check_timeout_ms": 1000})
        cmd = [ray_bin, "start", "--head", f"--port={port}", "--num-cpus=1", "--num-gpus=0",
               f"--autoscaling-config={cfg_path}", f"--temp-dir={temp_dir}", "--disable-usage-stats",
               "--include-dashboard=false", f"--system-config={system}"]
        log = open(run_dir / "ray-start.log", "w")
        for key, value in (extra_env or {}).items():
            if value is None:
                env.pop(key, None)       # e.g. a stray AWS_SESSION_TOKEN next to the YAML's keys
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        cluster = cls(run_id, run_dir, port, proc.pid, temp_dir, provider, dict(meta or {}))
        cluster._save_state()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            cluster.stop()
            raise ProviderError(f"local provider: `ray start --head` did not finish in {timeout_s:.0f}s; see {run_dir / 'ray-start.log'}") from None
        except BaseException:       # Ctrl-C (or SIGTERM) while the head starts: it runs in its own session
            cluster.stop()
            raise
        if rc != 0:
            cluster.stop()
            raise ProviderError(f"local provider: `ray start --head` failed (exit {rc}); see {run_dir / 'ray-start.log'}")
        return cluster

    # --- state file: lets `down` find clusters a killed driver left behind -------------------
    def _save_state(self) -> None:
        STATE_ROOT.mkdir(parents=True, exist_ok=True)
        (STATE_ROOT / f"{self.run_id}.json").write_text(json.dumps(
            {"run_id": self.run_id, "run_dir": str(self.run_dir), "port": self.port, "sid": self.sid,
             "temp_dir": self.temp_dir, "started_at": time.time(), "driver_pid": os.getpid(),
             "provider": self.provider, "meta": self.meta}))

    @classmethod
    def known(cls, provider: str | None = None) -> list[LocalCluster]:
        """Every cluster recorded in the state directory (of one provider, or all)."""
        out = []
        for path in sorted(STATE_ROOT.glob("*.json")) if STATE_ROOT.exists() else []:
            try:
                d = json.loads(path.read_text())
                cluster = cls(d["run_id"], Path(d["run_dir"]), int(d["port"]), int(d["sid"]), d["temp_dir"],
                              str(d.get("provider", "local")), dict(d.get("meta") or {}), int(d.get("driver_pid", 0)))
            except (ValueError, KeyError, OSError, TypeError):
                path.unlink(missing_ok=True)
                continue
            if provider is None or cluster.provider == provider:
                out.append(cluster)
        return out

    def processes(self) -> list[int]:
        """PIDs of every process of this cluster (its session)."""
        return _session_pids(self.sid)

    def stop(self, grace_s: float = 5.0) -> int:
        """Stop every process of the cluster: SIGTERM, then SIGKILL after ``grace_s``.

        The session is enumerated again every round, so a process spawned while the cluster
        was shutting down (a worker, an agent) is stopped too. Returns how many processes the
        cluster had when asked to stop.
        """
        first = self.processes()
        deadline = time.time() + grace_s
        while True:
            pids = self.processes()
            if not pids or time.time() > deadline + 10.0:
                break
            sig = signal.SIGTERM if time.time() < deadline else signal.SIGKILL
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.2)
        (STATE_ROOT / f"{self.run_id}.json").unlink(missing_ok=True)
        return len(first)

    def read_events(self) -> list[dict[str, Any]]:
        """The provider's event log (``ProviderEvent``s), timed by the cloud where it said when
        (``t_ec2``: EC2's LaunchTime and shutdown time; the local time is kept as ``t_local``)."""
        if not self.events_path.exists():
            return []
        events = []
        for line in self.events_path.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("t_ec2") is not None and e.get("event") in (ProviderEvent.RUNNING, ProviderEvent.TERMINATED):
                e = {**e, "t_local": e["t"], "t": float(e["t_ec2"])}
            events.append(e)
        return events


def _session_pids(sid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            state, session = fields[0], int(fields[3])
        except (OSError, IndexError, ValueError):
            continue
        if session == sid and state != "Z" and int(entry) != os.getpid():
            pids.append(int(entry))
    return pids


def _alive(pids: list[int]) -> bool:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return True
        except OSError:
            continue
    return False


def reap_orphans() -> list[str]:
    """Stop local clusters whose driver is gone (killed with SIGKILL); return their run ids.

    The head of an ``aws`` run is left to ``rubberband down --provider aws``, which also
    terminates its EC2 instances (stopping the head alone would leave them running).
    """
    reaped = []
    for cluster in LocalCluster.known("local"):
        if cluster.driver_pid and not _alive([cluster.driver_pid]):
            cluster.stop()
            reaped.append(cluster.run_id)
    return reaped


def down_all(provider: str = "local", run_id: str | None = None) -> list[dict[str, Any]]:
    """Stop every cluster head of ``provider`` rubberband started (or one run's); return them."""
    stopped = []
    for cluster in LocalCluster.known(provider):
        if run_id is not None and cluster.run_id != run_id:
            continue
        count = len(cluster.processes())
        cluster.stop()
        stopped.append({"run_id": cluster.run_id, "processes": count, "run_dir": str(cluster.run_dir),
                        "meta": cluster.meta})
    return stopped


class LocalProvider(ProviderBase):
    """The `local` provider: Ray nodes on this machine with logical GPUs (``providers.base.Provider``)."""

    name = "local"
    emulates_spot = True

    def spot_emulation(self, given: Any, cloud: Any, spot_instances: tuple[int, ...], seed: int) -> Any:
        """``given``: a ``SpotEmulation``, or ``--spot-emulation``'s text (``providers.spot_emulation``)."""
        from rubberband.providers.spot_emulation import SpotEmulation, spot_emulation

        return given if isinstance(given, SpotEmulation) else spot_emulation(given, cloud, spot_instances, seed=seed)

    def describe(self, config: Any) -> str | None:
        return config.describe() if config is not None else None

    def check(self, cloud: Clouds, max_instances: Room, cluster: Any) -> None:
        return None

    def start(self, run_id: str, run_dir: Path, cloud: Clouds, max_instances: Room, config: Any, *,
              seed: int, latency_scale: float, launch_attempts: int, launch_backoff_s: float) -> LocalCluster:
        """``config``: ``None``, or the run's ``SpotEmulation`` (``rubberband run --spot-emulation``)."""
        return LocalCluster.start(run_id, run_dir, cloud, max_instances, latency_scale=latency_scale, seed=seed,
                                  spot_emulation=config)

    def sweep(self, cluster: LocalCluster, config: Any) -> None:
        """Nothing outlives the head's session: ``LocalCluster.stop`` stopped every node."""

    def down(self, run_id: str | None, regions: list[str], cluster_yamls: list[str]) -> dict[str, Any]:
        return {"heads": down_all(self.name, run_id)}

    def status(self, run_id: str | None, regions: list[str], cluster_yamls: list[str]) -> dict[str, Any]:
        return {"heads": [{"run_id": c.run_id, "processes": len(c.processes()), "run_dir": str(c.run_dir)}
                          for c in LocalCluster.known(self.name) if run_id is None or c.run_id == run_id]}
