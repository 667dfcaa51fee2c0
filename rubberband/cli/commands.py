"""Subcommands: validate, simulate, plan, whatif (execution commands live with their issues)."""

from __future__ import annotations

import argparse

from rubberband.cli.main import command, emit
from rubberband.cli.table import render
from rubberband.config import Experiment, load_experiment
from rubberband.errors import SpecError
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
