"""Packed throughput: seconds per iteration of one trial when k trials share each GPU of an instance.

``rubberband profile`` measures it after the GPUs-per-trial counts, on its first instance:
for ``k = 1, 2, 4, ...`` it starts ``k`` workers on every GPU of the instance (Ray actors with
``num_gpus = 1/k``, pinned to the GPU's placement-group bundle), gives each a configuration
from the search space, trains one iteration to warm up and then ``iters`` iterations, all at
once, and takes each trial's mean time per iteration as one sample. Every GPU is packed at
once, as a packed stage packs them, so what the trials share besides the GPU (the instance's
vCPUs, memory bandwidth, data loading) is in the measurement. It stops after the first ``k``
whose throughput (``k`` over the seconds per iteration, per GPU) rises less than
``MIN_GAIN`` over the one before, when the next ``k`` would not fit the GPU's memory, when a
worker runs out of memory, or at ``max_k``.

How trials share a GPU (``mode``): with CUDA MPS (``mps``) when its daemon runs on the
instance — kernels of several processes then run concurrently instead of time-slicing; an
AMI enables it at boot with ``nvidia-cuda-mps-control -d`` (as root, after
``nvidia-smi -c EXCLUSIVE_PROCESS`` if the GPUs should accept MPS clients only) — else as
plain processes time-sliced by the driver (``processes``); on the local provider's logical
GPUs (``logical``) the "GPU" is the host's CPUs, so on a small machine packing gains nothing,
and the profile says so honestly.

``next_count`` (the stopping rule) and the values are pure; ``measure_packing`` imports
``ray`` when it runs.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rubberband.executor.worker import DDPWorker

MIN_GAIN = 0.05          # a rise in throughput below 5% is noise, not a reason to pack more
DEFAULT_MAX_K = 8
MPS_PIPE_DEFAULT = "/tmp/nvidia-mps"


@dataclass(frozen=True)
class PackedCount:
    """One ``k``: per-trial mean seconds per iteration with ``k`` trials on every GPU."""

    k: int
    iter_samples: tuple[float, ...]
    peak_gpu_memory_gb: float | None = None     # the largest of one trial's, on CUDA

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.iter_samples)

    @property
    def throughput(self) -> float:
        """Iterations per second per GPU."""
        return self.k / self.mean_s


@dataclass(frozen=True)
class PackingResult:
    """What the packed measurement found."""

    mode: str                                   # mps, processes or logical
    counts: tuple[PackedCount, ...]
    stopped: str                                # why no larger k was measured
    gpu_memory_gb: float | None = None          # one GPU's, as the worker saw it (CUDA)

    @property
    def gpu_memory_gb_per_trial(self) -> float | None:
        """A trial's peak GPU memory (the largest seen at any k), or ``None`` off CUDA."""
        peaks = [c.peak_gpu_memory_gb for c in self.counts if c.peak_gpu_memory_gb]
        return max(peaks) if peaks else None

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "stopped": self.stopped, "gpu_memory_gb": self.gpu_memory_gb,
                "counts": [{"k": c.k, "mean_s": c.mean_s, "throughput_iter_per_s": c.throughput,
                            "samples": list(c.iter_samples), "peak_gpu_memory_gb": c.peak_gpu_memory_gb}
                           for c in self.counts]}


def next_count(done: Sequence[PackedCount], max_k: int, gpu_memory_gb: float | None = None) -> tuple[int | None, str]:
    """The next ``k`` to measure (doubling), or ``None`` and why to stop.

    Stops when the last ``k`` raised throughput by less than ``MIN_GAIN`` over the one
    before, when the next ``k`` passes ``max_k``, or when ``k`` trials of the peak memory seen
    so far would not fit ``gpu_memory_gb``.
    """
    if not done:
        return 1, ""
    last = done[-1]
    if len(done) > 1 and last.throughput < done[-2].throughput * (1 + MIN_GAIN):
        gain = last.throughput / done[-2].throughput - 1
        return None, (f"throughput stopped rising: {last.k} per GPU gives {gain:+.0%} over {done[-2].k} "
                      f"({last.throughput:.3g} vs {done[-2].throughput:.3g} iterations/s per GPU)")
    k = 2 * last.k
    if k > max_k:
        return None, f"reached the largest count asked for ({max_k} per GPU)"
    peak = max((c.peak_gpu_memory_gb or 0.0) for c in done)
    if gpu_memory_gb and peak and k * peak > gpu_memory_gb:
        return None, f"memory: {k} trials of {peak:.3g} GB would not fit one GPU's {gpu_memory_gb:.3g} GB"
    return k, ""


class PackedWorker(DDPWorker):
    """A ``DDPWorker`` that also reports its device: whether CUDA and MPS are there, the GPU's
    memory and this process's peak GPU memory."""

    def device_info(self) -> dict[str, Any]:
        import torch

        cuda = torch.cuda.is_available()
        pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", MPS_PIPE_DEFAULT)
        total = torch.cuda.get_device_properties(0).total_memory / 1e9 if cuda else None
        return {"cuda": cuda, "mps": cuda and os.path.exists(os.path.join(pipe, "control")), "gpu_memory_gb": total}

    def peak_gpu_memory_gb(self) -> float | None:
        import torch

        if not torch.cuda.is_available():
            return None
        # What the caching allocator held at most: a trial's footprint as other processes see
        # it, less the process's CUDA context (a few hundred MB without MPS).
        return torch.cuda.max_memory_reserved() / 1e9 or None


def measure_packing(instance: str, gpus: int, trainer: Any, seed: int, configs: Callable[[int], list[dict[str, Any]]],
                    iters: int, max_k: int = DEFAULT_MAX_K, gpu_memory_gb: float | None = None,
                    logical: bool = False, timeout_s: float = 300.0,
                    on_count: Callable[[PackedCount], None] | None = None,
                    may_continue: Callable[[], bool] = lambda: True) -> PackingResult:
    """Measure packed throughput on ``instance`` (a Ray node with ``gpus`` GPUs and the
    resource ``instance``), which must have every GPU free.

    Args:
        configs: ``configs(n)`` -> ``n`` configurations to train (from the search space).
        iters: timed iterations per trial (after one warm-up iteration).
        max_k: the largest number of trials per GPU to try.
        gpu_memory_gb: one GPU's memory when CUDA does not say (the catalog's).
        logical: the GPUs are logical (the local provider): the mode is ``logical``.
        on_count: called with each measured ``k``.
        may_continue: asked before each ``k`` after the first (a time budget); ``False`` stops.

    Returns:
        A ``PackingResult`` with at least ``k = 1``.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    free_gpus = ray.available_resources().get("GPU", 0)
    done: list[PackedCount] = []
    mode, stopped = "logical" if logical else "processes", ""
    k: int | None = 1
    while k is not None:
        pg = placement_group([{"GPU": 1, instance: 0.001}] * gpus, strategy="STRICT_PACK")
        actors: list[Any] = []     # Ray's stubs type an actor class's handles loosely
        try:
            ray.get(pg.ready(), timeout=timeout_s)
            cls = ray.remote(num_cpus=0, num_gpus=1 / k, max_restarts=0)(PackedWorker)
            actors = [cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=b))
                      .remote(trainer, seed) for b in range(gpus) for _ in range(k)]
            ray.get([a.warmup.remote() for a in actors], timeout=timeout_s)
            if not done:
                info = ray.get(actors[0].device_info.remote(), timeout=timeout_s)
                if info["cuda"]:
                    mode = "mps" if info["mps"] else "processes"
                    gpu_memory_gb = info["gpu_memory_gb"] or gpu_memory_gb
            ray.get([a.assign.remote(c, None) for a, c in zip(actors, configs(len(actors)))], timeout=timeout_s)
            ray.get([a.train.remote(1) for a in actors], timeout=timeout_s)
            outs = ray.get([a.train.remote(iters) for a in actors], timeout=timeout_s)
            peaks = [p for p in ray.get([a.peak_gpu_memory_gb.remote() for a in actors], timeout=timeout_s) if p]
        except Exception as exc:
            if done and "out of memory" in str(exc).lower():
                stopped = f"memory: {k} trials per GPU ran out of GPU memory"
                break
            raise
        finally:
            for a in actors:
                ray.kill(a, no_restart=True)
            remove_placement_group(pg)
        count = PackedCount(k, tuple(statistics.fmean(o["iter_times"]) for o in outs), max(peaks) if peaks else None)
        done.append(count)
        if on_count is not None:
            on_count(count)
        k, stopped = next_count(done, max_k, gpu_memory_gb)
        if k is not None and not may_continue():
            k, stopped = None, "time budget (--max-seconds) reached"
    _settle(free_gpus)
    return PackingResult(mode, tuple(done), stopped, gpu_memory_gb)


def _settle(free_gpus: float, timeout_s: float = 10.0) -> None:
    """Wait until Ray has handed the killed workers' GPUs back (``free_gpus`` free, as before),
    so the warm workers started next find them."""
    import ray

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if ray.available_resources().get("GPU", 0) >= free_gpus - 1e-6:
            return
        time.sleep(0.1)
