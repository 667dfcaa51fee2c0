"""Benchmark: rehearsals (``run --provider sim``) against the simulator, re-planning, and wall time.

1. Conformance (issue 21): the ResNet-101 job rehearsed on the ``sim`` backend over N seeds
   (re-planning and the safety net off) against ``rb.simulate`` over 4000 samples, for each
   case of ``rubberband.testing.conformance`` — on-demand, packed, spot at 2 and 5 reclaims per
   instance-hour with notices of 0, 120 and 600 s, a zone's trace, mixed markets, a type per
   stage: one row per case with Δ mean JCT %, Δ mean cost %, Δ P(meet 20m) in points and the
   rehearsals' mean JCT standard error (a trace's JCT is heavy-tailed).
2. Re-planning: a truth 25% slower than the profile, a 25-minute deadline, confidence 0.9:
   the share of 30 rehearsals that meet the deadline re-planning and with the plan fixed.
3. Wall time of one rehearsal of SHA(512, 4, 4096, 2) (``experiments/resnet50_sha512.yaml``),
   best of 3, with and without re-planning.
4. The spot safety net (issue #15's "Done when"): the ResNet-101 job's 20-minute plan
   (confidence 0.9, on-demand: 32,20,12,12 GPUs) run on spot with a 25-minute deadline,
   re-planning off, over N rehearsal windows, with and without the net: spot reclaimed twice
   per instance-hour (no notice, and a 120 s notice), then the shipped traces' worst zone
   (us-east-1a, 17% available) and best (us-west-2b). Each line gives P(meet), the misses,
   the mean cost and the saving against all-on-demand: the cheapest on-demand plan that meets
   25 minutes at confidence 0.9 (and the same allocation on on-demand, what the net falls back
   to). Last, the spot planner's own plan for 25 minutes (it spends the slack on cheaper
   stages, so the net has less room and switches more often).

Run: ``.venv/bin/python benchmarks/bench_rehearse.py [--seeds 800] [--net-windows 300] [--only 1]``
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from rubberband import load_experiment
from rubberband.executor.rehearse import rehearse
from rubberband.plan import compile_plan, plan_allocation
from rubberband.profiles import Normal
from rubberband.profiles.cloud import Market
from rubberband.testing.conformance import HEADER, agreement, cases

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=800, help="rehearsals per conformance case")
    parser.add_argument("--net-windows", type=int, default=300)
    parser.add_argument("--only", type=int, choices=[1, 2, 3, 4], help="run only this part")
    args = parser.parse_args()
    parts = [args.only] if args.only else [1, 2, 3, 4]
    if 1 in parts:
        conformance(args)
    if 2 in parts:
        replanning()
    if 3 in parts:
        wall_time()
    if 4 in parts:
        safety_net(args.net_windows)


def conformance(args) -> None:
    print(f"1. conformance: rehearsals ({args.seeds} seeds) vs simulate (4000 samples), re-planning and net off")
    print(HEADER)
    for case in cases():
        t = time.perf_counter()
        print(agreement(case, seeds=args.seeds).row(), f"[{time.perf_counter() - t:.0f} s]", flush=True)


def replanning() -> None:
    exp = load_experiment(ROOT / "experiments" / "resnet101_cifar10.yaml")
    print("\n2. re-planning: truth 25% slower, deadline 25m, confidence 0.9, 30 rehearsals")
    slow = exp.model.replace(iter_latency_s={g: Normal(d.mean * 1.25, d.std * 1.25)
                                             for g, d in exp.model.iter_latency_s.items()})
    plan = compile_plan(exp.spec, exp.model, exp.cloud, 25 * 60, samples=1000, confidence=0.9)
    for label, replan_with in (("re-planning", exp.model), ("fixed plan", None)):
        runs = [rehearse(plan, slow, seed=s, mode=exp.mode, replan_with=replan_with) for s in range(30)]
        jct = np.array([r.actual["jct_s"] for r in runs])
        cost = np.array([r.actual["cost_usd"] for r in runs])
        print(f"{label:<12} P(meet 25m) {np.mean(jct <= 1500):.0%}  JCT mean {jct.mean():.0f} s  cost mean ${cost.mean():.2f}")


def wall_time() -> None:
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



def safety_net(windows: int) -> None:
    exp = load_experiment(ROOT / "experiments" / "resnet101_cifar10.yaml")
    deadline = 25 * 60
    fast = compile_plan(exp.spec, exp.model, exp.cloud, 20 * 60, samples=1000, confidence=0.9)
    cheapest = compile_plan(exp.spec, exp.model, exp.cloud, deadline, samples=1000, confidence=0.9)
    same = fast.predicted.mean_cost_usd
    od = cheapest.predicted.mean_cost_usd
    print(f"\n4. spot safety net: the 20-minute plan {fast.allocation} on spot, deadline 25m, re-planning off, "
          f"{windows} windows\n   all on-demand: cheapest 25m plan {cheapest.allocation} ${od:.2f} "
          f"(the same allocation ${same:.2f})")

    def row(label: str, plan) -> None:
        for net in (None, exp.model):
            t = time.perf_counter()
            runs = [rehearse(plan, exp.model, seed=s, mode=exp.mode, safety_net=net) for s in range(windows)]
            jct = np.array([r.actual["jct_s"] for r in runs])
            cost = np.array([r.actual["cost_usd"] for r in runs])
            markets = [{i["market"] for i in r.ledger["instances"]} for r in runs]
            switched = np.mean(["on-demand" in m for m in markets])
            print(f"   {label:<26} {'net' if net else 'no net':<6} P(meet) {np.mean(jct <= deadline):6.1%}  "
                  f"misses {int(np.sum(jct > deadline)):3d}  cost mean ${cost.mean():6.2f} "
                  f"(saves {1 - cost.mean() / od:5.1%} vs on-demand; {1 - cost.mean() / same:5.1%} vs same)  "
                  f"JCT mean {jct.mean():7.0f} s  p99 {np.percentile(jct, 99):7.0f} s  switched {switched:4.0%}  "
                  f"[{time.perf_counter() - t:.0f} s]", flush=True)

    for notice in (0, 120):
        cloud = exp.catalog.get("p3.8xlarge", Market.SPOT, {**exp.cloud_overrides,
                                "spot": {"notice_s": notice, "preemption": {"rate_per_hour": 2.0}}})
        row(f"2 reclaims/h, notice {notice} s", plan_allocation(exp.spec, fast.allocation, exp.model, cloud, deadline,
                                                               samples=200))
    for zone in ("us-east-1a", "us-west-2b"):
        cloud = exp.catalog.get("p3.8xlarge", Market.SPOT, exp.cloud_overrides).in_zone(zone, str(TRACES))
        row(f"trace {zone}", plan_allocation(exp.spec, fast.allocation, exp.model, cloud, deadline, samples=200))
    cloud = exp.catalog.get("p3.8xlarge", Market.SPOT, {**exp.cloud_overrides,
                            "spot": {"notice_s": 120, "preemption": {"rate_per_hour": 2.0}}})
    spot = compile_plan(exp.spec, exp.model, cloud, deadline, samples=1000, confidence=0.9, market="spot")
    row(f"spot plan {spot.allocation}, 2/h", spot)


if __name__ == "__main__":
    main()
