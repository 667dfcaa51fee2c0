"""`rubberband profile`: measure a job's model profile and the provider's latencies on real instances."""

from __future__ import annotations

import argparse
import sys

from rubberband.cli.common import (
    command,
    decimal,
    emit,
    int_list,
    print_warnings,
    resolve_args,
    runs_dir_default,
    whole,
)
from rubberband.errors import SpecError
from rubberband.providers import base as providers


def _profile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", help="experiment YAML file (its trainer, search space and instance type)")
    p.add_argument("--provider", default=providers.DEFAULT, help=f"where to measure: {' or '.join(providers.names())} (default {providers.DEFAULT})")
    p.add_argument("--cluster", metavar="CLUSTER_YAML", help="aws: Ray cluster YAML (default: the experiment's `cluster:`)")
    p.add_argument("--gpus", help="GPUs per trial: powers of two up to the largest given are measured, e.g. 1,2 "
                                  "(default: up to the instance type's GPUs)")
    p.add_argument("--iters", type=whole, default=4, help="extra iterations of the long trials (default 4; at least 1)")
    p.add_argument("--repeats", type=whole, default=3, help="runs of each trial length per GPU count (default 3)")
    p.add_argument("--max-seconds", help="bound the profiling's wall time, e.g. 300 or 5m (fewer repeats if needed)")
    p.add_argument("--out", help="model profile to write (default <runs-dir>/profiles/<experiment>_<instance type>.yaml)")
    p.add_argument("--cloud-out", help="cloud latency overrides to write (default <out stem>.cloud.yaml)")
    p.add_argument("--force", action="store_true", help="replace --out / --cloud-out files that exist already")
    p.add_argument("--runs-dir", default=runs_dir_default(), help="where the profiling cluster keeps its run directory and, by default, "
                   "the profiles (default $RUBBERBAND_RUNS_DIR, else ./runs)")
    p.add_argument("--max-packing", type=whole, default=8, metavar="K",
                   help="measure 1-GPU trials packed k = 1, 2, 4, ... per GPU up to K, until throughput stops "
                        "rising or memory runs out (default 8; 1 measures no packing)")
    p.add_argument("--max-fused", type=whole, default=1, metavar="F",
                   help="measure 1-GPU trials fused F = 1, 2, 4, ... to a program (one GPU) up to F, until "
                        "throughput stops rising or memory runs out (default 1: no fusion)")
    p.add_argument("--latency-scale", type=decimal, default=1.0,
                   help="scale the emulated provisioning wait (local; aws against an emulator)")


def profile_cmd(args: argparse.Namespace) -> int:
    from rubberband.profiler import profile
    from rubberband.profiler.measure import output_paths
    from rubberband.units import parse_duration

    providers.get(args.provider, "--provider")       # an unknown provider is named first
    gpus = int_list(args.gpus, "--gpus", "whole numbers of GPUs per trial such as 1,2,4") if args.gpus is not None else None
    max_seconds = parse_duration(args.max_seconds, "--max-seconds") if args.max_seconds is not None else None
    req = resolve_args(args)
    print_warnings(req)
    exp = req.experiment
    if not args.force and not exp.auto_instance_type:
        # A profile is the measurement of record: replacing one (a shipped one, say) takes --force.
        for flag, path in zip(("--out", "--cloud-out"), output_paths(exp.name, exp.instance_type, args.out,
                                                                    args.cloud_out, args.runs_dir)):
            if path is not None and path.exists():
                raise SpecError(f"{flag}: {path} exists; pass --force to replace it, or write elsewhere")

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    # `profile` checks every argument before it starts a cluster.
    result = profile(exp, provider=args.provider, gpus=gpus, iters=args.iters, repeats=args.repeats,
                     max_seconds=max_seconds, out=args.out, cloud_out=args.cloud_out, runs_dir=args.runs_dir,
                     on_progress=progress, cluster=args.cluster, latency_scale=args.latency_scale,
                     max_packing=args.max_packing, max_fused=args.max_fused)
    emit(args, result.to_dict(), result.table())
    return 0


profile_cmd.arguments = _profile_args  # type: ignore[attr-defined]
command("profile", "measure a job's model profile and the provider's latencies, and write them")(profile_cmd)
