"""Fused vs sequential vs packed throughput per F on this machine's CPU (or a CUDA GPU).

``python3 benchmarks/bench_fusion.py [--fs 1,2,4,8,16] [--seconds 0.3] [--device-gb 16]``

For two models — the demo's ``DigitsMLP`` (64→128→10, batch 64) and a small-batch variant
(64→32→32→10, batch 16) — and each F it trains F trials with different lr / momentum / weight
decay three ways and prints the summed samples per second:

- sequential: one trial after another, each its own model, optimizer and data loader, the
  inner loop of ``DDPWorker.train``;
- fused: one ``rubberband.fusion.FusedGroup`` of F members fed from one data loader, with
  its ``vmap`` forward and with its batched-layer forward (``fusion.batched``);
- packed: F processes at once (one torch thread each), each training one trial; only the
  training loops are timed (from a common barrier to the last process's end), not start-up.

Each cell is the best of ``--rounds`` interleaved rounds. Then, per F, the fused group's peak
memory (peak RSS of a forked process on CPU, ``torch.cuda.max_memory_allocated`` on CUDA),
the least-squares line ``memory = m1 + (F − 1)·Δ`` and the largest F that fits
``--device-gb`` (``F_max = 1 + floor((M − m1) / Δ)``, Hydro's rule solved for F). About a
minute on two loaded cores.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rubberband.examples.digits import DigitsMLP  # noqa: E402


class SmallBatchMLP(DigitsMLP):
    """The small-batch variant: 64→32→32→10 at batch 16."""

    global_batch_size = 16

    def build_model(self, config: dict[str, Any]):
        import torch.nn as nn

        return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))


MODELS = {"demo 64→128→10, batch 64": DigitsMLP, "small 64→32→32→10, batch 16": SmallBatchMLP}


def configs(F: int) -> list[dict[str, Any]]:
    return [{"lr": 0.01 * (1 + i % 5), "momentum": 0.5 + 0.05 * (i % 8), "weight_decay": 1e-4 * (i % 3)}
            for i in range(F)]


def batches(trainer: Any, train_set: Any, seed: int = 0):
    """The batches a lone trial's DDPWorker sees (world 1), forever."""
    import torch
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    sampler = DistributedSampler(train_set, num_replicas=1, rank=0, shuffle=True, seed=seed, drop_last=True)
    generator = torch.Generator().manual_seed(seed)
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from DataLoader(train_set, batch_size=trainer.global_batch_size, sampler=sampler, drop_last=True,
                              generator=generator)
        epoch += 1


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def solo_steps(trainer: Any, train_set: Any, config: dict[str, Any], steps: int, device: str = "cpu") -> float:
    """Seconds for ``steps`` steps of one trial alone (after two warm-up steps)."""
    import torch

    torch.manual_seed(0)
    model = trainer.build_model(config).to(device)
    opt = trainer.build_optimizer(model, config)
    it = batches(trainer, train_set)

    def step():
        x, y = next(it)
        x, y = x.to(device), y.to(device)
        opt.zero_grad(set_to_none=True)
        trainer.loss(model(x), y).backward()
        opt.step()

    for _ in range(2):
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    return time.perf_counter() - t0


def fused_steps(trainer: Any, train_set: Any, cfgs: list[dict[str, Any]], steps: int, device: str = "cpu",
                forward: str = "auto") -> float:
    """Seconds for ``steps`` steps of a fused group of ``len(cfgs)`` members (after two warm-up steps)."""
    from rubberband.fusion import FusedGroup

    group = FusedGroup(trainer, cfgs, seed=0, device=device, forward=forward)
    it = batches(trainer, train_set)
    for _ in range(2):
        group.train_step(*next(it))
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        group.train_step(*next(it))
    _sync(device)
    return time.perf_counter() - t0


def _packed_member(cls: type, config: dict[str, Any], steps: int, start: Any, out: Any) -> None:
    import torch

    torch.set_num_threads(1)
    trainer = cls()
    train_set, _ = trainer.build_data({})
    solo_steps(trainer, train_set, config, 1)      # warm
    start.wait()
    t0 = time.time()
    solo_steps(trainer, train_set, config, steps)
    out.put((t0, time.time()))


def packed_wall(cls: type, cfgs: list[dict[str, Any]], steps: int) -> float:
    """Wall seconds from a common start until the last of F processes has trained ``steps`` steps."""
    ctx = mp.get_context("fork")
    start, out = ctx.Barrier(len(cfgs)), ctx.Queue()
    procs = [ctx.Process(target=_packed_member, args=(cls, c, steps, start, out)) for c in cfgs]
    for p in procs:
        p.start()
    spans = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    return max(e for _, e in spans) - min(s for s, _ in spans)


def _rss_now_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _memory_child(cls: type, F: int, out: Any) -> None:
    trainer = cls()
    train_set, _ = trainer.build_data({})
    base = _rss_now_kb()
    fused_steps(trainer, train_set, configs(F), 5)
    out.put((base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))


def fused_memory_gb(cls: type, F: int, device: str) -> float:
    """Peak memory of a fused group of F members training: on CUDA the allocator's peak; on CPU
    the peak RSS of a forked process (baseline process included: what one worker would hold)."""
    if device == "cuda":
        import torch

        trainer = cls()
        train_set, _ = trainer.build_data({})
        torch.cuda.reset_peak_memory_stats()
        fused_steps(trainer, train_set, configs(F), 5, device)
        return torch.cuda.max_memory_allocated() / 1e9
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    p = ctx.Process(target=_memory_child, args=(cls, F, out))
    p.start()
    base_kb, peak_kb = out.get(timeout=300)
    p.join()
    return max(peak_kb, base_kb) / 1e6


def fit_memory(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares ``m(F) = m1 + (F − 1)·Δ``; returns (m1, Δ)."""
    xs = [F - 1 for F in points]
    ys = list(points.values())
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    delta = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - delta * mx, delta


def f_max(m1: float, delta: float, device_gb: float) -> int:
    """Largest F with m1 + (F − 1)·Δ ≤ M."""
    if m1 > device_gb:
        return 0
    return 1 + int((device_gb - m1) // delta) if delta > 0 else 10**9


def calibrate(fn, seconds: float) -> int:
    """Steps that take about ``seconds`` (from a short trial run)."""
    t = fn(5)
    return max(5, int(5 * seconds / max(t, 1e-6)))


def run(fs: list[int], *, seconds: float = 0.3, rounds: int = 2, device_gb: float = 16.0, packed: bool = True,
        device: str = "cpu") -> None:
    """Print the throughput and memory tables for each model (see the module docstring)."""
    import torch

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    where = torch.cuda.get_device_name() if device == "cuda" else f"{os.cpu_count()} CPU cores, 1 torch thread a process"
    print(f"# fused trials on {device} ({where}), torch {torch.__version__}; summed samples/s over F trials, "
          f"best of {rounds}")
    for title, cls in MODELS.items():
        trainer = cls()
        train_set, _ = trainer.build_data({})
        B = trainer.global_batch_size
        solo_n = calibrate(lambda n, t=trainer, d=train_set: solo_steps(t, d, configs(1)[0], n, device), seconds)
        best: dict[tuple[str, int], float] = {}
        for _ in range(rounds):
            for F in fs:
                cfgs = configs(F)
                n = max(5, solo_n // F)
                t = sum(solo_steps(trainer, train_set, c, n, device) for c in cfgs)
                best[("seq", F)] = max(best.get(("seq", F), 0), F * n * B / t)
                for forward in ("vmap", "batched"):
                    t = fused_steps(trainer, train_set, cfgs, n, device, forward)
                    best[(forward, F)] = max(best.get((forward, F), 0), F * n * B / t)
                if packed and device == "cpu":
                    t = packed_wall(cls, cfgs, n)
                    best[("packed", F)] = max(best.get(("packed", F), 0), F * n * B / t)
        print(f"\n## {title}\n")
        print("| F | sequential | fused, vmap | fused, batched layers | packed, F processes |")
        print("|---|---|---|---|---|")
        for F in fs:
            seq = best[("seq", F)]
            cells = [f"{best[(k, F)] / 1e3:.1f}k ({best[(k, F)] / seq:.2f}x)" if (k, F) in best else "–"
                     for k in ("vmap", "batched", "packed")]
            print(f"| {F} | {seq / 1e3:.1f}k | " + " | ".join(cells) + " |")
        mem = {F: fused_memory_gb(cls, F, device) for F in fs}
        m1, delta = fit_memory(mem)
        print("\n| F | fused memory (GB) |\n|---|---|")
        for F in fs:
            print(f"| {F} | {mem[F]:.4f} |")
        print(f"\nfit: memory = {m1:.4f} GB + (F − 1) × {delta * 1e3:.3f} MB; "
              f"F_max for {device_gb:g} GB = {f_max(m1, delta, device_gb)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fs", default="1,2,4,8,16", help="group sizes F (default 1,2,4,8,16)")
    parser.add_argument("--seconds", type=float, default=0.3, help="timed seconds per cell and round")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds; each cell is the best")
    parser.add_argument("--device-gb", type=float, default=16.0, help="device memory for F_max")
    parser.add_argument("--no-packed", action="store_true", help="skip the k-process column")
    args = parser.parse_args()
    run([int(f) for f in args.fs.split(",")], seconds=args.seconds, rounds=args.rounds, device_gb=args.device_gb,
        packed=not args.no_packed)


if __name__ == "__main__":
    main()
