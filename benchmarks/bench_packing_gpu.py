"""Packed throughput on a real CUDA GPU: k training processes on one GPU, time-sliced or under MPS.

Run on a machine with a GPU: ``python3 benchmarks/bench_packing_gpu.py [--mps]``. For
``k = 1, 2, 4, 8`` it starts ``k`` processes, each training a small CNN (ResNet-18 on
32x32 inputs, batch 64, like a CIFAR-10 trial of an early SHA stage) on GPU 0, and prints the
seconds per iteration of one trial, the throughput per GPU against one trial alone, and a
trial's peak GPU memory — what ``rubberband profile`` writes as ``packed_iter_latency_s`` and
``gpu_memory_gb_per_trial``. With ``--mps`` it first starts the MPS control daemon
(``nvidia-cuda-mps-control -d``, as an AMI's boot script would) and stops it at the end. It
also prints what the profiler's ``PackedWorker.device_info`` sees (CUDA, MPS, GPU memory).
Needs torch and torchvision with CUDA; no Ray.

Seen on one H100 80GB (2026-11-26, one run each, so noisy): throughput vs one trial alone at
k = 2, 4, 8 was 1.82x, 3.51x, 3.73x as time-sliced processes and 1.63x, 3.79x, 4.04x under
MPS; device_info saw ``mps`` turn True once the daemon ran; a trial's peak was 0.22 GB (the
allocator's peak: it leaves out each process's CUDA context).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WARMUP, ITERS, BATCH = 5, 30, 64


def trial(start, out, seed: int) -> None:
    import torch
    import torchvision

    torch.manual_seed(seed)
    model = torchvision.models.resnet18(num_classes=10).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(BATCH, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (BATCH,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    start.wait()                                   # all k trials train at once
    t0 = time.perf_counter()
    for _ in range(ITERS):
        step()
    torch.cuda.synchronize()
    out.put(((time.perf_counter() - t0) / ITERS, torch.cuda.max_memory_reserved() / 1e9))


def packed(k: int) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(k), ctx.Queue()
    procs = [ctx.Process(target=trial, args=(start, out, i)) for i in range(k)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    return sum(r[0] for r in results) / k, max(r[1] for r in results)


def device_info() -> dict:
    from rubberband.profiler.packing import PackedWorker

    return PackedWorker.device_info(None)     # reads only the environment and torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mps", action="store_true", help="start the MPS daemon first")
    parser.add_argument("--ks", default="1,2,4,8")
    args = parser.parse_args()
    daemon = shutil.which("nvidia-cuda-mps-control")
    if args.mps:
        if daemon is None:
            print("nvidia-cuda-mps-control not found: cannot start MPS")
            return
        os.environ.setdefault("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
        os.environ.setdefault("CUDA_MPS_LOG_DIRECTORY", "/tmp/nvidia-log")
        for d in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"):
            os.makedirs(os.environ[d], exist_ok=True)
        subprocess.run([daemon, "-d"], check=True)
        time.sleep(1)
    try:
        print(f"mode {'mps' if args.mps else 'processes'}; device_info: {device_info()}")
        alone = None
        print(f"{'k':>3} {'s/iter (one trial)':>19} {'throughput vs alone':>20} {'peak GB/trial':>14}")
        for k in map(int, args.ks.split(",")):
            s, peak = packed(k)
            alone = alone or 1 / s
            print(f"{k:>3} {s:>19.4f} {k / s / alone:>19.2f}x {peak:>14.2f}", flush=True)
    finally:
        if args.mps:
            subprocess.run([daemon], input="quit\n", text=True, check=False)


if __name__ == "__main__":
    main()
