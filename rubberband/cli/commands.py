"""Subcommands: validate, simulate, plan, whatif (execution commands live with their issues)."""

from __future__ import annotations

import argparse

from rubberband.cli.main import command, emit
from rubberband.cli.table import render
from rubberband.config import Experiment, load_experiment
from rubberband.errors import ProviderError, SpecError
from rubberband.units import format_duration, format_usd, parse_duration


def _experiment_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", help="experiment YAML file")


def _int_list(text: str, field: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SpecError(f"{field}: expected comma-separated whole numbers such as 32,20,12,8, got {text!r}") from None
    if not values:
        raise SpecError(f"{field}: expected comma-separated whole numbers such as 32,20,12,8")
    return values


def _deadline(args: argparse.Namespace, exp: Experiment) -> float | None:
    if getattr(args, "deadline", None):
        return parse_duration(args.deadline, "--deadline")
    return exp.deadline_s


def stage_rows(exp: Experiment) -> list[list[object]]:
    rows, done = [], 0
    for i, stage in enumerate(exp.spec.stages):
        done += stage.iters
        rows.append([i, stage.num_trials, stage.iters, done])
    return rows


def validate(args: argparse.Namespace) -> int:
    exp = load_experiment(args.experiment)
    types = exp.catalog.instance_types if exp.auto_instance_type else [exp.instance_type]
    clouds = [exp.cloud_for(t) for t in types]
    payload = {
        "name": exp.name,
        "stages": [{"num_trials": s.num_trials, "iters": s.iters} for s in exp.spec.stages],
        "bracket_starts": list(exp.spec.bracket_starts),
        "model_profile": {"name": exp.model.name, "gpu_counts": list(exp.model.gpu_counts)},
        "cloud": [c.to_dict() for c in clouds],
        "instance_type": exp.instance_type,
        "deadline_s": exp.deadline_s,
        "policy": exp.policy,
        "trainer": exp.trainer,
        "search_space": exp.search_space,
        "metric": exp.metric,
        "mode": exp.mode,
    }
    lines = [f"experiment {exp.name}: OK ({exp.spec.describe()})", ""]
    lines.append(render(["stage", "trials", "iters", "iters so far"], stage_rows(exp)))
    lines.append("")
    lines.append(f"model profile  {exp.model.name} (GPUs per trial profiled: {', '.join(map(str, exp.model.gpu_counts))})")
    for c in clouds:
        spot = f", spot {format_usd(c.spot_price_usd_per_hour)}/h" if c.spot_price_usd_per_hour is not None else ""
        lines.append(
            f"instance type  {c.instance_type} in {c.provider}/{c.region}: {c.gpus_per_instance}x {c.gpu_model or 'GPU'}, "
            f"{format_usd(c.price_usd_per_hour)}/h on-demand{spot}, market {c.market.value}, billing {c.billing.model.value}"
        )
    if exp.deadline_s:
        lines.append(f"deadline       {format_duration(exp.deadline_s)} ({exp.deadline_s:.0f}s)")
    lines.append(f"policy         {exp.policy}")
    if exp.trainer:
        lines.append(f"trainer        {exp.trainer}  (metric {exp.metric}, mode {exp.mode})")
    if exp.search_space:
        lines.append(f"search space   {', '.join(exp.search_space)}")
    emit(args, payload, "\n".join(lines))
    return 0


validate.arguments = _experiment_arg  # type: ignore[attr-defined]
command("validate", "check an experiment file and print the resolved job")(validate)


def _simulate_args(p: argparse.ArgumentParser) -> None:
    _experiment_arg(p)
    p.add_argument("--allocation", required=True, help="GPUs per stage, e.g. 32,20,12,8")
    p.add_argument("--instances", help="instances held per stage (default: the fewest that fit)")
    p.add_argument("--instance-type", help="instance type of the cloud profile (default: the experiment's)")
    p.add_argument("--samples", type=int, help="Monte-Carlo samples (default: the experiment's)")
    p.add_argument("--seed", type=int, help="random seed (default: the experiment's)")
    p.add_argument("--deadline", help="report P(JCT <= deadline), e.g. 20m")
    p.add_argument("--gantt", metavar="PNG", help="draw one sampled timeline to this PNG file")


def _cloud(exp: Experiment, instance_type: str | None):
    name = instance_type or exp.instance_type
    if name == "auto":
        raise SpecError("--instance-type: `auto` is for `plan`; name one instance type to simulate")
    return exp.cloud_for(name)


def simulate_cmd(args: argparse.Namespace) -> int:
    from rubberband.simulate import simulate

    exp = load_experiment(args.experiment)
    cloud = _cloud(exp, args.instance_type)
    allocation = _int_list(args.allocation, "--allocation")
    instances = _int_list(args.instances, "--instances") if args.instances else None
    samples = args.samples if args.samples is not None else exp.samples
    seed = args.seed if args.seed is not None else exp.seed
    result = simulate(exp.spec, allocation, exp.model, cloud, samples=samples, seed=seed, instances=instances)
    deadline = _deadline(args, exp)
    payload = {"experiment": exp.name, "instance_type": cloud.instance_type, **result.to_dict()}
    if deadline:
        payload["deadline_s"] = deadline
        payload["p_meet"] = result.p_meet(deadline)
    text = [render(
        ["stage", "trials", "iters", "GPUs", "GPUs/trial", "instances", "new", "mean time", "mean cost"],
        [[s.index, s.num_trials, s.iters, s.allocation, s.gpus_per_trial, s.instances, s.new_instances,
          format_duration(s.mean_duration_s), format_usd(s.mean_cost_usd)] for s in result.stages],
        title=f"{exp.name} on {cloud.instance_type} ({cloud.market.value}, {cloud.billing.model.value} billing), "
              f"{result.samples} samples, seed {seed}",
    ), ""]
    text.append(summary_line(result, deadline))
    if args.gantt:
        from rubberband.cli.gantt import draw_gantt
        from rubberband.simulate.trace import sample_timeline

        draw_gantt(sample_timeline(exp.spec, allocation, exp.model, cloud, seed=seed, instances=instances), args.gantt)
        text.append(f"wrote {args.gantt}")
        payload["gantt"] = args.gantt
    emit(args, payload, "\n".join(text))
    return 0


def summary_line(result, deadline: float | None) -> str:
    line = (f"JCT  mean {format_duration(result.mean_jct_s)}  p50 {format_duration(result.p50_jct_s)}  "
            f"p90 {format_duration(result.p90_jct_s)}\ncost mean {format_usd(result.mean_cost_usd)}  "
            f"p50 {format_usd(result.p50_cost_usd)}  p90 {format_usd(result.p90_cost_usd)}")
    if deadline:
        line += f"\nP(JCT <= {format_duration(deadline)}) = {result.p_meet(deadline):.1%}"
    return line


simulate_cmd.arguments = _simulate_args  # type: ignore[attr-defined]
command("simulate", "predict JCT and cost of one allocation by Monte-Carlo simulation")(simulate_cmd)


# --- plan ---------------------------------------------------------------------------------------
def _plan_args(p: argparse.ArgumentParser) -> None:
    _experiment_arg(p)
    p.add_argument("--deadline", help="deadline, e.g. 20m, 90s, 1.5h (default: the experiment's)")
    p.add_argument("--policy", help="optimal (default), greedy, static or naive-elastic")
    p.add_argument("--confidence", type=float, help="require P(JCT <= deadline) >= this, e.g. 0.9")
    p.add_argument("--instance-type", help="an instance type of the cloud profile, or `auto` for the cheapest")
    p.add_argument("--market", choices=["on-demand", "spot"], help="purchasing option (default: the experiment's)")
    p.add_argument("--samples", type=int, help="Monte-Carlo samples (default: the experiment's)")
    p.add_argument("--seed", type=int, help="random seed (default: the experiment's)")
    p.add_argument("--out", metavar="PLAN_JSON", help="write the plan as JSON to this file")


def plan_from_args(args: argparse.Namespace, exp: Experiment):
    """Plan an experiment with the CLI's overrides; compare every policy."""
    from rubberband.plan import compile_plan
    from rubberband.profiles.cloud import Market

    deadline = _deadline(args, exp)
    if deadline is None:
        raise SpecError("deadline: the experiment has no `deadline:`; pass --deadline, e.g. --deadline 20m")
    instance_type = getattr(args, "instance_type", None) or exp.instance_type
    market = Market(args.market) if getattr(args, "market", None) else exp.market
    if market is not exp.market:
        from dataclasses import replace

        exp = replace(exp, market=market)
    cloud = exp.catalog.with_overrides(exp.cloud_overrides) if instance_type == "auto" else exp.cloud_for(instance_type)
    confidence = args.confidence if getattr(args, "confidence", None) is not None else exp.confidence
    return compile_plan(
        exp.spec, exp.model, cloud, deadline, policy=getattr(args, "policy", None) or exp.policy,
        samples=getattr(args, "samples", None) or exp.samples, seed=args.seed if getattr(args, "seed", None) is not None else exp.seed,
        confidence=confidence, instance_type=instance_type if instance_type == "auto" else None,
        market=market, compare=True,
    )


def plan_table(plan) -> str:
    from rubberband.simulate import instances_needed

    p = plan.predicted

    def held(s) -> str:
        # A stage may hold more instances than its trials need, for a later stage.
        idle = s.instances - instances_needed(s.num_trials, s.allocation, plan.cloud.gpus_per_instance)
        return f"{s.instances} ({idle} held idle)" if idle > 0 else str(s.instances)

    return render(
        ["stage", "trials", "iters", "GPUs/trial", "GPUs", "instances", "mean time", "stage cost"],
        [[s.index, s.num_trials, s.iters, s.gpus_per_trial, s.allocation, held(s),
          format_duration(s.mean_duration_s), format_usd(s.mean_cost_usd)] for s in p.stages],
        title=f"plan ({plan.policy}) on {plan.instance_type} x{max(plan.instances)} at most, "
              f"{plan.cloud.market.value} {format_usd(plan.cloud.hourly_usd)}/h, deadline {format_duration(plan.deadline_s)}"
              + (f", P(meet) >= {plan.confidence:g}" if plan.confidence else ""),
    )


def considered_table(plan) -> str:
    chosen = plan.predicted.mean_cost_usd
    rows = []
    for c in plan.considered:
        if "infeasible" in c:
            rows.append([c["policy"], c["instance_type"], "-", "infeasible", "-", "-", "-", "-", ""])
            continue
        mark = "*" if (c["policy"] == plan.policy and c["instance_type"] == plan.instance_type) else ""
        rows.append([c["policy"], c["instance_type"], max(c["instances"]), format_duration(c["jct_s_mean"]),
                     format_duration(c["jct_s_p90"]), format_usd(c["cost_usd_mean"]), format_usd(c["cost_usd_p90"]),
                     f"{c['p_meet']:.0%}", f"{c['cost_usd_mean'] / chosen:.2f}x" + (" " + mark if mark else "")])
    return render(["policy", "instance type", "max inst", "JCT mean", "JCT p90", "cost mean", "cost p90",
                   "P(meet)", "cost vs chosen"], rows, title="considered plans (* chosen)")


def plan_cmd(args: argparse.Namespace) -> int:
    exp = load_experiment(args.experiment)
    plan = plan_from_args(args, exp)
    text = [plan_table(plan), "", summary_line(plan.predicted, plan.deadline_s), "", considered_table(plan)]
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(plan.to_json())
        text.append(f"\nwrote {args.out}")
    payload = plan.to_dict()
    payload["predicted"].pop("jct_s")
    payload["predicted"].pop("cost_usd")
    emit(args, {"experiment": exp.name, **payload}, "\n".join(text))
    return 0


plan_cmd.arguments = _plan_args  # type: ignore[attr-defined]
command("plan", "find the cheapest plan that meets the deadline, and compare every policy")(plan_cmd)


# --- whatif -------------------------------------------------------------------------------------
def _whatif_args(p: argparse.ArgumentParser) -> None:
    _experiment_arg(p)
    p.add_argument("--deadline", help="deadline or sweep START:STOP:STEP, e.g. 90m:160m:10m")
    p.add_argument("--trials", help="numbers of trials to sweep, e.g. 32,64,128 (SHA experiments)")
    p.add_argument("--init-latency", help="instance initialisation latencies to sweep, e.g. 1s,10s,100s")
    p.add_argument("--billing", help="billing models to sweep: per_instance,per_function")
    p.add_argument("--data-price", help="data prices in USD/GB to sweep, e.g. 0,0.01,0.16")
    p.add_argument("--dataset-gb", help="dataset sizes in GB to sweep, e.g. 0.15,150")
    p.add_argument("--instance-type", help="instance types to sweep, e.g. p3.2xlarge,p3.8xlarge")
    p.add_argument("--straggler-std", help="std of seconds per iteration to sweep, e.g. 1,5,10")
    p.add_argument("--policies", help="policies to compare (default: all)")
    p.add_argument("--samples", type=int, help="Monte-Carlo samples (default: 200)")
    p.add_argument("--seed", type=int, help="random seed (default: the experiment's)")
    p.add_argument("--plot", metavar="PNG", help="plot cost per policy over the first swept axis")


def _floats(text: str, field: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SpecError(f"{field}: expected comma-separated numbers, got {text!r}") from None


def whatif_cmd(args: argparse.Namespace) -> int:
    from rubberband.plan import POLICIES, saving, whatif
    from rubberband.units import parse_range

    exp = load_experiment(args.experiment)
    vary: dict[str, list] = {}
    deadline = exp.deadline_s
    if args.deadline:
        values = parse_range(args.deadline, "--deadline")
        if len(values) == 1:
            deadline = values[0]
        else:
            vary["deadline_s"] = values
    if args.trials:
        vary["num_trials"] = _int_list(args.trials, "--trials")
    if args.init_latency:
        vary["init_latency_s"] = [parse_duration(v, "--init-latency") if v.strip() not in ("0", "0s") else 0.0
                                  for v in args.init_latency.split(",")]
    if args.billing:
        vary["billing"] = [v.strip() for v in args.billing.split(",")]
        for v in vary["billing"]:
            if v not in ("per_instance", "per_function"):
                raise SpecError(f"--billing: unknown billing model {v!r}; choose per_instance or per_function")
    if args.data_price:
        vary["data_price_usd_per_gb"] = _floats(args.data_price, "--data-price")
    if args.dataset_gb:
        vary["dataset_gb"] = _floats(args.dataset_gb, "--dataset-gb")
    if args.instance_type:
        vary["instance_type"] = [v.strip() for v in args.instance_type.split(",")]
        for v in vary["instance_type"]:
            exp.cloud_for(v)
    if args.straggler_std:
        vary["straggler_std"] = _floats(args.straggler_std, "--straggler-std")
    if not vary:
        raise SpecError("whatif: nothing to sweep; pass e.g. --deadline 90m:160m:10m or --init-latency 1s,10s,100s")
    if deadline is None:
        raise SpecError("deadline: the experiment has no `deadline:`; pass --deadline")
    policies = [p.strip() for p in args.policies.split(",")] if args.policies else list(POLICIES)
    base_type = exp.catalog.instance_types[0] if exp.auto_instance_type else exp.instance_type
    scenarios = whatif(exp.spec, exp.model, exp.cloud_for(base_type), deadline, vary, policies,
                       samples=args.samples or 200, seed=args.seed if args.seed is not None else exp.seed,
                       spec_for_trials=exp.spec_with_trials if exp.sha else None, cloud_for_type=exp.cloud_for)
    axes = list(vary)
    rows = []
    for sc in scenarios:
        cells = [_fmt_axis(a, sc.values[a]) for a in axes]
        cells += [format_usd(sc.costs[p]) if sc.costs[p] is not None else "infeasible" for p in policies]
        ratio = saving(sc) if "static" in policies and "optimal" in policies else None
        cells.append(f"{ratio:.2f}x" if ratio else "-")
        rows.append(cells)
    text = render(axes + [f"{p} cost" for p in policies] + ["static/optimal"], rows,
                  title=f"what if: {exp.name} (mean cost of the cheapest plan per policy, deadline {format_duration(deadline)} unless swept)")
    payload = {"experiment": exp.name, "axes": axes, "policies": policies, "scenarios": [s.to_dict() for s in scenarios]}
    if args.plot:
        plot_whatif(scenarios, axes[0], policies, args.plot, title=exp.name)
        text += f"\nwrote {args.plot}"
        payload["plot"] = args.plot
    emit(args, payload, text)
    return 0


def _fmt_axis(axis: str, value) -> str:
    if axis in ("deadline_s", "init_latency_s"):
        return format_duration(float(value))
    return str(value)


def plot_whatif(scenarios, axis: str, policies, path: str, title: str = "") -> None:
    """Cost per policy over one swept axis, as a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecError("--plot: needs matplotlib; install it with `pip install 'rubberband[plot]'`") from None
    xs = [s.values[axis] for s in scenarios]
    numeric = all(isinstance(x, (int, float)) for x in xs)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for p in policies:
        ys = [s.costs[p] if s.costs[p] is not None else float("nan") for s in scenarios]
        xv = [x / 60 if axis == "deadline_s" else x for x in xs] if numeric else list(range(len(xs)))
        ax.plot(xv, ys, marker="o", label=p)
    if not numeric:
        ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_xlabel("deadline (min)" if axis == "deadline_s" else axis)
    ax.set_ylabel("mean cost (USD)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


whatif_cmd.arguments = _whatif_args  # type: ignore[attr-defined]
command("whatif", "sweep deadline, trials, latency, billing, data price or instance type and compare policies")(whatif_cmd)


# --- run / down ---------------------------------------------------------------------------------
def _run_args(p: argparse.ArgumentParser) -> None:
    _experiment_arg(p)
    p.add_argument("--provider", default="local", help="where to run: local (default) or aws")
    p.add_argument("--cluster", metavar="CLUSTER_YAML",
                   help="aws: Ray cluster YAML (region, node type, AMI, subnets, ...); default: the experiment's `cluster:`")
    p.add_argument("--deadline", help="deadline, e.g. 2m (default: the experiment's)")
    p.add_argument("--policy", help="planning policy (default: the experiment's)")
    p.add_argument("--plan", metavar="PLAN_JSON", help="run this plan (from `plan --out`) instead of planning")
    p.add_argument("--allocation", help="run this allocation (GPUs per stage, e.g. 8,4,2) instead of planning")
    p.add_argument("--seed", type=int, help="random seed (default: the experiment's)")
    p.add_argument("--samples", type=int, help="Monte-Carlo samples for planning")
    p.add_argument("--runs-dir", default="runs", help="where runs write checkpoints, ledger and result.json")
    p.add_argument("--latency-scale", type=float, default=1.0,
                   help="scale the emulated provisioning latency (local; aws against an emulator)")
    p.add_argument("--launch-attempts", type=int, default=6, help="aws: attempts per instance on capacity errors")
    p.add_argument("--launch-backoff", default="2s", help="aws: first wait between attempts (doubles each time)")


def run_cmd(args: argparse.Namespace) -> int:
    import signal

    from rubberband.execute.run import _raise_interrupt, execute, progress_printer
    from rubberband.plan.plan import Plan

    signal.signal(signal.SIGTERM, _raise_interrupt)   # SIGTERM cleans up like Ctrl-C

    exp = load_experiment(args.experiment)
    if not exp.trainer:
        raise SpecError("trainer: the experiment names no trainer; add `trainer: package.module:Name`")
    if args.provider not in ("local", "aws"):
        raise SpecError(f"--provider: unknown provider {args.provider!r}; choose local or aws")
    cluster = args.cluster or exp.cluster
    if args.provider == "aws" and not cluster:
        raise SpecError("--cluster: the aws provider needs a Ray cluster YAML; pass --cluster PATH or set `cluster:` in the experiment")
    if args.launch_attempts < 1:
        raise SpecError(f"--launch-attempts: must be at least 1, got {args.launch_attempts}")
    backoff = parse_duration(args.launch_backoff, "--launch-backoff")
    if args.plan:
        try:
            plan = Plan.from_json(open(args.plan).read())
        except (OSError, ValueError, KeyError) as exc:
            raise SpecError(f"--plan: cannot read a plan from {args.plan!r}: {exc}") from None
    elif args.allocation:
        from rubberband.plan import plan_allocation

        plan = plan_allocation(exp.spec, _int_list(args.allocation, "--allocation"), exp.model, exp.cloud,
                               _deadline(args, exp) or float("inf"), samples=args.samples or exp.samples, seed=exp.seed)
    else:
        args.instance_type = args.market = args.confidence = None
        plan = plan_from_args(args, exp)
    if not args.json:
        print(plan_table(plan))
        print(summary_line(plan.predicted, plan.deadline_s))
        print()
    result = execute(plan, exp.trainer, exp.search_space, provider=args.provider, metric=exp.metric, mode=exp.mode,
                     seed=args.seed if args.seed is not None else exp.seed, runs_dir=args.runs_dir,
                     latency_scale=args.latency_scale, on_event=None if args.json else progress_printer(),
                     cluster_config=cluster if args.provider == "aws" else None,
                     launch_attempts=args.launch_attempts, launch_backoff_s=backoff)
    emit(args, result.to_dict(), result.table() + f"\nrun directory: {result.run_dir}")
    return 0


run_cmd.arguments = _run_args  # type: ignore[attr-defined]
command("run", "plan the job and run it for real, then report predicted vs actual")(run_cmd)


def _down_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--provider", default="local", help="local (default) or aws")
    p.add_argument("--run-id", help="only this run (default: every run rubberband started)")
    _aws_where_args(p)


def _aws_where_args(p: argparse.ArgumentParser) -> None:
    """Where `down` and `status` look for instances, besides the regions runs recorded."""
    p.add_argument("--region", action="append", default=[], help="aws: also look in this region (repeatable)")
    p.add_argument("--cluster", action="append", default=[], metavar="CLUSTER_YAML",
                   help="aws: also look in this cluster YAML's region (repeatable)")


def _aws_instance_lines(instances: list[dict]) -> list[str]:
    rows = [[i["instance_id"], i["region"], i["instance_type"], i["market"], i["state"], i["run_id"] or "-",
             _hms(i["uptime_s"]), f"${i['price_usd_per_hour']:.4f}/h",
             f"${i['cost_usd']:.4f}" if i["cost_usd"] is not None else "?"] for i in instances]
    return render(["instance", "region", "type", "market", "state", "run", "up", "price", "cost so far"], rows).splitlines()


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def down_cmd(args: argparse.Namespace) -> int:
    if args.provider not in ("local", "aws"):
        raise SpecError(f"--provider: unknown provider {args.provider!r}; choose local or aws")
    if args.provider == "local":
        from rubberband.providers.local import down_all

        stopped = down_all("local", args.run_id)
        text = "\n".join(f"stopped local cluster {s['run_id']} ({s['processes']} processes)" for s in stopped) or "nothing to stop"
        emit(args, {"provider": args.provider, "stopped": stopped}, text)
        return 0
    from rubberband.providers import aws_cluster

    out = _aws_call(lambda: aws_cluster.down(args.region, args.run_id, args.cluster))
    lines = [f"stopped the head of aws run {h['run_id']} ({h['processes']} processes)" for h in out["heads"]]
    if out["terminated"]:
        lines.append(f"terminated {len(out['terminated'])} instance(s) in {', '.join(out['regions'])}:")
        lines += _aws_instance_lines(out["terminated"])
        lines.append(f"spend stopped: ${out['stopped_usd_per_hour']:.4f}/h (these instances had cost ${out['spent_usd']:.4f})")
    else:
        lines.append(f"no running rubberband instances in {', '.join(out['regions'])}")
    emit(args, {"provider": "aws", **out}, "\n".join(lines))
    return 0


def _aws_call(fn):
    """Run an EC2 query; turn a missing credential or an AWS error into one line."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise SpecError("--provider aws: boto3 is not installed; pip install 'rubberband[aws]'") from None
    from rubberband.providers.aws import safe_error

    try:
        return fn()
    except (BotoCoreError, ClientError) as exc:
        raise ProviderError(f"aws: {safe_error(exc)}") from None


down_cmd.arguments = _down_args  # type: ignore[attr-defined]
command("down", "stop every cluster and instance rubberband started")(down_cmd)


def _status_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--provider", default="all", help="local, aws or all (default)")
    p.add_argument("--run-id", help="only this run")
    _aws_where_args(p)


def status_cmd(args: argparse.Namespace) -> int:
    if args.provider not in ("local", "aws", "all"):
        raise SpecError(f"--provider: unknown provider {args.provider!r}; choose local, aws or all")
    out: dict = {}
    lines = []
    if args.provider in ("local", "all"):
        from rubberband.providers.local import LocalCluster

        clusters = [{"run_id": c.run_id, "provider": c.provider, "processes": len(c.processes()), "run_dir": str(c.run_dir)}
                    for c in LocalCluster.known() if args.run_id is None or c.run_id == args.run_id]
        out["clusters"] = clusters
        lines += [f"cluster head of {c['provider']} run {c['run_id']}: {c['processes']} processes ({c['run_dir']})"
                  for c in clusters] or ["no rubberband cluster heads on this machine"]
    if args.provider in ("aws", "all"):
        from rubberband.providers import aws_cluster

        regions = aws_cluster.known_regions(args.region + [aws_cluster._region_of(p) for p in args.cluster])
        if not regions and args.provider == "all":
            lines.append("aws: no region known (pass --region or --cluster, or set AWS_DEFAULT_REGION)")
        else:
            try:
                aws = _aws_call(lambda: aws_cluster.status(args.region, args.run_id, args.cluster))
            except ProviderError as exc:
                if args.provider == "aws":
                    raise
                # `status` with no provider named still shows the local side.
                lines.append(str(exc))
                emit(args, {**out, "aws_error": str(exc)}, "\n".join(lines))
                return 0
            out["aws"] = aws
            if aws["instances"]:
                lines += _aws_instance_lines(aws["instances"])
                lines.append(f"{len(aws['instances'])} instance(s) running: ${aws['usd_per_hour']:.4f}/h, "
                             f"${aws['spent_usd']:.4f} so far")
            else:
                lines.append(f"no running rubberband instances in {', '.join(aws['regions'])}")
    emit(args, out, "\n".join(lines))
    return 0


status_cmd.arguments = _status_args  # type: ignore[attr-defined]
command("status", "list running rubberband clusters and instances, with their cost so far")(status_cmd)


from rubberband.cli import profile_cmd  # noqa: E402,F401  registers `rubberband profile`
