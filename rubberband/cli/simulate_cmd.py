"""`rubberband simulate`: predict the JCT and cost of one allocation."""

from __future__ import annotations

import argparse

from rubberband.cli.common import (
    cloud_for_args,
    command,
    deadline_arg,
    emit,
    experiment_arg,
    int_list,
    load_experiment_args,
    measured_args,
    output_path,
    stage_cost_footnote,
    summary_line,
)
from rubberband.render import render
from rubberband.units import format_duration, format_usd


def _simulate_args(p: argparse.ArgumentParser) -> None:
    experiment_arg(p)
    measured_args(p)
    p.add_argument("--allocation", required=True, help="GPUs per stage, e.g. 32,20,12,8")
    p.add_argument("--instances", help="instances held per stage (default: the fewest that fit)")
    p.add_argument("--spot-instances", help="of those, spot instances per stage, e.g. 8,5,0,0 (default: all of them "
                                            "when the experiment's market is spot, else none)")
    p.add_argument("--instance-type", help="instance type of the cloud profile (default: the experiment's)")
    p.add_argument("--samples", type=int, help="Monte-Carlo samples (default: the experiment's)")
    p.add_argument("--seed", type=int, help="random seed (default: the experiment's)")
    p.add_argument("--deadline", help="report P(JCT <= deadline), e.g. 20m")
    p.add_argument("--gantt", metavar="PNG", help="draw one sampled timeline to this PNG file")


def simulate_cmd(args: argparse.Namespace) -> int:
    from rubberband.simulator import simulate

    output_path(args.gantt, "--gantt", "run.png")
    exp = load_experiment_args(args)
    deadline = deadline_arg(args, exp)
    cloud = cloud_for_args(exp, args.instance_type)
    allocation = int_list(args.allocation, "--allocation")
    instances = int_list(args.instances, "--instances") if args.instances else None
    spot = int_list(args.spot_instances, "--spot-instances") if args.spot_instances else None
    samples = args.samples if args.samples is not None else exp.samples
    seed = args.seed if args.seed is not None else exp.seed
    result = simulate(exp.spec, allocation, exp.model, cloud, samples=samples, seed=seed, instances=instances,
                      spot_instances=spot)
    on_spot = any(s.spot_instances for s in result.stages)
    payload = {"experiment": exp.name, "instance_type": cloud.instance_type, **result.to_dict()}
    if deadline:
        payload["deadline_s"] = deadline
        payload["p_meet"] = result.p_meet(deadline)
    spot_columns = ["spot", "reclaims"] if on_spot else []
    text = [render(
        ["stage", "trials", "iters", "GPUs", "GPUs/trial", "instances", "new", *spot_columns, "mean time", "mean cost"],
        [[s.index, s.num_trials, s.iters, s.allocation, s.gpus_per_trial, s.instances, s.new_instances,
          *([s.spot_instances, f"{s.mean_reclaims:.2f}"] if on_spot else []),
          format_duration(s.mean_duration_s), format_usd(s.mean_cost_usd)] for s in result.stages],
        title=f"{exp.name} on {cloud.instance_type} ({cloud.market.value}, {cloud.billing.model.value} billing), "
              f"{result.samples} samples, seed {seed}",
    ) + stage_cost_footnote(cloud, "mean cost"), ""]
    text.append(summary_line(result, deadline))
    if args.gantt:
        from rubberband.cli.gantt import draw_gantt
        from rubberband.simulator.trace import median_sample, sample_timeline

        # The median run, not sample 0: that one may sit anywhere in the distribution.
        k = median_sample(result.jct_s)
        timeline = sample_timeline(exp.spec, allocation, exp.model, cloud, seed=seed, instances=instances,
                                   samples=samples, sample=k, spot_instances=spot)
        draw_gantt(timeline, args.gantt, title=f"{exp.name}: the median run by JCT (sample {k} of {samples}, "
                                               f"seed {seed}), JCT {format_duration(timeline.jct_s)}")
        text.append(f"wrote {args.gantt}")
        payload["gantt"], payload["gantt_sample"] = args.gantt, k
        if on_spot:
            payload["gantt_reclaims"] = timeline.reclaims
    emit(args, payload, "\n".join(text))
    return 0


simulate_cmd.arguments = _simulate_args  # type: ignore[attr-defined]
command("simulate", "predict JCT and cost of one allocation by Monte-Carlo simulation")(simulate_cmd)
