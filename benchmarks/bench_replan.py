"""Benchmark: the time from ``SyncDone`` to the new decisions when re-planning (issue 22).

At a SYNC the scheduler asks for a re-plan (``ComputeReplan``) and goes on when it comes
(``ReplanReady``); on the ``sim`` backend the re-plan runs inline at the same virtual instant,
so the wall time from ``SyncDone`` to the new decisions is the wall time of
``Replanner.replan`` itself, which this benchmark measures on every SYNC that has stages left.

Cases, each rehearsed (``run --provider sim``) with a truth 25% slower than the profile, so that
re-plans change plans, and the plan compiled for 1.5x the job's shortest mean JCT:

* SHA(512, 4, 4096, 2) of ``experiments/resnet50_sha512.yaml`` (ResNet-50 on p3.8xlarge, 200
  samples);
* HyperBand(1 -> 81, eta 3) chained (15 stages) on issue #14's profile up to 64 GPUs per trial
  (``bench_plan.wide_profile``), on p3.8xlarge at 200 samples, and on p3.2xlarge (one GPU per
  instance, 5,184 GPUs in the widest stage) at 100 samples: issue #22's outside check.

Each rehearsal (seeds 0.. ``--seeds``) runs ``--repeats`` times (deterministic: the same
re-plans each time); each re-plan's time is its best of those, and p50/p95 are over every
re-plan of the case's rehearsals. ``warm`` is the Replanner as shipped (the tail of the job's
table, ``StageTable.tail``); ``--cold`` adds the re-plan through ``compile_plan`` on fresh
streams (the Replanner without its table), for comparison. Wall seconds and the process's CPU
seconds (the planner's own work on a shared machine) are both given.

Run: ``.venv/bin/python benchmarks/bench_replan.py [--seeds 3] [--repeats 3] [--cold] [--only hb1]``
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_plan import shortest_jct_s, wide_profile  # noqa: E402

from rubberband import ExperimentSpec, load_experiment  # noqa: E402
from rubberband.executor.rehearse import rehearse  # noqa: E402
from rubberband.plan import compile_plan  # noqa: E402
from rubberband.profiles import Normal  # noqa: E402
from rubberband.render import render  # noqa: E402
from rubberband.scheduler import Replanner  # noqa: E402

TARGET_S = 0.2          # issue 22: p95 under 200 ms
SLOWER = 1.25           # the truth's iteration latencies over the profile's
DEADLINE_X = 1.5        # the plan's deadline over the job's shortest mean JCT


def cases() -> dict[str, tuple[str, ExperimentSpec, object, object, int]]:
    """name -> (label, spec, model, cloud, samples)."""
    exp = load_experiment(ROOT / "experiments" / "resnet50_sha512.yaml")
    wide = wide_profile(exp.model)
    hyperband = ExperimentSpec.chain(ExperimentSpec.hyperband(1, 81, 3))
    one_gpu = exp.catalog.with_overrides(exp.cloud_overrides).get("p3.2xlarge")
    return {
        "sha512": ("SHA(512,4,4096,2) p3.8xlarge, 200 samples", exp.spec, exp.model, exp.cloud, exp.samples),
        "hb8": ("HyperBand(81) chained, 64-GPU profile, p3.8xlarge, 200 samples", hyperband, wide, exp.cloud, 200),
        "hb1": ("HyperBand(81) chained, 64-GPU profile, p3.2xlarge, 100 samples", hyperband, wide, one_gpu, 100),
    }


@contextmanager
def timed_replans(cold: bool):
    """Record (sync, wall s, CPU s, changed) of every ``Replanner.replan`` with stages left;
    with ``cold``, the Replanner has no table (``compile_plan`` on fresh streams)."""
    calls: list[tuple[int, float, float, bool]] = []
    replan, job_table = Replanner.replan, Replanner._job_table

    def timed(self, sync, *args, **kwargs):
        w, c = time.perf_counter(), time.process_time()
        out = replan(self, sync, *args, **kwargs)
        if sync + 1 < self.plan.spec.num_stages():
            calls.append((sync, time.perf_counter() - w, time.process_time() - c, out is not None))
        return out

    Replanner.replan = timed
    if cold:
        Replanner._job_table = lambda self: None
    try:
        yield calls
    finally:
        Replanner.replan, Replanner._job_table = replan, job_table


def measure(plan, truth, model, seeds: int, repeats: int, cold: bool) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Per re-plan, its best wall and CPU seconds over ``repeats`` rehearsals of each seed;
    the number of re-plans that changed the plan."""
    walls, cpus, changed = [], [], 0
    for seed in range(seeds):
        runs = []
        for _ in range(repeats):
            with timed_replans(cold) as calls:
                rehearse(plan, truth, seed=seed, replan_with=model)
            runs.append(calls)
        assert all([(c[0], c[3]) for c in r] == [(c[0], c[3]) for c in runs[0]] for r in runs), "rehearsal not deterministic"
        walls += list(np.min([[c[1] for c in r] for r in runs], axis=0))
        cpus += list(np.min([[c[2] for c in r] for r in runs], axis=0))
        changed += sum(c[3] for c in runs[0])
    return np.array(walls), np.array(cpus), len(walls), changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="rehearsals per case (seeds 0..N-1)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each rehearsal; each re-plan's best is kept")
    parser.add_argument("--cold", action="store_true", help="also time re-plans through compile_plan (no table)")
    parser.add_argument("--only", choices=sorted(cases()), action="append", help="run only these cases")
    args = parser.parse_args(argv)
    rows = []
    for name, (label, spec, model, cloud, samples) in cases().items():
        if args.only and name not in args.only:
            continue
        deadline = DEADLINE_X * shortest_jct_s(spec, model, cloud, samples)
        plan = compile_plan(spec, model, cloud, deadline, samples=samples)
        truth = model.replace(iter_latency_s={g: Normal(d.mean * SLOWER, d.std * SLOWER)
                                              for g, d in model.iter_latency_s.items()})
        for mode in ("warm", "cold") if args.cold else ("warm",):
            wall, cpu, n, changed = measure(plan, truth, model, args.seeds, args.repeats, mode == "cold")
            p50, p95 = np.percentile(wall * 1e3, [50, 95])
            rows.append([label, mode, n, changed, f"{p50:.0f}", f"{p95:.0f}", f"{wall.max() * 1e3:.0f}",
                         f"{np.percentile(cpu * 1e3, 50):.0f}", f"{np.percentile(cpu * 1e3, 95):.0f}",
                         "ok" if p95 < TARGET_S * 1e3 else "SLOW"])
            print(f"{label} [{mode}]: {n} re-plans, p50 {p50:.0f} ms, p95 {p95:.0f} ms", file=sys.stderr, flush=True)
    print(render(["case", "re-plan", "re-plans", "changed", "p50 ms", "p95 ms", "max ms", "CPU p50", "CPU p95",
                  f"p95 < {TARGET_S * 1e3:.0f} ms"], rows,
                 title=f"SyncDone -> new decisions (Replanner.replan), truth {SLOWER - 1:.0%} slower, deadline "
                       f"{DEADLINE_X}x shortest JCT, best of {args.repeats} per re-plan, {args.seeds} seeds"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
