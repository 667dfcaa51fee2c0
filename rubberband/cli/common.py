"""What every subcommand shares: the command registry, output, and argument parsing helpers."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from rubberband.errors import SpecError
from rubberband.plan.show import stage_cost_footnote, summary_line  # noqa: F401 - the commands' shared text
from rubberband.request import Overrides, Request, resolve
from rubberband.schema import jsonable

# name -> (help, add_arguments, run); filled by the modules below via `command`.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def command(name: str, help: str):
    """Register a subcommand: decorate ``run(args) -> exit code`` whose ``.arguments`` adds options."""

    def wrap(run: Callable[[argparse.Namespace], int]):
        @functools.wraps(run)
        def checked(args: argparse.Namespace) -> int:
            check_options(args)
            return run(args)

        COMMANDS[name] = (help, getattr(run, "arguments", lambda p: None), checked)
        return run

    return wrap


def check_options(args: argparse.Namespace) -> None:
    """Reject option values that no command can use, before any work starts.

    An empty value (``--deadline ""``) would otherwise read as "not given" and fall back to
    the experiment's; ``--samples`` and ``--seed`` mean the same in every command.

    Raises:
        SpecError: naming the option.
    """
    if getattr(args, "provider", None) is not None:      # an unknown provider is named before anything else
        from rubberband.providers import base as providers

        providers.get(args.provider, "--provider")
    for dest, value in vars(args).items():
        if isinstance(value, str) and not value.strip():
            flag = dest if dest == "experiment" else "--" + dest.replace("_", "-")
            raise SpecError(f"{flag}: is empty; give a value or leave the option out")
    samples = getattr(args, "samples", None)
    if samples is not None and samples < 1:
        raise SpecError(f"--samples: expected a positive integer, got {samples}")
    seed = getattr(args, "seed", None)
    if seed is not None and seed < 0:
        raise SpecError(f"--seed: expected a whole number >= 0, got {seed}")


# The figure files matplotlib writes, by extension: `--gantt` and `--plot` take any of them.
IMAGE_TYPES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")


def output_path(path: str | None, field: str, example: str, types: tuple[str, ...] | None = None) -> str | None:
    """Check that a file can be written at ``path`` (if given), before any work is done.

    Raises:
        SpecError: naming ``field`` when ``path`` is a directory, its directory is missing or
            not writable, or (with ``types``) its extension is none of them.
    """
    if path is None:
        return None
    if os.path.isdir(path):
        raise SpecError(f"{field}: {path!r} is a directory; name a file in it, e.g. {os.path.join(path, example)}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise SpecError(f"{field}: directory {folder!r} does not exist; create it or write elsewhere")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise SpecError(f"{field}: cannot write {path!r} (permission denied)")
    if types is not None and os.path.splitext(path)[1].lower() not in types:
        raise SpecError(f"{field}: {path!r} is no image file; name one ending in {', '.join(types)}, e.g. {example}")
    return path


def emit(args: argparse.Namespace, payload: dict, text: str) -> None:
    """Print ``payload`` as JSON with ``--json``, else the human text."""
    if getattr(args, "json", False):
        print(json.dumps(payload, indent=2, default=jsonable))
    else:
        print(text)


# Option types: argparse reports their message as ``--flag: message`` (``main.OneLineParser``).
def whole(text: str) -> int:
    """A whole number (``--samples 200``)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number such as 200, got {text!r}") from None


def decimal(text: str) -> float:
    """A plain number (``--latency-scale 0.5``)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 0.5, got {text!r}") from None


def probability(text: str) -> float:
    """``--confidence``: a probability, 0.9 (not 90%)."""
    try:
        return float(text)
    except ValueError:
        pct = text.strip().endswith("%")
        raise argparse.ArgumentTypeError(
            f"expected a probability between 0 and 1 such as 0.9, got {text!r}"
            + (f"; write {text.strip()[:-1].strip()}% as {float(text.strip()[:-1]) / 100:g}"
               if pct and _is_number(text.strip()[:-1]) else "")) from None


def dollars(text: str) -> float:
    """``--budget``: dollars as a plain number (15, not $15)."""
    try:
        return float(text)
    except ValueError:
        bare = text.strip().lstrip("$").replace(",", "").strip()
        hint = f"--budget {bare}" if _is_number(bare) else "--budget 15"
        raise argparse.ArgumentTypeError(f"expected an amount of dollars as a plain number, e.g. {hint}, "
                                         f"got {text!r}") from None


def market(text: str) -> str:
    """``--market``: on-demand, spot or auto."""
    from rubberband.schema import did_you_mean

    choices = ["on-demand", "spot", "auto"]
    if text not in choices:
        raise argparse.ArgumentTypeError(f"unknown value {text!r}{did_you_mean(text, choices)}; "
                                         f"choose one of {', '.join(choices)}")
    return text


def instance_counts(text: str) -> int | dict[str, int]:
    """``--max-instances``: one count for every instance type (``4``), or counts by type name
    (``p3.8xlarge=4,p3.2xlarge=8``; a type not named has no limit)."""
    example = "e.g. 4, or p3.8xlarge=4,p3.2xlarge=8"
    if "=" not in text:
        if not text.strip().isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"expected a positive number of instances, {example}; got {text!r}")
        return int(text)
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, count = part.partition("=")
        if not sep or not name.strip() or not count.strip().isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(f"expected TYPE=COUNT pairs with a positive COUNT, {example}; got {part!r}")
        out[name.strip()] = int(count)
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def experiment_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", help="experiment YAML file")


def measured_args(p: argparse.ArgumentParser) -> None:
    """``--model-profile`` / ``--cloud-overrides``: plan with what `rubberband profile` measured."""
    p.add_argument("--model-profile", metavar="YAML",
                   help="model profile to use instead of the experiment's (e.g. runs/profiles/<name>.yaml from `profile`)")
    p.add_argument("--cloud-overrides", metavar="YAML",
                   help="cloud-profile overrides applied over the experiment's `cloud.overrides` "
                        "(e.g. runs/profiles/<name>.cloud.yaml from `profile`)")


def max_instances_arg(p: argparse.ArgumentParser) -> None:
    """``--max-instances``: the most instances of a type any stage may hold (a quota, or the cores
    a local cluster really has), which the plan and every re-plan keep within."""
    p.add_argument("--max-instances", type=instance_counts, metavar="N|TYPE=N,...",
                   help="the most instances of a type any stage may hold, e.g. 4 (every type) or "
                        "p3.8xlarge=4,p3.2xlarge=8 (an account's quota, a cluster's max_workers); "
                        "the plan and its re-plans stay within it")


def resolve_args(args: argparse.Namespace, **extra) -> Request:
    """The experiment named on the command line, resolved with the command's flags (``extra``:
    values the command parsed itself, e.g. ``allocation``)."""
    return resolve(args.experiment, Overrides.of({**vars(args), **extra}))


def print_warnings(source, besides=None) -> None:
    """Print a request's (or a plan's) warnings as ``warning: ...`` lines on stderr, but those
    already printed from ``besides`` (the request a plan came from)."""
    done = set(besides.warnings) if besides is not None else set()
    for warning in dict.fromkeys(source.warnings):
        if warning not in done:
            print(f"warning: {warning}", file=sys.stderr)


def int_list(text: str, field: str, what: str = "whole numbers such as 32,20,12,8") -> list[int]:
    """``32,20,12,8`` -> ``[32, 20, 12, 8]``; anything else is one line naming ``field``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values:
        raise SpecError(f"{field}: expected comma-separated {what}, got {text!r}")
    return values


def floats(text: str, field: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SpecError(f"{field}: expected comma-separated numbers, got {text!r}") from None


class StatusLine:
    """One stderr line that overwrites itself (a long command's progress), shown only once the
    work has taken ``after_s``, redrawn at most every ``every_s`` unless forced; silent with
    ``--json`` or when the stream is not a terminal. Use as a context manager: the line is
    wiped at the end, so what follows prints on a clean screen."""

    def __init__(self, args: argparse.Namespace, after_s: float, every_s: float, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, tty: bool | None = None):
        self.stream = stream or sys.stderr
        self.on = not getattr(args, "json", False) and (self.stream.isatty() if tty is None else tty)
        self.clock, self.after_s, self.every_s = clock, after_s, every_s
        self.start = self.last = clock()
        self.width = 0

    def due(self, now: float, force: bool = False) -> bool:
        """Whether a line may be drawn at ``now`` (``force``: even sooner than ``every_s``)."""
        return self.on and now - self.start >= self.after_s and (
            not self.width or force or now - self.last >= self.every_s)

    def show(self, text: str, now: float) -> None:
        """Draw ``text`` over the previous line."""
        self.last = now
        self.stream.write("\r" + text.ljust(self.width))
        self.stream.flush()
        self.width = max(self.width, len(text))

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()


def runs_dir_default() -> str:
    """Where runs and profiles go unless ``--runs-dir`` says: ``$RUBBERBAND_RUNS_DIR``, else ``runs``."""
    return os.environ.get("RUBBERBAND_RUNS_DIR") or "runs"
