"""What every subcommand shares: the command registry, output, and argument parsing helpers."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from rubberband.config import Experiment, load_experiment
from rubberband.errors import SpecError
from rubberband.schema import jsonable
from rubberband.units import format_duration, format_usd, parse_duration

# name -> (help, add_arguments, run); filled by the modules below via `command`.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def command(name: str, help: str):
    """Register a subcommand: decorate ``run(args) -> exit code`` whose ``.arguments`` adds options."""

    def wrap(run: Callable[[argparse.Namespace], int]):
        COMMANDS[name] = (help, getattr(run, "arguments", lambda p: None), run)
        return run

    return wrap


def emit(args: argparse.Namespace, payload: dict, text: str) -> None:
    """Print ``payload`` as JSON with ``--json``, else the human text."""
    if getattr(args, "json", False):
        print(json.dumps(payload, indent=2, default=jsonable))
    else:
        print(text)


def experiment_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", help="experiment YAML file")


def measured_args(p: argparse.ArgumentParser) -> None:
    """``--model-profile`` / ``--cloud-overrides``: plan with what `rubberband profile` measured."""
    p.add_argument("--model-profile", metavar="YAML",
                   help="model profile to use instead of the experiment's (e.g. runs/profiles/<name>.yaml from `profile`)")
    p.add_argument("--cloud-overrides", metavar="YAML",
                   help="cloud-profile overrides applied over the experiment's `cloud.overrides` "
                        "(e.g. runs/profiles/<name>.cloud.yaml from `profile`)")


def load_experiment_args(args: argparse.Namespace) -> Experiment:
    """The experiment named on the command line, with the measured files of ``measured_args``."""
    return load_experiment(args.experiment, model_profile=args.model_profile, cloud_overrides=args.cloud_overrides)


def int_list(text: str, field: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SpecError(f"{field}: expected comma-separated whole numbers such as 32,20,12,8, got {text!r}") from None
    if not values:
        raise SpecError(f"{field}: expected comma-separated whole numbers such as 32,20,12,8")
    return values


def deadline_arg(args: argparse.Namespace, exp: Experiment) -> float | None:
    if getattr(args, "deadline", None):
        return parse_duration(args.deadline, "--deadline")
    return exp.deadline_s


def cloud_for_args(exp: Experiment, instance_type: str | None):
    name = instance_type or exp.instance_type
    if name == "auto":
        raise SpecError("--instance-type: `auto` is for `plan`; name one instance type to simulate")
    return exp.cloud_for(name)


def summary_line(result, deadline: float | None) -> str:
    line = (f"JCT  mean {format_duration(result.mean_jct_s)}  p50 {format_duration(result.p50_jct_s)}  "
            f"p90 {format_duration(result.p90_jct_s)}\ncost mean {format_usd(result.mean_cost_usd)}  "
            f"p50 {format_usd(result.p50_cost_usd)}  p90 {format_usd(result.p90_cost_usd)}")
    if deadline:
        line += f"\nP(JCT <= {format_duration(deadline)}) = {result.p_meet(deadline):.1%}"
    return line


def floats(text: str, field: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SpecError(f"{field}: expected comma-separated numbers, got {text!r}") from None
