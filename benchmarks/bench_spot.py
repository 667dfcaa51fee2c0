"""Benchmark: is the spot model right? Plans made on half a trace, checked on the other half.

For every zone of the shipped AWS V100 traces (``cloud_profiles/aws/spot_traces``), the
paper's ResNet-101 job (SHA(32, 1, 50, 3), ``experiments/resnet101_cifar10.yaml``) is planned
on p3.2xlarge (the traces' type) with ``market="auto"`` and ``confidence=0.9``, its spot
instances replaying the *first* half of the zone's trace (22.5 days). The chosen plan is then
simulated on the *second* half, which it has never seen, from many random offsets: the
observed share of runs that miss the deadline is printed beside the promise (1 - 0.9), with
a 95% Wilson interval, and the plan's cost beside the all-on-demand optimum's.

Second, the Figure 12 setting (SHA(512, 4, 4096, 2) of ResNet-50 on p3.8xlarge, 90 minutes,
confidence 0.95) with spot at 30% of the on-demand price and 0.3 reclaims per instance-hour,
and with the catalog's real spot price and a real trace zone: the auto plan's cost against the
on-demand optimum.

Run: ``.venv/bin/python benchmarks/bench_spot.py [--samples 200] [--check 2000] [--deadline 2h] [--confidence 0.9]
[--zones us-east-1a,...] [--skip-fig12]``
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace
from pathlib import Path

from rubberband import load_experiment
from rubberband.plan import compile_plan, simulate_plan
from rubberband.plan.compile import market_label
from rubberband.profiles.spot import SpotMarket, load_trace, trace_zones
from rubberband.units import format_duration, parse_duration

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json"


def wilson(misses: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial share."""
    if n == 0:
        return 0.0, 1.0
    p = misses / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def spot_cloud(cloud, trace, notice_s: float = 120.0):
    return cloud.replace(spot=SpotMarket(notice_s=notice_s, trace=trace, trace_file=str(TRACES)))


def zones_table(args) -> None:
    exp = load_experiment(ROOT / "experiments" / "resnet101_cifar10.yaml")
    cloud = exp.cloud_for("p3.2xlarge")
    deadline = parse_duration(args.deadline, "--deadline")
    p = args.confidence
    on_demand = compile_plan(exp.spec, exp.model, cloud, deadline, samples=args.samples, confidence=p)
    print(f"ResNet-101 SHA(32,1,50,3) on p3.2xlarge, deadline {format_duration(deadline)}, confidence {p:g}; "
          f"planned on the first half of each zone's trace, checked on the second ({args.check} runs)")
    print(f"all on-demand optimum: ${on_demand.predicted.mean_cost_usd:.2f} "
          f"(allocation {','.join(map(str, on_demand.allocation))})")
    print()
    header = (f"{'zone':<11} {'avail':>5}  {'plan':<26} {'promised miss':>13}  {'observed miss (95% CI)':<24} "
              f"{'cost':>7}  {'vs on-demand':>12}  {'plan time':>9}")
    print(header)
    print("-" * len(header))
    zones = args.zones.split(",") if args.zones else trace_zones(TRACES)
    for zone in zones:
        trace = load_trace(TRACES, zone)
        half = trace.duration_s / 2
        fit, held_out = trace.window(0.0, half), trace.window(half, trace.duration_s)
        t0 = time.perf_counter()
        plan = compile_plan(exp.spec, exp.model, spot_cloud(cloud, fit), deadline, samples=args.samples,
                            confidence=p, market="auto")
        planned = time.perf_counter() - t0
        check = simulate_plan(replace(plan, cloud=spot_cloud(cloud, held_out)), exp.model, samples=args.check, seed=12345)
        misses = int((check.jct_s > deadline).sum())
        lo, hi = wilson(misses, args.check)
        print(f"{zone:<11} {trace.available_fraction:>5.0%}  {market_label(plan):<26} "
              f"{1 - plan.predicted.p_meet(deadline):>13.1%}  {misses / args.check:>6.1%} ({lo:.1%}-{hi:.1%}){'':<8} "
              f"${check.mean_cost_usd:>6.2f}  {on_demand.predicted.mean_cost_usd / check.mean_cost_usd:>11.2f}x  "
              f"{planned:>8.1f}s")


def fig12(args) -> None:
    exp = load_experiment(ROOT / "experiments" / "resnet50_sha512.yaml")
    cloud = exp.cloud_for(exp.instance_type)
    deadline = 90 * 60
    print()
    print(f"Figure 12 setting: SHA(512,4,4096,2) ResNet-50 on {cloud.instance_type}, 90 minutes, confidence 0.95")
    on_demand = compile_plan(exp.spec, exp.model, cloud, deadline, samples=args.samples, confidence=0.95)
    print(f"  on-demand optimum                         ${on_demand.predicted.mean_cost_usd:8.2f}  "
          f"P(meet) {on_demand.predicted.p_meet(deadline):.3f}")
    cases = [
        ("spot at 30% of on-demand, 0.3 reclaims/h", cloud.replace(
            spot_price_usd_per_hour=0.3 * cloud.price_usd_per_hour, spot=SpotMarket(notice_s=120, rate_per_hour=0.3))),
        (f"catalog spot ${cloud.spot_price_usd_per_hour}/h, 0.3 reclaims/h", cloud.replace(
            spot=SpotMarket(notice_s=120, rate_per_hour=0.3))),
        (f"catalog spot ${cloud.spot_price_usd_per_hour}/h, trace us-west-2b", cloud.replace(
            spot=SpotMarket(notice_s=120, trace=load_trace(TRACES, "us-west-2b"), trace_file=str(TRACES)))),
    ]
    for label, c in cases:
        t0 = time.perf_counter()
        plan = compile_plan(exp.spec, exp.model, c, deadline, samples=args.samples, confidence=0.95, market="auto")
        planned = time.perf_counter() - t0
        again = simulate_plan(plan, exp.model, samples=1000, seed=99)
        print(f"  {label:<42}${plan.predicted.mean_cost_usd:8.2f}  P(meet) {plan.predicted.p_meet(deadline):.3f} "
              f"(out of sample {again.p_meet(deadline):.3f})  {market_label(plan):<24} "
              f"{on_demand.predicted.mean_cost_usd / plan.predicted.mean_cost_usd:.2f}x cheaper  planned in {planned:.1f}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="Monte-Carlo samples the planner uses")
    parser.add_argument("--check", type=int, default=2000, help="out-of-sample runs per zone")
    parser.add_argument("--deadline", default="2h", help="the ResNet-101 job's deadline")
    parser.add_argument("--confidence", type=float, default=0.9, help="the ResNet-101 plans' promise")
    parser.add_argument("--zones", help="comma-separated zones (default: every zone of the traces)")
    parser.add_argument("--skip-fig12", action="store_true", help="only the per-zone table")
    args = parser.parse_args()
    zones_table(args)
    if not args.skip_fig12:
        fig12(args)


if __name__ == "__main__":
    main()
