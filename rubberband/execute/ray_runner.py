"""Ray adapters of the executor's ports: gangs of DDP actors, and the local cluster's nodes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rubberband.errors import ProviderError
from rubberband.execute.ports import Node, TrainResult
from rubberband.execute.worker import DDPWorker

try:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("the executor needs Ray: pip install 'rubberband[ray,torch]'") from exc

INSTANCE_PREFIX = "rb-instance-"


@dataclass(eq=False)
class Gang:
    """One trial's workers: a placement group with one GPU bundle per worker."""

    trial: str
    actors: list[Any]
    pg: Any
    instances: tuple[str, ...]


@dataclass(eq=False)
class GangFuture:
    """A chunk of training in flight: rank 0's result and the other ranks' completions."""

    gang: Gang
    rank0: Any
    others: list[Any]


class RayTrialRunner:
    """Starts each trial as a gang of ``DDPWorker`` actors pinned to the placement's instances."""

    def __init__(self, trainer: Any, seed: int = 0, timeout_s: float = 180.0):
        self.trainer, self.seed, self.timeout_s = trainer, seed, timeout_s
        self._worker_cls = ray.remote(num_cpus=0, num_gpus=1, max_restarts=0, max_task_retries=0)(DDPWorker)

    def start(self, trial: str, config: dict[str, Any], instances: Sequence[str], checkpoint: bytes | None) -> Gang:
        bundles = [{"GPU": 1, inst: 0.001} for inst in instances]
        strategy = "STRICT_PACK" if len(set(instances)) == 1 else "PACK"
        pg = placement_group(bundles, strategy=strategy)
        try:
            ray.get(pg.ready(), timeout=self.timeout_s)
        except Exception as exc:
            remove_placement_group(pg)
            raise ProviderError(f"trial {trial}: its {len(bundles)} GPUs on {sorted(set(instances))} never became available: {exc}") from exc
        world = len(bundles)
        actors = [
            self._worker_cls.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank),
                name=None,
            ).remote(self.trainer, config, rank, world, self.seed)
            for rank in range(world)
        ]
        gang = Gang(trial, actors, pg, tuple(instances))
        try:
            port = ray.get(actors[0].free_port.remote(), timeout=self.timeout_s) if world > 1 else None
            ckpt = ray.put(checkpoint) if checkpoint is not None else None
            ray.get([a.setup.remote(port, ckpt) for a in actors], timeout=self.timeout_s)
        except Exception:
            self.stop(gang)
            raise
        return gang

    def reassign(self, gang: Gang, trial: str, config: dict[str, Any], checkpoint: bytes | None) -> Gang:
        """Hand a gang's running workers to another trial (no process or group restart)."""
        ckpt = ray.put(checkpoint) if checkpoint is not None else None
        ray.get([a.reset.remote(config, ckpt) for a in gang.actors], timeout=self.timeout_s)
        gang.trial = trial
        return gang

    def train(self, gang: Gang, iters: int) -> GangFuture:
        refs = [a.train.remote(iters) for a in gang.actors]
        ckpt = gang.actors[0].checkpoint.remote()
        return GangFuture(gang, refs[0], refs[1:] + [ckpt])

    def wait(self, pending: Sequence[GangFuture], timeout_s: float) -> tuple[list[GangFuture], list[GangFuture]]:
        by_ref = {f.rank0: f for f in pending}
        ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=timeout_s)
        done = [by_ref[r] for r in ready]
        return done, [f for f in pending if f not in done]

    def result(self, future: GangFuture) -> TrainResult:
        out = ray.get(future.rank0, timeout=self.timeout_s)
        rest = ray.get(future.others, timeout=self.timeout_s)
        return TrainResult(step=int(out["step"]), iter_times=list(out["iter_times"]),
                           metrics=dict(out.get("metrics", {})), checkpoint=rest[-1])

    def digests(self, gang: Gang) -> list[list[float]]:
        """Parameter digests of every rank (identical in a healthy gang)."""
        return ray.get([a.param_digest.remote() for a in gang.actors], timeout=self.timeout_s)

    def stop(self, gang: Gang) -> None:
        try:
            ray.get([a.shutdown.remote() for a in gang.actors], timeout=10)
        except Exception:  # a dead gang cannot shut down cleanly; killing it is enough
            pass
        for actor in gang.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
        try:
            remove_placement_group(gang.pg)
        except Exception:
            pass


class RayClusterPort:
    """The cluster port over a Ray cluster autoscaled by ``request_resources``.

    Each instance is a Ray node with ``gpus_per_instance`` GPUs and a unique resource
    ``rb-instance-<n>``; nodes are ordered oldest first by ``<n>``.
    """

    def __init__(self, gpus_per_instance: int, events: Any = None, poll_s: float = 0.2):
        self.G = gpus_per_instance
        self._events = events or (lambda: [])
        self.poll_s = poll_s

    def _alive(self) -> list[Node]:
        out = []
        for n in ray.nodes():
            if not n.get("Alive"):
                continue
            names = [k for k in n.get("Resources", {}) if k.startswith(INSTANCE_PREFIX)]
            if names and n["Resources"].get("GPU", 0) > 0:
                out.append(Node(names[0], int(n["Resources"]["GPU"])))
        return sorted(out, key=lambda node: int(node.name[len(INSTANCE_PREFIX):]))

    def nodes(self) -> list[Node]:
        return self._alive()

    def scale_to(self, count: int, stage: int) -> None:
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[{"GPU": self.G}] * count)

    def wait_nodes(self, count: int, timeout_s: float) -> list[Node]:
        deadline = time.time() + timeout_s
        while True:
            alive = self._alive()
            if len(alive) == count:
                return alive
            if time.time() > deadline:
                raise ProviderError(f"cluster: {len(alive)} instances alive, waited {timeout_s:.0f}s for {count}")
            time.sleep(self.poll_s)

    def release_to(self, keep: Sequence[str], stage: int) -> None:
        self.scale_to(len(keep), stage)

    def shutdown(self) -> None:
        try:
            self.scale_to(0, -1)
        except Exception:
            pass

    def events(self) -> list[dict[str, Any]]:
        return self._events()
