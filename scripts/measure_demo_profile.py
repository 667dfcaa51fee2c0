#!/usr/bin/env python
"""Measure the demo job on this machine and write the profiles the planner uses for it.

A thin wrapper over ``rubberband.profiler.profile`` (also ``rubberband profile``): starts a local
cluster of the experiment's instance type and measures, through the real executor, the
initialisation latency (running -> warm workers) over two launches and, per GPUs-per-trial
count, trial start-up and seconds per iteration from small stages run by the real driver.

Writes the model profile to the experiment's ``model_profile`` file
(``profiles/demo_digits_local.yaml`` for the demo) and the fitted initialisation latency into
``defaults.init_latency_s`` of the experiment's region file (``cloud_profiles/local/local.yaml``):
this is how ``scripts/demo`` calibrates its prediction.

Usage: python scripts/measure_demo_profile.py [experiments/demo.yaml] [--iters 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("experiment", nargs="?", default=str(ROOT / "experiments" / "demo.yaml"))
    parser.add_argument("--iters", type=int, default=4, help="extra iterations of the long trials (>= 1)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each trial length per GPU count")
    parser.add_argument("--max-seconds", type=float, help="bound the profiling's wall time")
    args = parser.parse_args(argv)

    from rubberband.errors import RubberbandError
    from rubberband.profiler import profile

    try:
        result = profile(args.experiment, iters=args.iters, repeats=args.repeats, max_seconds=args.max_seconds,
                         out=_model_path(args.experiment), cloud_out=False, update_region=True,
                         runs_dir=ROOT / "runs", on_progress=lambda line: print(line, flush=True))
    except RubberbandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result.table())
    return 0


def _model_path(experiment: str) -> Path | None:
    """The experiment's own ``model_profile`` file, which this script refreshes."""
    try:
        value = yaml.safe_load(Path(experiment).read_text())["model_profile"]
    except (OSError, ValueError, KeyError, TypeError):
        return None   # `profile` reports the unreadable experiment itself
    if not isinstance(value, str):
        return None   # an inline profile: write the default path instead
    path = Path(value)
    return path if path.is_absolute() else Path(experiment).resolve().parent / path


if __name__ == "__main__":
    sys.exit(main())
