"""The `rubberband` command line: one subcommand per step of the pipeline."""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from collections.abc import Sequence

from rubberband.cli.common import COMMANDS
from rubberband.errors import RubberbandError, RubberbandWarning, SpecError

# The order of `rubberband --help`: the pipeline's, then the cluster housekeeping.
ORDER = ("validate", "plan", "simulate", "whatif", "profile", "run", "report", "status", "down")


class ArgumentError(SpecError):
    """A command line argparse cannot read: one ``error:`` line, exit 2, no usage dump."""


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line naming the option and the fix (see
    ``--help``), not the whole usage text: the options' own types say what was wrong."""

    def error(self, message: str):
        message = re.sub(r"^argument ([^:]+): ", lambda m: m.group(1).split("/")[-1] + ": ", message)
        message = message.replace("invalid choice: ", "unknown value ")
        raise ArgumentError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    from rubberband import __version__

    # Importing a command module registers its subcommand; the order here is the order in --help.
    from rubberband.cli import (  # noqa: F401
        cluster_cmd,
        plan_cmd,
        profile_cmd,
        report_cmd,
        run_cmd,
        simulate_cmd,
        validate_cmd,
        whatif_cmd,
    )

    parser = OneLineParser(
        prog="rubberband",
        description="Plan and run hyperparameter tuning jobs at the lowest cost that meets a deadline.",
    )
    parser.add_argument("--version", action="version", version=f"rubberband {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in sorted(COMMANDS, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER)):
        help_text, add_arguments, run = COMMANDS[name]
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="print machine-readable JSON instead of a table")
        # Also after the subcommand (`rubberband plan EXP --debug`); SUPPRESS keeps a --debug given before it.
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors")
        add_arguments(p)
        p.set_defaults(run=run)
    return parser


_python_showwarning = warnings.showwarning


def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Print rubberband's own warnings as one ``warning: ...`` line; others as Python does."""
    if issubclass(category, RubberbandWarning):
        print(f"warning: {message}", file=sys.stderr)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rubberband`` console script."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    warnings.showwarning = show_warning
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except ArgumentError as exc:
        # Options the subcommand does not know are found by the top parser: point at the subcommand's help.
        named = next((a for a in (argv if argv is not None else sys.argv[1:]) if a in COMMANDS), None)
        text = str(exc).replace("`rubberband --help`", f"`rubberband {named} --help`") if named else str(exc)
        print(f"error: {text}", file=sys.stderr)
        return 2
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except RubberbandError as exc:
        if args.debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `rubberband ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0
    except Exception as exc:  # a bug, not bad input: still one line, with a way to see more
        if args.debug:
            raise
        print(f"error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
