"""Benchmark the planner: compile_plan speed on the paper's largest job, and policy costs per example.

Run from the repository root:

    .venv/bin/python benchmarks/bench_plan.py

Part 1 times ``compile_plan`` for SHA(512, 4, 4096, 2) on p3.8xlarge
(``experiments/resnet50_sha512.yaml``) with the optimal and greedy policies at 100 and 200
Monte-Carlo samples, best of 3 (each call builds its own table: nothing is cached between
calls). Part 2 plans every example experiment with every policy at its own deadline and
compares their mean costs.
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

from rubberband import InfeasibleDeadlineError, load_experiment  # noqa: E402
from rubberband.plan import POLICIES, compile_plan  # noqa: E402
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
    parser.add_argument("--samples", type=int, help="samples for part 2 (default: each experiment's own)")
    args = parser.parse_args(argv)
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPU(s)\n")
    print(timing_table(args.repeats))
    print()
    print(cost_table(args.samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
