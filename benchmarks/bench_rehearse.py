"""Benchmark: rehearsals (``run --provider sim``) against the simulator, re-planning, and wall time.

1. Conformance: the ResNet-101 job (``experiments/resnet101_cifar10.yaml``, its optimal plan)
   rehearsed over N seeds with re-planning off, mean JCT and cost against ``rb.simulate``'s
   prediction; then the same allocation on spot (2 reclaims per instance-hour, with no notice
   and with a 120 s notice) and replaying the shipped traces of two zones (p50/p90 too: the
   trace's JCT is heavy-tailed — a job that meets a capacity gap waits hours — so its mean
   and p90 converge slowly: on us-west-2b, 400 seeds can be 15% off, 1500 agree to 0.1%).
2. Re-planning: a truth 25% slower than the profile, a 25-minute deadline, confidence 0.9:
   the share of 30 rehearsals that meet the deadline re-planning and with the plan fixed.
3. Wall time of one rehearsal of SHA(512, 4, 4096, 2) (``experiments/resnet50_sha512.yaml``),
   best of 3, with and without re-planning.

Run: ``.venv/bin/python benchmarks/bench_rehearse.py [--seeds 40] [--spot-seeds 400]``
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from rubberband import load_experiment
from rubberband.cli.rehearse import rehearse
from rubberband.plan import compile_plan, plan_allocation
from rubberband.profiles import Normal
from rubberband.profiles.cloud import Market

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json"


def _compare(label: str, plan, model, seeds: int, quantiles: bool = False) -> None:
    runs = [rehearse(plan, model, seed=s) for s in range(seeds)]
    jct = np.array([r.actual["jct_s"] for r in runs])
    cost = np.array([r.actual["cost_usd"] for r in runs])
    pred = plan.predicted
    line = (f"{label:<34} JCT {jct.mean():8.0f} s vs {pred.mean_jct_s:8.0f} s ({jct.mean() / pred.mean_jct_s - 1:+.1%})  "
            f"cost ${cost.mean():7.3f} vs ${pred.mean_cost_usd:7.3f} ({cost.mean() / pred.mean_cost_usd - 1:+.1%})")
    if quantiles:
        line += (f"  p50 {np.percentile(jct, 50):.0f} vs {pred.p50_jct_s:.0f}"
                 f"  p90 {np.percentile(jct, 90):.0f} vs {pred.p90_jct_s:.0f}")
    print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--spot-seeds", type=int, default=400)
    args = parser.parse_args()

    exp = load_experiment(ROOT / "experiments" / "resnet101_cifar10.yaml")
    print(f"1. conformance (re-planning off), {args.seeds} seeds on-demand, {args.spot_seeds} on spot")
    plan = compile_plan(exp.spec, exp.model, exp.cloud, exp.deadline_s, samples=1000, seed=0)
    _compare(f"on-demand {plan.allocation}", plan, exp.model, args.seeds)
    for notice in (0, 120):
        cloud = exp.catalog.get("p3.8xlarge", Market.SPOT, {**exp.cloud_overrides,
                                "spot": {"notice_s": notice, "preemption": {"rate_per_hour": 2.0}}})
        spot = plan_allocation(exp.spec, plan.allocation, exp.model, cloud, exp.deadline_s, samples=2000)
        _compare(f"spot 2/h, notice {notice} s", spot, exp.model, args.spot_seeds)
    for zone in ("us-east-1a", "us-west-2b"):
        cloud = exp.catalog.get("p3.8xlarge", Market.SPOT, exp.cloud_overrides).in_zone(zone, str(TRACES))
        spot = plan_allocation(exp.spec, plan.allocation, exp.model, cloud, exp.deadline_s, samples=2000)
        _compare(f"spot trace {zone}", spot, exp.model, args.spot_seeds, quantiles=True)

    print("\n2. re-planning: truth 25% slower, deadline 25m, confidence 0.9, 30 rehearsals")
    slow = exp.model.replace(iter_latency_s={g: Normal(d.mean * 1.25, d.std * 1.25)
                                             for g, d in exp.model.iter_latency_s.items()})
    plan = compile_plan(exp.spec, exp.model, exp.cloud, 25 * 60, samples=1000, confidence=0.9)
    for label, replan_with in (("re-planning", exp.model), ("fixed plan", None)):
        runs = [rehearse(plan, slow, seed=s, mode=exp.mode, replan_with=replan_with) for s in range(30)]
        jct = np.array([r.actual["jct_s"] for r in runs])
        cost = np.array([r.actual["cost_usd"] for r in runs])
        print(f"{label:<12} P(meet 25m) {np.mean(jct <= 1500):.0%}  JCT mean {jct.mean():.0f} s  cost mean ${cost.mean():.2f}")

    print("\n3. wall time of one SHA(512, 4, 4096, 2) rehearsal (best of 3)")
    exp = load_experiment(ROOT / "experiments" / "resnet50_sha512.yaml")
    plan = compile_plan(exp.spec, exp.model, exp.cloud, exp.deadline_s, samples=exp.samples)
    for label, replan_with in (("re-planning off", None), ("re-planning on", exp.model)):
        times = []
        for s in range(3):
            t = time.perf_counter()
            rehearse(plan, exp.model, seed=s, replan_with=replan_with)
            times.append(time.perf_counter() - t)
        print(f"{label:<16} {min(times):.2f} s")


if __name__ == "__main__":
    main()
