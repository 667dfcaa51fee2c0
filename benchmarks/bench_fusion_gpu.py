"""Fused vs sequential throughput per F on a real CUDA GPU (bench_fusion.py's tables on CUDA).

Run on a machine with a GPU: ``python3 benchmarks/bench_fusion_gpu.py [--fs 1,2,...,64]``.
For the demo's ``DigitsMLP`` (64→128→10, batch 64) and the small-batch variant (64→32→32→10,
batch 16) it trains F trials one after another and as one ``FusedGroup`` (vmap and batched
forwards) on GPU 0, and prints the summed samples/s, the group's peak
``torch.cuda.max_memory_allocated`` per F, the line ``m1 + (F − 1)·Δ`` and the F_max that fits
the GPU's memory — what the profiler writes as ``fused_iter_latency_s`` and ``fused_memory_gb``.
k processes packed on one GPU: ``bench_packing_gpu.py``. Needs torch with CUDA; no Ray.
Without a CUDA device it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fs", default="1,2,4,8,16,32,64")
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("bench_fusion_gpu: no CUDA device here (torch.cuda.is_available() is False); "
              "run it on a GPU machine, or run bench_fusion.py for the CPU tables")
        return 2
    from bench_fusion import run

    total_gb = torch.cuda.get_device_properties(0).total_memory / 1e9
    run([int(f) for f in args.fs.split(",")], seconds=args.seconds, rounds=args.rounds, device_gb=total_gb,
        packed=False, device="cuda")
    return 0


if __name__ == "__main__":
    sys.exit(main())
