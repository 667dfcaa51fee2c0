"""`rubberband run`: plan the job (or read a plan) and run it for real; predicted vs actual."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from rubberband.cli.common import (
    IMAGE_TYPES,
    command,
    decimal,
    dollars,
    emit,
    experiment_arg,
    int_list,
    market,
    max_instances_arg,
    measured_args,
    output_path,
    print_warnings,
    probability,
    resolve_args,
    runs_dir_default,
    summary_line,
    whole,
)
from rubberband.cli.plan_cmd import plan_from_args, plan_table
from rubberband.cli.rehearse import (
    EXIT_BUDGET,
    plan_model,
    rehearse_args,
    rehearse_cmd,
    target_plan_model,
    wants_rehearsal,
)
from rubberband.cli.report_cmd import draw_run, keep_model, run_summary
from rubberband.errors import SpecError
from rubberband.providers import base as providers
from rubberband.schema import load_yaml
from rubberband.units import parse_duration


def _run_args(p: argparse.ArgumentParser) -> None:
    experiment_arg(p)
    measured_args(p)
    p.add_argument("--provider", default=providers.DEFAULT, help=f"where to run: {' or '.join(providers.names())} (default {providers.DEFAULT})")
    p.add_argument("--cluster", metavar="CLUSTER_YAML",
                   help="aws: Ray cluster YAML (region, node type, AMI, subnets, ...); default: the experiment's `cluster:`")
    p.add_argument("--deadline", help="deadline, e.g. 2m (default: the experiment's)")
    p.add_argument("--policy", help="planning policy (default: the experiment's)")
    p.add_argument("--confidence", type=probability, help="plan for P(JCT <= deadline) >= this, e.g. 0.9")
    p.add_argument("--instance-type", help="plan for this instance type of the cloud profile, or `auto` for the cheapest")
    p.add_argument("--market", type=market,
                   help="plan on this market; auto chooses spot or on-demand per stage (default: the experiment's)")
    p.add_argument("--budget", type=dollars, metavar="USD",
                   help="a hard budget in dollars: no instance is launched whose minimum charge would break it, and "
                        "the run stops cleanly with the best trial so far, nothing left running (exit code 3) "
                        "when it runs out")
    max_instances_arg(p)
    p.add_argument("--plan", metavar="PLAN_JSON", help="run this plan (from `plan --out`) instead of planning")
    p.add_argument("--allocation", help="run this allocation (GPUs per stage, e.g. 8,4,2) instead of planning")
    p.add_argument("--fused-per-gpu", help="with --allocation: trials fused into one program per GPU per stage, e.g. "
                                           "16,4,1 (default 1; DESIGN §4.5)")
    p.add_argument("--seed", type=whole, help="random seed (default: the experiment's)")
    p.add_argument("--samples", type=whole, help="Monte-Carlo samples for planning")
    p.add_argument("--runs-dir", default=runs_dir_default(), help="where runs write checkpoints, ledger and result.json "
                   "(default $RUBBERBAND_RUNS_DIR, else ./runs)")
    p.add_argument("--gantt", metavar="PNG",
                   help="draw the run as it happened (its ledger) above the predicted median run to this image file "
                        "(later: `rubberband report RUN_DIR --gantt PNG`)")
    p.add_argument("--latency-scale", type=decimal,
                   help="scale the emulated provisioning latency (local; aws against an emulator; default 1)")
    p.add_argument("--launch-attempts", type=whole, default=6, help="aws: attempts per instance on capacity errors")
    p.add_argument("--launch-backoff", default="2s", help="aws: first wait between attempts (doubles each time)")
    p.add_argument("--spot-emulation", nargs="?", const=providers.SPOT_EMULATION_FROM_PLAN, metavar="OVERRIDE",
                   help="local: reclaim the plan's spot instances as its cloud profile's preemption model says "
                        "(notice first, then the node is killed and replaced); OVERRIDE changes the model, e.g. "
                        "rate=2/h,notice=20s (also life=30s: a fixed lifetime, zone=us-east-1a: replay a trace "
                        "zone, max=1: at most this many reclaims)")
    rehearse_args(p)


def run_cmd(args: argparse.Namespace) -> int:
    import signal

    from rubberband.executor.run import execute, progress_printer
    from rubberband.executor.session import raise_interrupt
    from rubberband.plan.plan import Plan

    signal.signal(signal.SIGTERM, raise_interrupt)   # SIGTERM cleans up like Ctrl-C

    provider = providers.get(args.provider, "--provider")     # an unknown provider is named first
    refuse_plan_conflicts(args)
    output_path(args.gantt, "--gantt", "actual.png", IMAGE_TYPES)
    if args.gantt and args.repeat is not None:
        raise SpecError("--gantt: draws one run, and --repeat rehearses many; drop --repeat, "
                        "or draw one of them with --seed N")
    # The budget of a run that plans nothing caps its spending only: it plans no deadline away.
    fusion = int_list(args.fused_per_gpu, "--fused-per-gpu") if args.fused_per_gpu else None
    if fusion is not None and not args.allocation:
        raise SpecError("--fused-per-gpu: goes with --allocation (a plan file has its own, and when run plans, the "
                        "planner chooses fusion itself); add --allocation, or drop --fused-per-gpu")
    req = resolve_args(args, budget=None if args.plan or args.allocation else args.budget,
                       fused_per_gpu=tuple(fusion) if fusion else None)
    exp = req.experiment
    if not wants_rehearsal(args) and not exp.trainer:
        raise SpecError("trainer: the experiment names no trainer; add `trainer: package.module:Name`")
    cluster = providers.cluster_yaml_for(provider, args.cluster, exp.cluster)
    if args.launch_attempts < 1:
        raise SpecError(f"--launch-attempts: must be at least 1, got {args.launch_attempts}")
    backoff = parse_duration(args.launch_backoff, "--launch-backoff")
    if args.spot_emulation is not None:
        providers.require_spot_emulation(provider)
    if args.latency_scale is not None:
        if not args.latency_scale > 0 or not math.isfinite(args.latency_scale):
            raise SpecError(f"--latency-scale: expected a positive factor, e.g. 0.5, got {args.latency_scale}")
        if not provider.starts_cluster:
            raise SpecError("--latency-scale: a rehearsal draws its latencies from the cloud profile; "
                            "drop it, or use --truth-cloud to change them")
    for dest in ("truth_model", "truth_cloud"):
        # Read them now: a wrong path is known before planning, not after the plan table.
        if getattr(args, dest, None) is not None:
            load_yaml(getattr(args, dest), f"--{dest.replace('_', '-')}")
    print_warnings(req)
    if args.plan:
        from rubberband.plan.plan import check_plan

        try:
            with open(args.plan, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise SpecError(f"--plan: cannot read a plan from {args.plan!r}: {getattr(exc, 'strerror', None) or exc}") from None
        # A plan file is user input: check it against the experiment and predict it again.
        try:
            plan = check_plan(Plan.from_json(text), req.spec, req.models, req.catalog, samples=req.samples)
        except SpecError as exc:
            raise SpecError(f"--plan {args.plan}: {exc}") from None
    elif args.allocation:
        from rubberband.plan import plan_allocation

        if req.spec.target_stage is not None and req.target_models is None:
            exp.job_models()          # one line naming surrogate.model_profile
        tuning = exp.surrogate_model if exp.surrogate_model is not None and req.target_models is not None \
            else exp.model     # a surrogate job's tuning stages run by the surrogate's profile (§4.6)
        plan = plan_allocation(req.spec, int_list(args.allocation, "--allocation"), tuning, req.cloud,
                               req.deadline_s or float("inf"), samples=req.samples, seed=req.seed,
                               fused_per_gpu=fusion, target_model=req.target_models)
    else:
        # With --budget, plan for it as `plan --budget` does (below the cheapest plan: its error).
        plan = plan_from_args(args, req)
    print_warnings(plan, req)
    if not args.json:
        print(plan_table(plan))
        print(summary_line(plan.predicted, plan.deadline_s))
        print()
    budget = None
    if args.budget is not None:
        from rubberband.scheduler.safety import check_budget

        # The scheduler's lower bound: a guard for --plan and --allocation, which plan nothing.
        budget = check_budget(args.budget, exp.spec, plan_model(exp, plan), plan.cloud, target_model=target_plan_model(exp, plan))
    if wants_rehearsal(args):
        return rehearse_cmd(args, exp, plan, budget)
    if not args.json and sys.stderr.isatty():     # the cluster's start (Ray's head, the autoscaler) takes seconds
        print(f"starting a {args.provider} cluster for {plan.instance_type} x{max(plan.instances)} at most; "
              "the run's events follow once it is up", file=sys.stderr, flush=True)
    loop_model = plan_model(exp, plan)
    from rubberband.executor.search_space import Search

    trainer: Any = exp.trainer
    ratio = exp.surrogate.width_ratio if exp.surrogate and req.spec.target_stage is not None else None
    if ratio is not None:       # a surrogate job (DESIGN §4.6): tuned at width / S, its winner trained at full width
        from rubberband.surrogate import SurrogateJob

        trainer = SurrogateJob(exp.trainer, ratio)
    result = execute(plan, trainer, Search.of(exp.search_space, exp.search), provider=args.provider, metric=exp.metric, mode=exp.mode,
                     seed=req.seed, runs_dir=args.runs_dir,
                     latency_scale=1.0 if args.latency_scale is None else args.latency_scale,
                     on_event=None if args.json else progress_printer(),
                     cluster_config=cluster, launch_attempts=args.launch_attempts, launch_backoff_s=backoff,
                     spot_emulation=args.spot_emulation,
                     # The closed loop needs a deadline to keep: with none, the plan is followed as it is.
                     replan_with=None if args.no_replan or not math.isfinite(plan.deadline_s) else loop_model,
                     safety_net=None if args.no_safety_net else loop_model, budget_usd=budget,
                     max_failures=exp.max_failures, time_attr=exp.time_attr,
                     surrogate_ratio=ratio, target_model=target_plan_model(exp, plan))
    keep_model(result.run_dir, req.models, req.target_models)
    payload, text = result.to_dict(), run_summary(result)
    if args.gantt:
        text += "\n" + draw_run(result.run_dir, payload, args.gantt)
        payload["gantt"] = args.gantt
    emit(args, payload, text)
    return EXIT_BUDGET if result.loop.get("stopped") else 0


# Flags that only planning reads: with --plan (a plan made already) or --allocation (one given),
# each would be silently ignored, so each is refused (--budget stays: a run keeps it as a hard cap).
PLANNING_FLAGS = {
    "--plan": ("deadline", "policy", "samples", "market", "confidence", "instance_type", "allocation", "max_instances"),
    "--allocation": ("policy", "market", "confidence", "instance_type", "max_instances"),
}


def refuse_plan_conflicts(args: argparse.Namespace) -> None:
    """One line for a planning flag given with ``--plan`` or ``--allocation``, which plan nothing.

    Raises:
        SpecError: naming the flag, what it conflicts with, and the fix.
    """
    for given, dests in PLANNING_FLAGS.items():
        if getattr(args, given[2:]) is None:
            continue
        for dest in dests:
            if getattr(args, dest, None) is not None:
                flag = "--" + dest.replace("_", "-")
                raise SpecError(f"{flag}: only used when run plans the job, and {given} "
                                f"{'runs a plan made already' if given == '--plan' else 'gives the allocation'}; "
                                f"drop {flag}, or drop {given} and let run plan")


run_cmd.arguments = _run_args  # type: ignore[attr-defined]
command("run", "plan the job and run it for real, then report predicted vs actual")(run_cmd)
