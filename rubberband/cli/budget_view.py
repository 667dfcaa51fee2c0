"""What `plan --budget` prints below the plan: the budget held and the deadlines probed."""

from __future__ import annotations

import math

from rubberband.render import render
from rubberband.units import format_duration, format_usd


def budget_line(plan) -> str:
    """One line: the budget, how it was held, and what the plan spends of it."""
    info = plan.info
    p = info["budget_confidence"]
    held = "mean cost" if p is None else f"P(cost <= budget) >= {p:g}"
    return (f"budget {format_usd(info['budget_usd'])} ({held}): shortest mean JCT "
            f"{format_duration(plan.predicted.mean_jct_s)}, mean cost {format_usd(plan.predicted.mean_cost_usd)}, "
            f"P(cost <= budget) {info['p_within_budget']:.0%}")


def probes_table(plan) -> str:
    """The deadlines the budget search asked the planner for, and the cost of each answer."""
    rows = []
    for pr in sorted(plan.info["budget_probes"], key=lambda r: r["deadline_s"] or math.inf):
        asked = "none (cheapest)" if pr["deadline_s"] is None else format_duration(pr["deadline_s"])
        if pr["jct_s_mean"] is None:
            rows.append([asked, "-", "-", "-", "infeasible"])
            continue
        rows.append([asked, ",".join(map(str, pr["allocation"])),
                     format_duration(pr["jct_s_mean"]), format_usd(pr["cost_usd"]),
                     "yes" if pr["within_budget"] else "no"])
    cost = "cost" if plan.info["budget_confidence"] is None else f"cost p{plan.info['budget_confidence'] * 100:g}"
    return render(["deadline asked", "allocation", "JCT mean", cost, "within budget"], rows,
                  title="deadlines probed (the cheapest plan at each)")
