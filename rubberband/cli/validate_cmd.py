"""`rubberband validate`: check an experiment file and print the resolved job."""

from __future__ import annotations

import argparse

from rubberband.cli.common import command, emit, experiment_arg
from rubberband.config import Experiment, load_experiment
from rubberband.render import render
from rubberband.units import format_duration, format_usd


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


validate.arguments = experiment_arg  # type: ignore[attr-defined]
command("validate", "check an experiment file and print the resolved job")(validate)
