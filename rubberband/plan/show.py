"""A plan as text: the table and summary lines `rubberband plan` and `run` print, and
`rubberband.Tuner` prints too (so the Python entry shows the CLI's very text)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rubberband.profiles.cloud import BillingModel
from rubberband.render import render
from rubberband.units import format_duration, format_usd

if TYPE_CHECKING:
    from rubberband.plan.plan import Plan
    from rubberband.profiles.cloud import CloudProfile
    from rubberband.simulator import SimResult


def stage_cost_footnote(cloud: CloudProfile, column: str) -> str:
    """Where per-instance billing's rounding lands: the simulator adds it when an instance is
    released (DESIGN §4), so a stage's cost can exceed its own instance-seconds."""
    if cloud.billing.model is not BillingModel.PER_INSTANCE:
        return ""
    return (f"\n{column}: billing round-ups and minimum-billing top-ups land on the last stage "
            "an instance serves")


def summary_line(result: SimResult, deadline: float | None) -> str:
    """A ``SimResult``'s JCT and cost (mean, p50, p90), and its P(meet) when there is a deadline."""
    line = (f"JCT  mean {format_duration(result.mean_jct_s)}  p50 {format_duration(result.p50_jct_s)}  "
            f"p90 {format_duration(result.p90_jct_s)}\ncost mean {format_usd(result.mean_cost_usd)}  "
            f"p50 {format_usd(result.p50_cost_usd)}  p90 {format_usd(result.p90_cost_usd)}")
    if deadline and math.isfinite(deadline):    # a plan with no deadline (inf) has none to meet
        line += f"\nP(JCT <= {format_duration(deadline)}) = {result.p_meet(deadline):.1%}"
    return line


def plan_table(plan: Plan) -> str:
    """The plan, one row per stage, under a title that names its type, prices and deadline."""
    from rubberband.simulator import instances_needed

    p = plan.predicted

    clouds = plan.stage_clouds

    def held(s: Any) -> str:
        # A stage may hold more instances than its trials need, for a later stage.
        idle = s.instances - instances_needed(s.num_trials, s.allocation, clouds[s.index].gpus_per_instance,
                                              plan.packing[s.index], plan.fusion[s.index])
        return f"{s.instances} ({idle} held idle)" if idle > 0 else str(s.instances)

    types = len(set(plan.instance_types)) > 1
    packed = any(k > 1 for k in plan.packing)
    fused = any(f > 1 for f in plan.fusion)

    spot = plan.spot_counts
    on_spot = any(spot)
    spot_price = plan.cloud.spot_price_usd_per_hour or 0.0      # a plan with spot stages has a spot price
    if on_spot and not all(spot):
        prices = (f"on-demand {format_usd(plan.cloud.price_usd_per_hour)}/h, "
                  f"spot {format_usd(spot_price)}/h")
    else:
        prices = f"{'spot' if on_spot else 'on-demand'} {format_usd(spot_price if on_spot else plan.cloud.price_usd_per_hour)}/h"
    markets = ["market", "reclaims"] if on_spot else []
    return render(
        ["stage", "trials", "iters", *(["type"] if types else []), "GPUs/trial", *(["per GPU"] if packed else []),
         *(["fused/GPU"] if fused else []), "GPUs", "instances", *markets, "mean time", "stage cost"],
        [[f"{s.index} target" if s.index == plan.spec.target_stage else s.index, s.num_trials, s.iters,
          *([clouds[s.index].instance_type] if types else []), s.gpus_per_trial,
          *([plan.packing[s.index]] if packed else []), *([plan.fusion[s.index]] if fused else []),
          s.allocation, held(s),
          *(["spot" if n else "on-demand", f"{s.mean_reclaims:.2f}"] if on_spot else []),
          format_duration(s.mean_duration_s), format_usd(s.mean_cost_usd)] for s, n in zip(p.stages, spot)],
        title=f"plan ({plan.policy}) on "
              + (f"{' + '.join(dict.fromkeys(plan.instance_types))}, a type per stage, " if types else
                 f"{plan.instance_type} x{max(plan.instances)} at most, ")
              + (f"zone {plan.info['zone']}, " if plan.info.get("zone") else "")
              + (f"{prices}, " if not types else "")
              + (f"deadline {format_duration(plan.deadline_s)}" if math.isfinite(plan.deadline_s) else "no deadline")
              + (f", P(meet) >= {plan.confidence:g}" if plan.confidence else ""),
    ) + stage_cost_footnote(plan.cloud, "stage cost") + target_footnote(plan)


def target_footnote(plan: Plan) -> str:
    """A surrogate job's split (DESIGN §4.6): what tuning on the surrogate and the target stage cost."""
    target = plan.spec.target_stage
    if target is None:
        return ""
    stages = plan.predicted.stages
    tune_s, tune_usd = sum(s.mean_duration_s for s in stages[:target]), sum(s.mean_cost_usd for s in stages[:target])
    last = stages[target]
    eager = plan.spec.eager
    if eager is None:
        return (f"\nstage {target} is the target: the surrogate winner's config trained at full width from scratch "
                f"({last.iters} iterations, by the target's profile); tuning on the surrogate "
                f"{format_duration(tune_s)} {format_usd(tune_usd)}, target {format_duration(last.mean_duration_s)} "
                f"{format_usd(last.mean_cost_usd)}")
    seq = plan.info.get("eager_transfer", {})
    before = (f"; with the target after the tuning: JCT {format_duration(seq['sequential_jct_s_mean'])}, "
              f"cost {format_usd(seq['sequential_cost_usd_mean'])}") if "sequential_jct_s_mean" in seq else ""
    return (f"\nstage {target} is the target, started early (eager transfer): at the SYNC ending stage "
            f"{eager.after_stage} the leader's config starts training at full width on its own instances "
            f"({last.iters} iterations, by the target's profile) while the tuning goes on; it starts over with the "
            f"winner's config if that is another trial (probability {eager.restart_probability:.2g} in the model). "
            f"Tuning on the surrogate {format_duration(tune_s)} {format_usd(tune_usd)}; the target "
            f"{format_usd(last.mean_cost_usd)}, ending {format_duration(last.mean_duration_s)} after the tuning"
            f"{before}")
