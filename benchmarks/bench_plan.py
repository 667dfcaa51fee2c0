"""Benchmark the planner: compile_plan speed on the paper's largest jobs, and policy costs per example.

Run from the repository root:

    .venv/bin/python benchmarks/bench_plan.py [--repeats 2] [--cases sha512-64,hyperband81,...]

Part 1 times ``compile_plan`` for SHA(512, 4, 4096, 2) on p3.8xlarge
(``experiments/resnet50_sha512.yaml``) with the optimal and greedy policies at 100 and 200
Monte-Carlo samples, best of ``--repeats`` (each call builds its own table: nothing is cached
between calls). Part 2 times the optimal planner on the scale cases of issue #14 (``CASES``),
each against its target: the Figure 12 shape with a profile up to 64 GPUs per trial,
``t(g) = 12 (0.05 + 0.95 / g)`` s with a 10% std (``wide_profile``); HyperBand(1 -> 81,
eta 3) chained (15 stages) with that profile, at a deadline that binds (10 min) and one no plan
meets (7 min); SHA(1000, 4, 4096, 3) at 1,000 samples; and
SHA(512) with ``market="auto"`` at confidence 0.95, on a rate model (spot at 30% of the price,
0.3 reclaims per instance-hour, 120 s notice) and on a trace zone (us-west-2b). Part 3 plans
every example experiment with every policy at its own deadline and compares their mean costs.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rubberband import ExperimentSpec, InfeasibleDeadlineError, ModelProfile, load_experiment  # noqa: E402
from rubberband.plan import POLICIES, compile_plan  # noqa: E402
from rubberband.profiles.spot import SpotMarket, load_trace  # noqa: E402
from rubberband.render import render  # noqa: E402

TARGETS_S = {"optimal": 1.0, "greedy": 2.0}


def best_of(repeats: int, fn, *args, **kwargs) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t0)
    return best, out


def timing_table(repeats: int) -> str:
    exp = load_experiment(ROOT / "experiments" / "resnet50_sha512.yaml")
    rows = []
    for policy in ("optimal", "greedy"):
        for samples in (100, 200):
            seconds, plan = best_of(repeats, compile_plan, exp.spec, exp.model, exp.cloud, exp.deadline_s,
                                    policy=policy, samples=samples, seed=exp.seed)
            target = TARGETS_S[policy]
            rows.append([policy, samples, f"{seconds:.3f}", f"< {target:g}", "ok" if seconds < target else "SLOW",
                         f"${plan.predicted.mean_cost_usd:,.2f}", f"{plan.predicted.mean_jct_s / 60:.1f}"])
    return render(["policy", "samples", f"best of {repeats} (s)", "target (s)", "", "mean cost", "JCT (min)"], rows,
                  title=f"compile_plan, SHA(512,4,4096,2) ({exp.spec.num_stages()} stages) on "
                        f"{exp.cloud.instance_type}, deadline {exp.deadline_s / 60:.0f} min")


def wide_profile(base: ModelProfile) -> ModelProfile:
    """Issue #14's scaling curve up to 64 GPUs per trial: t(g) = 12 (0.05 + 0.95 / g) s, std 10%,
    with the start-up and SYNC of ``base`` (the Figure 12 ResNet-50 profile)."""
    latency = {g: {"dist": "normal", "mean": 12 * (0.05 + 0.95 / g), "std": 1.2 * (0.05 + 0.95 / g)}
               for g in (1, 2, 4, 8, 16, 32, 64)}
    return ModelProfile.from_dict({"name": "fig12-up-to-64-gpus", "iter_latency_s": latency,
                                   "trial_startup_s": base.trial_startup_s.to_dict(), "sync_s": base.sync_s.to_dict(),
                                   "measured_on": dict(base.measured_on)})


def scale_cases() -> list[tuple[str, float, dict]]:
    """Issue #14's cases: (name, target seconds, compile_plan arguments)."""
    exp = load_experiment(ROOT / "experiments" / "resnet50_sha512.yaml")
    wide, cloud = wide_profile(exp.model), exp.cloud
    traces = ROOT / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json"
    rate = cloud.replace(spot_price_usd_per_hour=0.3 * cloud.price_usd_per_hour,
                         spot=SpotMarket(notice_s=120, rate_per_hour=0.3))
    zone = cloud.replace(spot=SpotMarket(notice_s=120, trace=load_trace(traces, "us-west-2b"), trace_file=str(traces)))
    hyperband = ExperimentSpec.chain(ExperimentSpec.hyperband(1, 81, 3))
    common = dict(model=wide, cloud=cloud, deadline_s=exp.deadline_s)
    markets = dict(spec=exp.spec, model=exp.model, deadline_s=exp.deadline_s, samples=200, confidence=0.95, market="auto")
    return [
        ("SHA(512) 64-GPU profile, 100 samples", 1.0, dict(spec=exp.spec, samples=100, **common)),
        ("SHA(512) 64-GPU profile, 200 samples", 2.0, dict(spec=exp.spec, samples=200, **common)),
        ("HyperBand(1->81, eta 3) chained, 10 min, 200 samples", 3.0,
         dict(spec=hyperband, samples=200, **{**common, "deadline_s": 600.0})),
        ("HyperBand(1->81, eta 3) chained, 7 min (infeasible)", 3.0,
         dict(spec=hyperband, samples=200, **{**common, "deadline_s": 420.0})),
        ("SHA(1000,4,4096,3), 1000 samples", 5.0, dict(spec=ExperimentSpec.sha(1000, 4, 4096, 3), samples=1000, **common)),
        ("SHA(512) market auto, rate 0.3/h, p 0.95", 2.0, dict(cloud=rate, **markets)),
        ("SHA(512) market auto, trace us-west-2b, p 0.95", 2.0, dict(cloud=zone, **markets)),
    ]


def plan_or_error(**kwargs):
    try:
        return compile_plan(**kwargs)
    except InfeasibleDeadlineError as exc:
        return exc


def scale_table(repeats: int, only: list[str] | None) -> str:
    rows = []
    for i, (name, target, kwargs) in enumerate(scale_cases()):
        if only and str(i) not in only:
            continue
        seconds, plan = best_of(repeats, plan_or_error, **kwargs)
        if isinstance(plan, InfeasibleDeadlineError):   # reporting it is the planner's work too: timed all the same
            outcome = f"infeasible (fastest {plan.min_jct_s / 60:.1f} min)"
        else:
            outcome = f"${plan.predicted.mean_cost_usd:,.2f}, {plan.predicted.mean_jct_s / 60:.1f} min"
        rows.append([i, name, f"{seconds:.2f}", f"< {target:g}", "ok" if seconds < target else "SLOW", outcome])
        print(f"  {i}: {name}: {seconds:.2f} s", file=sys.stderr, flush=True)
    return render(["#", "case", f"best of {repeats} (s)", "target (s)", "", "plan"], rows,
                  title="compile_plan (optimal) at scale on p3.8xlarge, deadline 90 min unless stated")


def cost_table(samples: int | None) -> str:
    rows = []
    for path in sorted((ROOT / "experiments").glob("*.yaml")):
        exp = load_experiment(path)
        if exp.deadline_s is None:
            continue
        cloud = exp.cloud
        n = samples or exp.samples
        costs = {}
        for policy in POLICIES:
            try:
                plan = compile_plan(exp.spec, exp.model, cloud, exp.deadline_s, policy=policy, samples=n, seed=exp.seed)
                costs[policy] = plan.predicted.mean_cost_usd
            except InfeasibleDeadlineError:
                costs[policy] = None
        fmt = {p: (f"${c:,.2f}" if c is not None else "infeasible") for p, c in costs.items()}
        vs_greedy = (f"{100 * (1 - costs['optimal'] / costs['greedy']):.1f}%"
                     if costs["optimal"] and costs["greedy"] else "-")
        vs_static = f"{costs['static'] / costs['optimal']:.2f}x" if costs["optimal"] and costs["static"] else "-"
        rows.append([exp.name, cloud.instance_type, f"{exp.deadline_s / 60:.0f}m", n, fmt["optimal"], fmt["greedy"],
                     fmt["static"], fmt["naive-elastic"], vs_greedy, vs_static])
    return render(["experiment", "type", "deadline", "samples", "optimal", "greedy", "static", "naive-elastic",
                   "optimal cheaper than greedy", "static/optimal"], rows,
                  title="mean cost of each policy's plan at the experiment's deadline")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timing repeats (best of)")
    parser.add_argument("--samples", type=int, help="samples for part 3 (default: each experiment's own)")
    parser.add_argument("--cases", help="comma-separated numbers of the part 2 cases to run (default: all)")
    parser.add_argument("--only-scale", action="store_true", help="run part 2 only")
    args = parser.parse_args(argv)
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPU(s)\n")
    if not args.only_scale:
        print(timing_table(args.repeats))
        print()
    print(scale_table(args.repeats, args.cases.split(",") if args.cases else None))
    if not args.only_scale:
        print()
        print(cost_table(args.samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
