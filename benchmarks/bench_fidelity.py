"""Benchmark: does a profiled run land on its prediction, run after run? (issue 21, item 9)

Each round does what ``scripts/demo`` does: ``rubberband profile experiments/demo.yaml``
on this machine, then ``rubberband run`` with that measurement on the local provider, with the
demo's deadline (80% of what one instance would take, so the plan is elastic; ``--deadline``
to give one) and, as the demo, at most as many instances a stage as this machine has cores
(``--max-instances``). It prints one line per round: the predicted and actual JCT and cost and their
errors, the instances per stage planned/actual, then where the time went, measured against
what the model expects:

- ``first``: run start -> the first trial's TRAIN (the autoscaler's lag, provisioning,
  initialisation), actual vs the profile's provision + init means (+ ``init_contention_s``
  per other instance stage 0 launches);
- ``L1``: the run's mean measured seconds per iteration at one GPU per trial against the
  profile's mean;
- per stage, actual - predicted duration in seconds.

``--max-fused 8`` profiles fusion as ``scripts/demo`` does (the plan may then fuse its wide
stages) and sets the deadline as the demo does: 80% of one instance's JCT, or halfway between
the fastest plan and one instance when that 80% is below what the fastest plan can do.

Run: ``.venv/bin/python benchmarks/bench_fidelity.py [--rounds 10] [--test-profile] [--max-fused 8] [--deadline 30s] [--max-instances 2]``
(``--test-profile`` profiles as ``tests/integration/test_cli_run.py`` does: ``--gpus 1
--repeats 2 --max-packing 1``). Needs a quiet machine: anything else running skews profile and run apart.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--test-profile", action="store_true", help="profile as the integration test does")
    parser.add_argument("--experiment", default=str(ROOT / "experiments" / "demo.yaml"))
    parser.add_argument("--max-fused", type=int, default=1, help="profile fused groups up to this size (scripts/demo: 8)")
    parser.add_argument("--max-instances", type=int, default=max(2, len(os.sched_getaffinity(0))),
                        help="the most instances a stage may hold (default, as scripts/demo: this machine's cores, "
                             "at least 2)")
    parser.add_argument("--deadline", default="demo",
                        help="the run's deadline; demo (default): 80%% of one instance's JCT, as scripts/demo sets it")
    args = parser.parse_args()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    errors: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="rb-fidelity-") as tmp:
        env["RUBBERBAND_STATE_DIR"] = str(Path(tmp) / "state")
        runs = Path(tmp) / "runs"

        def cli(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
            runs_dir = [] if argv[0] == "plan" else ["--runs-dir", str(runs)]
            out = subprocess.run([sys.executable, "-m", "rubberband", *argv, *runs_dir],
                                 env=env, capture_output=True, text=True, timeout=600)
            if out.returncode and check:
                sys.exit(f"rubberband {argv[0]} failed: {out.stderr[-2000:]}")
            return out

        print(f"{'round':>5} {'deadline':>8} {'pred JCT':>9} {'actual':>8} {'JCT err':>8} {'cost err':>8} "
              f"{'instances plan/real':>21} {'first a/p':>11} {'L1 a/p':>13}  stage errors (s)")
        for i in range(args.rounds):
            prof = Path(tmp) / f"p{i}" / "demo.yaml"
            shape = ["--gpus", "1", "--repeats", "2", "--max-packing", "1"] if args.test_profile else ["--max-packing", "1"]
            if args.max_fused > 1:
                shape += ["--max-fused", str(args.max_fused)]
            cli("profile", args.experiment, *shape, "--out", str(prof), "--force")
            measured = ["--model-profile", str(prof), "--cloud-overrides", str(prof.with_name("demo.cloud.yaml")),
                        "--max-instances", str(args.max_instances)]
            deadline = args.deadline
            if deadline == "demo":
                one = json.loads(cli("plan", args.experiment, *measured, "--deadline", "1h", "--json").stdout)
                d = 0.8 * one["predicted"]["jct_s_mean"]
                if args.max_fused > 1:      # scripts/demo's rule for a fused plan
                    m = re.search(r"raise the deadline to at least ([0-9.]+)s",
                                  cli("plan", args.experiment, *measured, "--deadline", "1s", check=False).stderr)
                    fast = float(m.group(1)) if m else 0.0
                    d = d if d >= 1.05 * fast else (fast + one["predicted"]["jct_s_mean"]) / 2
                deadline = f"{d:.1f}s"
            result = json.loads(cli("run", args.experiment, "--provider", "local", "--json", *measured,
                                    "--deadline", deadline).stdout)
            p, a = result["predicted"], result["actual"]
            jct_err, cost_err = a["jct_s"] / p["jct_s"] - 1, a["cost_usd"] / p["cost_usd"] - 1
            errors.append((jct_err, cost_err))
            profile = yaml.safe_load(prof.read_text())
            cloud = yaml.safe_load(prof.with_name("demo.cloud.yaml").read_text())
            new0 = result["stages"][0]["predicted"]["instances"]
            first_p = (cloud["provision_latency_s"]["mean"] + cloud["init_latency_s"]["mean"]
                       + cloud.get("init_contention_s", 0.0) * (new0 - 1))
            trials = result["ledger"]["trials"]
            first_a = min(t["start_s"] for t in trials)
            iters = [s for t in trials if t["gpus"] == 1 for s in t["iter_s"]]
            l1_a, l1_p = statistics.fmean(iters), profile["iter_latency_s"][1]["mean"]
            stage_err = " ".join(f"{s['actual']['duration_s'] - s['predicted']['duration_s']:+.2f}"
                                 for s in result["stages"])
            instances = (",".join(str(s["predicted"]["instances"]) for s in result["stages"]) + "/"
                         + ",".join(str(s["actual"]["instances"]) for s in result["stages"]))
            print(f"{i:>5} {deadline:>8} {p['jct_s']:>8.2f}s {a['jct_s']:>7.2f}s {jct_err:>+8.1%} {cost_err:>+8.1%} "
                  f"{instances:>21} "
                  f"{first_a:>5.2f}/{first_p:<5.2f} {l1_a:>6.3f}/{l1_p:<6.3f}  {stage_err}", flush=True)
    worst = max(errors, key=lambda e: abs(e[0]))
    print(f"worst JCT error {worst[0]:+.1%}; worst cost error {max(abs(e[1]) for e in errors):.1%}; "
          f"within 10%/2%: {sum(abs(j) <= 0.10 and abs(c) <= 0.02 for j, c in errors)} of {len(errors)}")


if __name__ == "__main__":
    main()
