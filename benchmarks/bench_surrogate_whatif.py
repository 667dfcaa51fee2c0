"""Benchmark: a Hydro-shaped what-if on the paper's ResNet job (issue #24, item 5).

The job is ``experiments/resnet101_cifar10.yaml``: SHA(32, 1, 50, 3) over ResNet-101 on
CIFAR-10 (one iteration = one epoch) on p3.8xlarge, with the full-width profile
``profiles/resnet101_cifar10_p3.yaml`` (itself shaped after the RubberBand paper, not
measured). It plans the job's cheapest plan (``compile_plan``, the optimal policy) at each
deadline in two ways and prints mean cost and JCT of each:

- **full width**: SHA on the full model; the winner is trained by the tuning itself;
- **surrogate S**: SHA on a μP surrogate S times narrower, then ONE target stage: the winner's
  config trained at full width from scratch for ``max_iters`` (50) epochs, on its own GPUs.

The surrogate's profile is an APPROXIMATION, not a measurement: scaled from the target's at
Hydro's FLOP ratio (``plan/whatif.py: approximate_surrogate``): iteration latency times
``f / S² + 1 − f`` with ``f = --compute-fraction`` (default 0.9), start-up and SYNC kept.

Planned (300 samples, seed 0, S = 8, f = 0.9; mean cost, mean JCT): deadline 20m: full
width $16.64 / 19m41s, surrogate $8.70 / 19m45s (1.91x cheaper); 30m: $14.13 vs $7.84
(1.80x); 1h and 3h: $12.71 / $12.30 vs $6.82 (1.86x, 1.80x). The tuning itself falls ~6x
($12.30 -> $2.02) but the one full-width training of the winner costs $4.80-$5.66, more than
half of the surrogate job: full-width tuning trains its winner to 50 epochs as it goes, the
surrogate job pays for it again. The saving is bounded by that training; Hydro's 8.7-78.5x
comes with fusion and much larger searches, neither of which is in this job.

Run: ``nice -n 19 .venv/bin/python benchmarks/bench_surrogate_whatif.py [--ratio 8]
[--compute-fraction 0.9] [--deadlines 20m,30m,60m] [--samples 300]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rubberband import load_experiment  # noqa: E402
from rubberband.plan.whatif import surrogate_sweep  # noqa: E402
from rubberband.render import render  # noqa: E402
from rubberband.units import format_duration, format_usd, parse_duration  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ratio", type=int, default=8, help="the surrogate's width ratio S (default 8, Hydro's)")
    p.add_argument("--compute-fraction", type=float, default=0.9,
                   help="the part of an iteration that shrinks 1/S² (default 0.9)")
    p.add_argument("--deadlines", default="20m,30m,60m,3h", help="deadlines to plan for")
    p.add_argument("--samples", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    exp = load_experiment(ROOT / "experiments" / "resnet101_cifar10.yaml")
    tuning = exp.spec
    target_iters = max(sum(b.iters) for b in tuning.brackets())
    rows = []
    for text in args.deadlines.split(","):
        deadline = parse_duration(text, "--deadlines")
        start = time.perf_counter()
        full, sur = surrogate_sweep(tuning, exp.model, exp.catalog, deadline, [1, args.ratio], target_iters,
                                    compute_fraction=args.compute_fraction, samples=args.samples, seed=args.seed,
                                    instance_type=exp.instance_type)
        took = time.perf_counter() - start

        def cells(r):
            if r.cost_usd is None:
                return ["infeasible", "-", "-"]
            return [format_usd(r.cost_usd), format_duration(r.jct_s), f"{r.p_meet:.0%}"]

        split = "-" if sur.cost_usd is None else (f"{format_usd(sur.tuning_usd)} + {format_usd(sur.target_usd)} "
                                                  f"(GPUs/trial {','.join(map(str, sur.gpus_per_trial))})")
        ratio = f"{full.cost_usd / sur.cost_usd:.2f}x" if full.cost_usd and sur.cost_usd else "-"
        rows.append([format_duration(deadline), *cells(full), *cells(sur), split, ratio, f"{took:.1f}s"])
    print(render(["deadline", "full: cost", "JCT", "P(meet)", f"S={args.ratio}: cost", "JCT", "P(meet)",
                  "tuning + target", "saving", "planned in"], rows,
                 title=f"{exp.name}: {tuning.describe()}; target {target_iters} epochs at full width; surrogate "
                       f"profile APPROXIMATED at f = {args.compute_fraction:g} (latency x (f/S² + 1 - f))"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
