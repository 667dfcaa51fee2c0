"""`rubberband simulate`: predict the JCT and cost of one allocation."""

from __future__ import annotations

import argparse
import math

from rubberband.cli.common import (
    IMAGE_TYPES,
    command,
    emit,
    experiment_arg,
    int_list,
    measured_args,
    output_path,
    print_warnings,
    resolve_args,
    stage_cost_footnote,
    summary_line,
    whole,
)
from rubberband.errors import SpecError
from rubberband.profiles.cloud import CloudProfile
from rubberband.render import render
from rubberband.units import format_duration, format_usd

GANTT_RUNS = {"median": 0.5, "p90": 0.9, "worst": 1.0}     # --gantt-run: the run at this quantile of JCT


def _simulate_args(p: argparse.ArgumentParser) -> None:
    experiment_arg(p)
    measured_args(p)
    p.add_argument("--allocation", required=True, help="GPUs per stage, e.g. 32,20,12,8")
    p.add_argument("--instances", help="instances held per stage (default: the fewest that fit)")
    p.add_argument("--spot-instances", help="of those, spot instances per stage, e.g. 8,5,0,0 (default: all of them "
                                            "when the experiment's market is spot, else none)")
    p.add_argument("--trials-per-gpu", help="trials sharing one GPU per stage, e.g. 4,2,1,1 (default: 1, no packing; "
                                            "only stages of 1-GPU trials pack)")
    p.add_argument("--fused-per-gpu", help="trials fused into one program per GPU per stage, e.g. 16,4,1,1 (default: 1, "
                                           "no fusion; only stages of 1-GPU trials fuse, at the profile's "
                                           "fused_iter_latency_s; a stage packs or fuses, not both)")
    p.add_argument("--instance-type", help="instance type of the cloud profile (default: the experiment's)")
    p.add_argument("--instance-types", help="instance type per stage, e.g. p3.2xlarge,p3.2xlarge,p3.8xlarge,p3.16xlarge: "
                                            "a change of type releases every instance at the SYNC and launches anew")
    p.add_argument("--samples", type=whole, help="Monte-Carlo samples (default: the experiment's)")
    p.add_argument("--seed", type=whole, help="random seed (default: the experiment's)")
    p.add_argument("--deadline", help="report P(JCT <= deadline), e.g. 20m")
    p.add_argument("--gantt", metavar="PNG", help="draw one sampled timeline to this PNG file")
    p.add_argument("--gantt-run", choices=sorted(GANTT_RUNS),
                   help="which sampled run --gantt draws, by JCT: the median (default), the p90 run (a slow "
                        "one: on spot, where the reclaims show), or the worst")


def simulate_cmd(args: argparse.Namespace) -> int:
    from rubberband.simulator import simulate

    output_path(args.gantt, "--gantt", "run.png", IMAGE_TYPES)
    if args.gantt_run and not args.gantt:
        raise SpecError("--gantt-run: it picks the run --gantt draws; add --gantt PNG")
    run = args.gantt_run or "median"
    types = _instance_types(args.instance_types) if args.instance_types else None
    if types and args.instance_type:
        raise SpecError("--instance-types: give either --instance-type (one type) or --instance-types (one per stage)")
    allocation = int_list(args.allocation, "--allocation")
    instances = int_list(args.instances, "--instances") if args.instances else None
    spot = int_list(args.spot_instances, "--spot-instances") if args.spot_instances else None
    packing = int_list(args.trials_per_gpu, "--trials-per-gpu") if args.trials_per_gpu else None
    fusion = int_list(args.fused_per_gpu, "--fused-per-gpu") if args.fused_per_gpu else None
    req = resolve_args(args, allocation=tuple(allocation), instances=tuple(instances) if instances else None,
                       trials_per_gpu=tuple(packing) if packing else None,
                       fused_per_gpu=tuple(fusion) if fusion else None,
                       instance_type=types[0] if types else args.instance_type)
    print_warnings(req)
    exp, deadline, samples, seed = req.experiment, req.deadline_s, req.samples, req.seed
    if req.auto_instance_type:
        raise SpecError("--instance-type: `auto` is for `plan`; name one instance type to simulate")
    cloud: CloudProfile | dict[str, CloudProfile]
    if types:
        cloud = {t: req.cloud_for(t) for t in types}
        first = cloud[types[0]]
    else:
        cloud = first = req.cloud
    # One profile per GPU model, when the experiment has several: each stage runs by its type's.
    model = req.models
    result = simulate(exp.spec, allocation, model, cloud, samples=samples, seed=seed, instances=instances,
                      spot_instances=spot, trials_per_gpu=packing, instance_types=types, fused_per_gpu=fusion,
                      target_model=req.target_models)
    on_spot = any(s.spot_instances for s in result.stages)
    packed = any(k > 1 for k in result.trials_per_gpu)
    fused = any(f > 1 for f in result.fused_per_gpu)
    payload = {"experiment": exp.name, "instance_type": first.instance_type, **result.to_dict()}
    if deadline:
        payload["deadline_s"] = deadline
        payload["p_meet"] = result.p_meet(deadline)
    spot_columns = ["spot", "reclaims"] if on_spot else []
    on = ", ".join(dict.fromkeys(types)) if types else first.instance_type
    text = [render(
        ["stage", "trials", "iters", "GPUs", "GPUs/trial", *(["trials/GPU"] if packed else []),
         *(["fused/GPU"] if fused else []),
         *(["type"] if types else []), "instances", "new", *spot_columns, "mean time", "mean cost"],
        [[s.index, s.num_trials, s.iters, s.allocation, s.gpus_per_trial, *([s.trials_per_gpu] if packed else []),
          *([s.fused_per_gpu] if fused else []),
          *([s.instance_type] if types else []), s.instances, s.new_instances,
          *([s.spot_instances, f"{s.mean_reclaims:.2f}"] if on_spot else []),
          format_duration(s.mean_duration_s), format_usd(s.mean_cost_usd)] for s in result.stages],
        title=f"{exp.name} on {on} ({first.market.value}, {first.billing.model.value} billing), "
              f"{result.samples} samples, seed {seed}",
    ) + stage_cost_footnote(first, "mean cost"), ""]
    text.append(summary_line(result, deadline))
    if args.gantt:
        import numpy as np

        from rubberband.cli.gantt import draw_gantt
        from rubberband.simulator.trace import median_sample, sample_timeline

        # A run at a quantile of JCT, not sample 0: that one may sit anywhere in the distribution.
        q = GANTT_RUNS[run]
        k = median_sample(result.jct_s) if q == 0.5 else int(np.argsort(result.jct_s, kind="stable")[
            math.floor(q * (len(result.jct_s) - 1))])
        timeline = sample_timeline(exp.spec, allocation, model, cloud, seed=seed, samples=samples, sample=k,
                                   instances=instances, spot_instances=spot, trials_per_gpu=packing,
                                   instance_types=types, fused_per_gpu=fusion, target_model=req.target_models)
        title = gantt_title(exp.name, run, k, samples, seed, result, timeline.jct_s)
        draw_gantt(timeline, args.gantt, title=title, init_s=first.init_latency_s)
        text.append(f"wrote {args.gantt} (the {run} run)")
        payload["gantt"], payload["gantt_sample"], payload["gantt_run"] = args.gantt, k, run
        payload["gantt_title"] = title
        if on_spot:
            payload["gantt_reclaims"] = timeline.reclaims
    emit(args, payload, "\n".join(text))
    return 0


def gantt_title(name: str, run: str, k: int, samples: int, seed: int, result, jct_s: float) -> str:
    """The chart's title: its JCT is the table's (p50, p90 or the worst); the run drawn, the sample
    at that rank, is named beside it where it differs (between two samples the quantile is neither)."""
    quantile = {"median": result.p50_jct_s, "p90": result.p90_jct_s, "worst": float(max(result.jct_s))}[run]
    own = "" if format_duration(jct_s) == format_duration(quantile) else f"; this run {format_duration(jct_s)}"
    label = {"median": "p50", "p90": "p90", "worst": "worst"}[run]
    return f"{name}: the {run} run by JCT (sample {k} of {samples}, seed {seed}), JCT {label} {format_duration(quantile)}{own}"


def _instance_types(text: str) -> list[str]:
    """``--instance-types``: comma-separated type names, one per stage."""
    types = [t.strip() for t in text.split(",")]
    if not all(types):
        raise SpecError(f"--instance-types: expected comma-separated instance types such as "
                        f"p3.2xlarge,p3.8xlarge, got {text!r}")
    return types


simulate_cmd.arguments = _simulate_args  # type: ignore[attr-defined]
command("simulate", "predict JCT and cost of one allocation by Monte-Carlo simulation")(simulate_cmd)
