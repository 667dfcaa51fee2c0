"""`rubberband run EXP --provider sim`: rehearse a plan in virtual time with the real scheduler.

The ``sim`` provider (``rubberband.providers.sim``) plays the cluster; this module turns a
rehearsal into the same ``RunResult`` a real run reports (the ledger priced by the executor's
own ``Ledger``), repeats it over seeds, and prints or emits it.

Exit codes: 0 the job ran to its end, ``EXIT_BUDGET`` (3) a rehearsal stopped because the
``--budget`` ran out (with the best trial so far); errors exit 1 or 2 as every command does.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

from rubberband.errors import SpecError


def rehearse_args(p: argparse.ArgumentParser) -> None:
    """The options only a rehearsal takes (``run --provider sim``)."""
    p.add_argument("--truth-model", metavar="YAML",
                   help="sim: draw latencies from this model profile instead of the planning one (rehearse a wrong profile)")
    p.add_argument("--truth-cloud", metavar="YAML",
                   help="sim: cloud-profile overrides that are the truth (latencies, spot market) instead of the planning ones")
    p.add_argument("--repeat", type=int, help="sim: rehearse N times (seeds SEED..SEED+N-1) and summarise")
    p.add_argument("--no-replan", action="store_true",
                   help="follow the plan as it is (default: re-plan the remaining stages at each SYNC)")


    p.add_argument("--no-safety-net", action="store_true",
                   help="keep replacing reclaimed spot with spot to the end (default: move the rest of the "
                        "job to on-demand once the slack left no longer covers finishing there)")


SIM_ONLY = ("truth_model", "truth_cloud", "repeat")
EXIT_BUDGET = 3       # the budget ran out: stopped cleanly, not failed


def wants_rehearsal(args: argparse.Namespace) -> bool:
    """Whether ``run`` rehearses (``--provider sim``); the rehearsal's options go with no other provider.

    Raises:
        SpecError: a sim-only option given to another provider, or ``--repeat`` below 1.
    """
    if args.provider == "sim":
        if args.repeat is not None and args.repeat < 1:
            raise SpecError(f"--repeat: expected a whole number of rehearsals >= 1, got {args.repeat}")
        return True
    for dest in SIM_ONLY:
        if getattr(args, dest, None) not in (None, False):
            raise SpecError(f"--{dest.replace('_', '-')}: only a rehearsal takes it; add --provider sim or drop it")
    return False


def plan_model(exp, plan):
    """The one profile a plan's re-planning and safety net reason with: its (first) type's GPU
    model's, when the experiment gives one per GPU model."""
    from rubberband.profiles.by_gpu import model_of

    return model_of(exp.model_for_planning, plan.cloud, "plan.cloud.instance_type")


def truth_of(args: argparse.Namespace, exp, plan):
    """The truth model and cloud a rehearsal draws from: the planning ones unless overridden.

    Raises:
        SpecError: naming ``--truth-model`` or ``--truth-cloud`` for a file that cannot be the truth.
    """
    from rubberband.profiles.cloud import OVERRIDABLE
    from rubberband.profiles.model import ModelProfile
    from rubberband.providers.sim import check_truth
    from rubberband.schema import check_mapping, load_yaml

    model = exp.model_for_planning      # by default each type runs by its GPU model's own profile
    if args.truth_model is not None:
        model = check_truth(plan, ModelProfile.from_dict(load_yaml(args.truth_model, "--truth-model"),
                                                         where=f"--truth-model {args.truth_model}"),
                            plan_model(exp, plan))
    cloud = plan.cloud
    if args.truth_cloud is not None:
        extra = check_mapping(load_yaml(args.truth_cloud, "--truth-cloud"), f"--truth-cloud {args.truth_cloud}",
                              optional=OVERRIDABLE)
        try:      # every type the plan runs on, each on its market
            truth = {c.instance_type: exp.catalog.get(c.instance_type, c.market, {**exp.cloud_overrides, **extra})
                     for c in (plan.cloud, *plan.stage_clouds)}
        except SpecError as exc:
            raise SpecError(f"--truth-cloud {args.truth_cloud}: {exc}") from None
        cloud = truth[plan.instance_type] if len(truth) == 1 else truth
    return model, cloud


def rehearse(plan, model, cloud=None, seed: int = 0, mode: str = "min", metric: str = "metric",
             replan_with=None, safety_net=None, budget_usd: float | None = None):
    """Rehearse ``plan`` once against the truth ``model`` (and ``cloud``) and report it as a run;
    re-plan at each SYNC on ``replan_with`` (the profile the plan was made from) when given,
    with the spot safety net estimating on ``safety_net`` (that profile) and a hard budget.

    Returns:
        A ``RunResult`` as ``rb.execute`` returns (``run_dir`` empty: a rehearsal writes nothing).
    """
    from rubberband.providers.sim import rehearse_once

    run = rehearse_once(plan, model, cloud, seed=seed, mode=mode, replan_with=replan_with, safety_net=safety_net,
                        budget_usd=budget_usd)
    return result_of(plan, run, seed, metric)


def result_of(plan, run, seed: int, metric: str):
    """The ``RunResult`` of one rehearsal: ledger, stages predicted vs actual, trials, best."""
    from rubberband.executor.ledger import InstanceRecord, Ledger, TrialRun
    from rubberband.executor.report import stage_entry
    from rubberband.executor.report import RunResult

    windows = run.stage_windows

    def stage_at(t: float) -> int:
        return next((i for i, (_, b) in enumerate(windows) if t <= b), len(windows) - 1)

    sched = run.scheduler
    # Each instance billed by its own type's profile (the ledger splits by type; the plan's first).
    clouds = {plan.instance_type: plan.cloud, **sched.clouds}
    ledger = Ledger(clouds[plan.instance_type], stage_windows=list(windows), clouds=clouds)
    for inst in run.instances:
        launched = inst.launched_s if inst.billed else None
        ready = inst.ready_s if inst.billed and inst.ready_s <= min(inst.down_s, inst.released_s) else None
        ledger.instances[inst.name] = InstanceRecord(
            inst.name, inst.instance_type, inst.price_usd_per_hour, inst.requested_s, inst.stage_requested,
            launched_s=launched, ready_s=ready, released_s=inst.released_s, stage_released=stage_at(inst.released_s),
            market=inst.market.value, release_reason=inst.release_reason)
    ledger.trials = [TrialRun(**r, instance_type=sched.types[r["stage"]]) for r in run.train_runs]
    costs = ledger.stage_costs(now=run.jct_s)
    ran = {i: [t.id for t in sched.trials.values() if any(h["stage"] == i for h in t.history)]
           for i in range(len(windows) + 1)}
    stages = []
    for i, (a, b) in enumerate(windows):
        nxt = set(ran.get(i + 1, ())) if i + 1 not in plan.spec.bracket_starts else set()
        stages.append(stage_entry(plan, i, ledger, trials=len(ran[i]), promoted=[t for t in ran[i] if t in nxt],
                                  duration_s=b - a, instances=sched.held[i], cost_usd=costs[i],
                                  spot_instances=sched.spot[i], gpus_per_trial=sched.gpus_per_trial[i]))
    attempts: dict[str, int] = {}      # TRAIN attempts: each finished stage, and each one a reclaim cut short
    for r in run.train_runs:
        attempts[r["trial"]] = attempts.get(r["trial"], 0) + 1
    best = sched.best()
    best_info = sched.trials[best] if best else None
    return RunResult(
        run_id=f"sim-seed{seed}", run_dir="",
        best={"trial": best, "config": {}, "metric": best_info.metric, "metric_name": metric, "step": best_info.step}
        if best_info else {},
        predicted={"jct_s": plan.predicted.mean_jct_s, "cost_usd": plan.predicted.mean_cost_usd},
        actual={"jct_s": run.jct_s, "cost_usd": ledger.cost_usd(now=run.jct_s)},
        stages=stages,
        trials={t.id: {"config": {}, "metric": t.metric, "step": t.step, "eliminated_after": t.eliminated_after,
                       "history": t.history, "restarts": attempts.get(t.id, 0) - len(t.history),
                       "ranks_in_sync": True} for t in sched.trials.values()},
        ledger=ledger.to_dict(now=run.jct_s),
        plan=plan.summary(),
    )


def run_dict(result, plan, run) -> dict[str, Any]:
    """A rehearsal's ``RunResult`` fields plus what the closed loop reports of a run."""
    out = result.to_dict()
    sched = run.scheduler
    out.update(deadline_s=plan.deadline_s,
               met_deadline=run.stopped is None and result.actual["jct_s"] <= plan.deadline_s + 1e-9,
               replans=[r.to_dict() for r in sched.replans], safety_net=[s.to_dict() for s in sched.switches],
               stopped=run.stopped, budget_usd=sched.budget.usd if sched.budget else None,
               budget_left_usd=sched.budget_left(), seed=run.seed, reclaims=run.reclaims, provider="sim")
    return out


def summary(runs: list[dict[str, Any]], deadline_s: float) -> dict[str, float]:
    """P(meet), JCT and cost (mean, p90) over repeated rehearsals. A run met its deadline by
    ``met_deadline``: one stopped early (by the budget) has a short JCT but met nothing."""
    jct = np.array([r["actual"]["jct_s"] for r in runs])
    cost = np.array([r["actual"]["cost_usd"] for r in runs])
    return {"runs": len(runs), "deadline_s": deadline_s, "p_meet": float(np.mean([r["met_deadline"] for r in runs])),
            "jct_s_mean": float(jct.mean()), "jct_s_p90": float(np.percentile(jct, 90)),
            "cost_usd_mean": float(cost.mean()), "cost_usd_p90": float(np.percentile(cost, 90)),
            "replans_mean": float(np.mean([len(r["replans"]) for r in runs])),
            "safety_net_share": float(np.mean([bool(r["safety_net"]) for r in runs])),
            "stopped_on_budget": int(sum(r["stopped"] is not None for r in runs))}


def rehearse_cmd(args: argparse.Namespace, exp, plan, budget_usd: float | None = None) -> int:
    """``run --provider sim``: one rehearsal (or ``--repeat N``), printed like a run or as JSON;
    ``EXIT_BUDGET`` when a rehearsal stopped on the budget."""
    from rubberband.cli.common import emit
    from rubberband.providers.sim import rehearse_once
    from rubberband.units import format_duration, format_usd

    repeat = 1 if args.repeat is None else args.repeat
    model, cloud = truth_of(args, exp, plan)
    seed = args.seed if args.seed is not None else exp.seed
    runs, results = [], []
    replan_with = None if args.no_replan else plan_model(exp, plan)
    net = None if args.no_safety_net else plan_model(exp, plan)
    for k in range(repeat):
        run = rehearse_once(plan, model, cloud, seed=seed + k, mode=exp.mode, replan_with=replan_with,
                            safety_net=net, budget_usd=budget_usd)
        result = result_of(plan, run, seed + k, exp.metric)
        results.append(result)
        runs.append(run_dict(result, plan, run))
    code = EXIT_BUDGET if any(r["stopped"] for r in runs) else 0
    if budget_usd is not None and plan.predicted.mean_cost_usd > budget_usd and not args.json:
        print(f"note: the plan is predicted to cost {format_usd(plan.predicted.mean_cost_usd)}, more than the budget "
              f"{format_usd(budget_usd)}: expect it to stop before its end")
    if args.repeat is None:
        one, result = runs[0], results[0]
        # A budget's plan, or an allocation run without --deadline, has no deadline (inf).
        verdict = (f"{'met' if one['met_deadline'] else 'missed'} the deadline {format_duration(plan.deadline_s)}"
                   if math.isfinite(plan.deadline_s) else "no deadline to meet")
        lines = [*one["replans"], *one["safety_net"]]
        budget = "" if budget_usd is None else f"; {format_usd(one['budget_left_usd'])} of {format_usd(budget_usd)} left"
        stopped = f"\nstopped: {one['stopped']} (best so far: {one['best'].get('trial')})" if one["stopped"] else ""
        emit(args, one, "".join(r["line"] + "\n" for r in lines) + result.table() +
             f"\nrehearsal (sim, seed {seed}): {verdict}; "
             f"{one['reclaims']} spot reclaim(s), {len(one['replans'])} re-plan(s){budget}{stopped}")
        return code
    s = summary(runs, plan.deadline_s)
    emit(args, {"summary": s, "runs": runs},
         f"{repeat} rehearsals (sim, seeds {seed}..{seed + repeat - 1}):\n"
         + (f"P(met {format_duration(plan.deadline_s)}, not stopped) = {s['p_meet']:.1%}\n" if math.isfinite(plan.deadline_s) else "")
         + f"JCT  mean {format_duration(s['jct_s_mean'])}  p90 {format_duration(s['jct_s_p90'])}\n"
         f"cost mean {format_usd(s['cost_usd_mean'])}  p90 {format_usd(s['cost_usd_p90'])}\n"
         f"re-planned {s['replans_mean']:.2f} times per rehearsal on average; safety net used in "
         f"{s['safety_net_share']:.0%}" + (f"; {s['stopped_on_budget']} stopped on the budget" if budget_usd else ""))
    return code
