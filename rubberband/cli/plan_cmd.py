"""`rubberband plan`: the cheapest plan that meets the deadline, next to every other policy."""

from __future__ import annotations

import argparse
import time

from rubberband.cli.common import (
    StatusLine,
    command,
    dollars,
    emit,
    experiment_arg,
    market,
    max_instances_arg,
    measured_args,
    output_path,
    print_warnings,
    probability,
    resolve_args,
    summary_line,
    whole,
)
from rubberband.errors import InfeasibleDeadlineError
from rubberband.plan.show import plan_table  # noqa: F401 - run prints it too
from rubberband.render import render
from rubberband.request import Request, plan_request
from rubberband.units import format_duration, format_usd


def _plan_args(p: argparse.ArgumentParser) -> None:
    experiment_arg(p)
    measured_args(p)
    p.add_argument("--deadline", help="deadline, e.g. 20m, 90s, 1.5h (default: the experiment's)")
    p.add_argument("--policy", help="optimal (default), greedy, static or naive-elastic")
    p.add_argument("--confidence", type=probability, help="require P(JCT <= deadline) >= this, e.g. 0.9")
    p.add_argument("--instance-type", help="an instance type of the cloud profile, or `auto` for the cheapest")
    p.add_argument("--market", type=market,
                   help="purchasing option; auto chooses spot or on-demand per stage (default: the experiment's)")
    p.add_argument("--samples", type=whole, help="Monte-Carlo samples (default: the experiment's)")
    p.add_argument("--seed", type=whole, help="random seed (default: the experiment's)")
    p.add_argument("--out", metavar="PLAN_JSON", help="write the plan as JSON to this file")
    p.add_argument("--zone", metavar="auto|Z1,Z2",
                   help="plan each Availability Zone's spot market (its trace) and keep the cheapest: auto for "
                        "every zone of the region, or a list (on spot, or the experiment's or --market's spot/auto)")
    max_instances_arg(p)
    p.add_argument("--budget", type=dollars, metavar="USD",
                   help="plan the shortest mean JCT whose mean cost stays within this many dollars (with "
                        "--confidence p: P(cost <= budget) >= p); an explicit --deadline must be met too")


# Planning that takes longer than this shows a progress line on a terminal.
PROGRESS_AFTER_S = 2.0
# At most this often: a progress line that redraws faster only costs time.
PROGRESS_EVERY_S = 0.1


class ProgressLine(StatusLine):
    """The planner's progress on one stderr line that overwrites itself ("planning: stage 3 of
    10, 1,204 candidates kept"), once planning has taken ``PROGRESS_AFTER_S``; silent with
    ``--json`` or when stderr is not a terminal. Use as a context manager: the line is wiped
    when planning ends, so the tables print on a clean screen."""

    def __init__(self, args: argparse.Namespace, clock=time.monotonic):
        super().__init__(args, PROGRESS_AFTER_S, PROGRESS_EVERY_S, clock=clock)
        self.step: tuple = ()
        self.where = ""     # where an outer loop is: "budget probe 3, zone us-west-2b (2 of 3)"

    def at(self, where: str) -> None:
        """Say which budget probe or zone the planning is at (shown before the search's step)."""
        self.where = where

    def __call__(self, p) -> None:
        now = self.clock()
        step = (self.where, p.step)     # a new step (or probe, or zone) always shows: the work it names may take long
        if not self.due(now, force=step != self.step):
            return
        self.step = step
        self.show(f"planning: {self.where + ', ' if self.where else ''}{p.describe()}", now)


def plan_from_args(args: argparse.Namespace, req: Request, confidence: float | None | str = "request",
                   compare: bool = True):
    """Plan the resolved request (``plan_request``) with a progress line on a terminal;
    ``confidence``, when given, replaces the request's."""
    with ProgressLine(args) as progress:
        return plan_request(req, confidence=confidence, compare=compare, progress=progress, step=progress.at)


# Below this chance of meeting the deadline, `plan` shows what a surer plan would cost.
LOW_P_MEET = 0.8
SURER_CONFIDENCE = 0.9


def confidence_note(args: argparse.Namespace, req: Request, plan) -> str | None:
    """One line when a mean-constrained plan often misses its deadline, with the cost of a surer one.

    The paper's constraint (mean JCT <= deadline) stays the default, but the cheapest plan
    under it lands its mean right at the deadline and so meets it only about half the time.
    """
    p_meet = plan.predicted.p_meet(plan.deadline_s)
    if plan.confidence is not None or p_meet >= LOW_P_MEET:
        return None
    head = f"note: this plan meets the {format_duration(plan.deadline_s)} deadline in only {p_meet:.0%} of samples"
    try:
        surer = plan_from_args(args, req, confidence=SURER_CONFIDENCE, compare=False)
    except InfeasibleDeadlineError:
        return f"{head}; no plan meets it with --confidence {SURER_CONFIDENCE:g}"
    cost = surer.predicted.mean_cost_usd
    return (f"{head}; --confidence {SURER_CONFIDENCE:g} would cost {format_usd(cost)} mean "
            f"({cost / plan.predicted.mean_cost_usd - 1:+.0%}), P(meet) {surer.predicted.p_meet(plan.deadline_s):.0%}")


def considered_table(plan) -> str:
    chosen = plan.predicted.mean_cost_usd
    with_market = any("market" in c for c in plan.considered)
    # The chosen row: the one marked chosen among markets weighed, else the chosen policy on the chosen type.
    by_market = any(str(c.get("market", "")).startswith("chosen") for c in plan.considered)
    rows = []
    for c in plan.considered:
        market = [c.get("market", "")] if with_market else []
        if "infeasible" in c:
            rows.append([c["policy"], c["instance_type"], *market, "-", "excluded" if c.get("excluded") else "infeasible",
                         "-", "-", "-", "-", ""])
            continue
        if by_market:
            mark = "*" if str(c.get("market", "")).startswith("chosen") else ""
        else:
            mark = "*" if (c["policy"].split(",")[0] == plan.policy
                           and c["instance_type"] == plan.summary()["instance_type"]) else ""
        packed = f" ({max(c['trials_per_gpu'])} per GPU)" if c.get("trials_per_gpu") else ""
        packed += f" ({max(c['fused_per_gpu'])} fused)" if c.get("fused_per_gpu") else ""
        rows.append([c["policy"], c["instance_type"] + packed, *market, c.get("peak_instances", max(c["instances"])), format_duration(c["jct_s_mean"]),
                     format_duration(c["jct_s_p90"]), format_usd(c["cost_usd_mean"]), format_usd(c["cost_usd_p90"]),
                     f"{c['p_meet']:.0%}", f"{c['cost_usd_mean'] / chosen:.2f}x" + (" " + mark if mark else "")])
    table = render(["policy", "instance type", *(["market"] if with_market else []), "max inst", "JCT mean", "JCT p90",
                    "cost mean", "cost p90", "P(meet)", "cost vs chosen"], rows, title="considered plans (* chosen)")
    for c in plan.considered:      # a type `auto` planned under a rule, not one that cannot make it
        if c.get("excluded"):
            table += (f"\nexcluded {c['instance_type']}: {c['excluded']}, and none meets the deadline; "
                      f"--instance-type {c['instance_type']} plans wider trials anyway (with a warning)")
    skipped = plan.info.get("skipped") or {}
    if skipped:     # `auto` names the types it never planned on, and why (grouped: a catalog has dozens)
        by_reason: dict[str, list[str]] = {}
        for name, why in skipped.items():
            by_reason.setdefault(why, []).append(name)
        table += "\nskipped types: " + "; ".join(
            f"{why}: {', '.join(names[:2])}" + (f" and {len(names) - 2} more" if len(names) > 2 else "")
            for why, names in by_reason.items())
    return table


def plan_cmd(args: argparse.Namespace) -> int:
    output_path(args.out, "--out", "plan.json")
    req = resolve_args(args)
    print_warnings(req)
    plan = plan_from_args(args, req)
    print_warnings(plan, req)
    note = confidence_note(args, req, plan) if args.budget is None else None
    text = [plan_table(plan), "", summary_line(plan.predicted, plan.deadline_s)]
    if args.budget is not None:
        from rubberband.cli.budget_view import budget_line, probes_table

        text += [budget_line(plan), "", probes_table(plan)]
    else:
        text += [note, "", considered_table(plan)] if note else ["", considered_table(plan)]
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(plan.to_json())
        text.append(f"\nwrote {args.out}")
    payload = plan.to_dict()
    payload["predicted"].pop("jct_s")
    payload["predicted"].pop("cost_usd")
    if note:
        payload["note"] = note
    emit(args, {"experiment": req.name, **payload}, "\n".join(text))
    return 0


plan_cmd.arguments = _plan_args  # type: ignore[attr-defined]
command("plan", "find the cheapest plan that meets the deadline, and compare every policy")(plan_cmd)
