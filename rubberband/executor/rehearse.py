"""Rehearsals: a plan run in virtual time on the ``sim`` backend, reported as a real run is.

The ``sim`` backend (``rubberband.executor.sim``) plays the cloud and the trainers as the
executor's ports, in virtual time, and the executor's ``Driver`` applies the scheduler's
decisions to them as in a real run; this module turns one rehearsal into the ``RunResult`` a real run
reports (the ledger priced by the executor's own ``Ledger``, stages predicted vs actual),
repeats it over seeds with progress, and summarises the repeats (P(meet), JCT and cost). The
CLI (``rubberband run EXP --provider sim``, ``rubberband.cli.rehearse``) only parses and
prints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rubberband.errors import SpecError
from rubberband.executor.report import RunResult
from rubberband.limits import check_rehearsal
from rubberband.plan.plan import Plan
from rubberband.profiles.model import ModelProfile


def check_truth(plan: Plan, model: ModelProfile, planned: ModelProfile, where: str = "--truth-model") -> ModelProfile:
    """A truth model must describe the planned model and cover every GPU count (and trials
    per GPU, packed) the plan uses.

    Raises:
        SpecError: naming ``where``, for another model or a missing GPU count.
    """
    if model.name != planned.name:
        raise SpecError(f"{where}: profile {model.name!r} is of another model than the plan's {planned.name!r}; "
                        "give a profile of the same model (its `name:`)")
    missing = sorted({m for m in plan.gpus_per_trial if not model.covers(m)})
    if missing:
        raise SpecError(f"{where}: profile {model.name!r} covers {model.min_gpus}..{model.max_gpus} GPUs per trial, "
                        f"but the plan runs trials on {', '.join(map(str, missing))} GPUs; add those counts to it")
    unpacked = sorted({k for k in plan.packing if k > 1 and k not in model.packed_iter_latency_s})
    if unpacked:
        raise SpecError(f"{where}: profile {model.name!r} has no packed_iter_latency_s for "
                        f"{', '.join(map(str, unpacked))} trials per GPU, which the plan packs; add them to it")
    return model


def rehearse(plan: Plan, model, cloud=None, seed: int = 0, mode: str = "min", metric: str = "metric",
             replan_with=None, safety_net=None, budget_usd: float | None = None, search_space=None,
             target_model=None, replan_target=None, width_ratio: int | None = None) -> RunResult:
    """Rehearse ``plan`` once against the truth ``model`` (and ``cloud``) and report it as a run;
    re-plan at each SYNC on ``replan_with`` (the profile the plan was made from) when given,
    with the spot safety net estimating on ``safety_net`` (that profile) and a hard budget;
    trials draw their configs from ``search_space`` (``rehearse_once``). A surrogate job's target
    stage is drawn from ``target_model`` and re-planned with ``replan_target`` (DESIGN §4.6).

    Returns:
        A ``RunResult`` as ``rb.execute`` returns (``run_dir`` empty: a rehearsal writes nothing).
    """
    from rubberband.executor.sim import rehearse_once

    check_rehearsal(plan.spec.trials, plan.spec.iters)
    run = rehearse_once(plan, model, cloud, seed=seed, mode=mode, replan_with=replan_with, safety_net=safety_net,
                        budget_usd=budget_usd, search_space=search_space, metric=metric, target_model=target_model,
                        replan_target=replan_target)
    return result_of(plan, run, seed, metric, width_ratio)


def rehearse_runs(plan: Plan, model, cloud=None, seeds: Sequence[int] = (0,), mode: str = "min",
                  metric: str = "metric", replan_with=None, safety_net=None, budget_usd: float | None = None,
                  progress: Callable[[int, int], None] | None = None,
                  search_space=None, target_model=None, replan_target=None,
                  width_ratio: int | None = None) -> tuple[list[RunResult], list[dict[str, Any]]]:
    """One rehearsal per seed (``rehearse``'s arguments), after ``check_rehearsal``; ``progress(done,
    total)`` is called after each. Returns each one's ``RunResult`` and its ``run_dict``."""
    from rubberband.executor.sim import rehearse_once

    check_rehearsal(plan.spec.trials, plan.spec.iters, len(seeds))
    results, runs = [], []
    for k, seed in enumerate(seeds):
        run = rehearse_once(plan, model, cloud, seed=seed, mode=mode, replan_with=replan_with, safety_net=safety_net,
                            budget_usd=budget_usd, search_space=search_space, target_model=target_model,
                            replan_target=replan_target)
        result = result_of(plan, run, seed, metric, width_ratio)
        results.append(result)
        runs.append(run_dict(result, plan, run))
        if progress is not None:
            progress(k + 1, len(seeds))
    return results, runs


def result_of(plan: Plan, run, seed: int, metric: str, width_ratio: int | None = None) -> RunResult:
    """The ``RunResult`` of one rehearsal: ledger, stages predicted vs actual, trials, best."""
    from rubberband.executor.ledger import InstanceRecord, Ledger, TrialRun
    from rubberband.executor.report import stage_entry, surrogate_summary
    from rubberband.scheduler import is_superseded, is_target_trial, surrogate_winner

    windows = run.stage_windows

    def stage_at(t: float) -> int:
        return next((i for i, (_, b) in enumerate(windows) if t <= b), len(windows) - 1)

    report = run.report
    # Each instance billed by its own type's profile (the ledger splits by type; the plan's first).
    clouds = {plan.instance_type: plan.cloud, **report.clouds}
    ledger = Ledger(clouds[plan.instance_type], stage_windows=list(windows), clouds=clouds)
    for inst in run.instances:
        launched = inst.launched_s if inst.billed else None
        ready = inst.ready_s if inst.billed and inst.ready_s <= min(inst.down_s, inst.released_s) else None
        ledger.instances[inst.name] = InstanceRecord(
            inst.name, inst.instance_type, inst.price_usd_per_hour, inst.requested_s, inst.stage_requested,
            launched_s=launched, ready_s=ready, released_s=inst.released_s, stage_released=stage_at(inst.released_s),
            market=inst.market.value, release_reason=inst.release_reason)
    ledger.own(run.timeline)
    ledger.trials = [TrialRun(**r, instance_type=report.stages[r["stage"]].instance_type) for r in run.train_runs]
    costs = ledger.stage_costs(now=run.jct_s)
    ran = {i: [t.id for t in report.trials.values() if any(h["stage"] == i for h in t.history)]
           for i in range(len(windows) + 1)}
    stages = []
    for i, (a, b) in enumerate(windows):
        nxt = set(ran.get(i + 1, ())) if i + 1 not in plan.spec.bracket_starts else set()
        # The target stage trains the winner's config as a new trial: the winner is what went on.
        nxt = {surrogate_winner(t) if is_target_trial(t) else t for t in nxt      # (not an eager target superseded)
               if not is_superseded(t, report.trials[t].eliminated_after, i + 1)}
        followed = report.stages[i]
        stages.append(stage_entry(plan, i, ledger, trials=len(ran[i]), promoted=[t for t in ran[i] if t in nxt],
                                  duration_s=b - a, instances=followed.instances, cost_usd=costs[i],
                                  spot_instances=followed.spot_instances, gpus_per_trial=followed.gpus_per_trial))
    attempts: dict[str, int] = {}      # TRAIN attempts: each finished stage, and each one a reclaim cut short
    redone: dict[tuple[str, int], int] = {}     # iterations each trial's TRAIN of a stage trained again
    for r in run.train_runs:
        attempts[r["trial"]] = attempts.get(r["trial"], 0) + 1
        if r.get("redone"):
            redone[r["trial"], r["stage"]] = redone.get((r["trial"], r["stage"]), 0) + r["redone"]

    def history(t: Any) -> list[dict[str, Any]]:
        return [{**h, **({"redone": redone[t.id, h["stage"]]} if (t.id, h["stage"]) in redone else {})} for h in t.history]

    def trial_redone(t: Any) -> dict[str, int]:
        n = sum(v for (tid, _), v in redone.items() if tid == t.id)
        return {"redone": n} if n else {}
    best, best_info = report.best, report.best_trial
    trials = {t.id: {"config": run.configs.get(t.id, {}), "metric": t.metric, "step": t.step,
                     "eliminated_after": t.eliminated_after, "history": history(t),
                     "restarts": attempts.get(t.id, 0) - len(t.history), "ranks_in_sync": True, **trial_redone(t)}
              for t in report.trials.values()}
    return RunResult(
        run_id=f"sim-seed{seed}", run_dir="",
        best={"trial": best, "config": run.configs.get(best, {}), "metric": best_info.metric, "metric_name": metric, "step": best_info.step}
        if best_info else {},
        predicted={"jct_s": plan.predicted.mean_jct_s, "cost_usd": plan.predicted.mean_cost_usd},
        actual={"jct_s": run.jct_s, "cost_usd": ledger.cost_usd(now=run.jct_s)},
        stages=stages,
        trials=trials,
        ledger=ledger.to_dict(now=run.jct_s),
        plan=plan.summary(),
        timeline=run.timeline,
        surrogate=surrogate_summary(plan, trials, stages, metric, width_ratio),
    )


def run_dict(result: RunResult, plan: Plan, run) -> dict[str, Any]:
    """A rehearsal's ``RunResult`` fields plus what the closed loop reports of a run."""
    out = result.to_dict()
    report = run.report
    out.update(deadline_s=plan.deadline_s,
               met_deadline=run.stopped is None and result.actual["jct_s"] <= plan.deadline_s + 1e-9,
               replans=[r.to_dict() for r in report.replans], safety_net=[s.to_dict() for s in report.switches],
               stopped=run.stopped, budget_usd=report.budget_usd, budget_left_usd=report.budget_left_usd,
               seed=run.seed, reclaims=run.reclaims, provider="sim")
    return out


def summary(runs: Sequence[Mapping[str, Any]], deadline_s: float) -> dict[str, float]:
    """P(meet), JCT and cost (mean, p90) over repeated rehearsals. A run met its deadline by
    ``met_deadline``: one stopped early (by the budget) has a short JCT but met nothing."""
    if not runs:
        raise SpecError("summary: no rehearsals to summarise")
    jct = np.array([r["actual"]["jct_s"] for r in runs])
    cost = np.array([r["actual"]["cost_usd"] for r in runs])
    return {"runs": len(runs), "deadline_s": deadline_s, "p_meet": float(np.mean([r["met_deadline"] for r in runs])),
            "jct_s_mean": float(jct.mean()), "jct_s_p90": float(np.percentile(jct, 90)),
            "cost_usd_mean": float(cost.mean()), "cost_usd_p90": float(np.percentile(cost, 90)),
            "replans_mean": float(np.mean([len(r["replans"]) for r in runs])),
            "safety_net_share": float(np.mean([bool(r["safety_net"]) for r in runs])),
            "stopped_on_budget": int(sum(r["stopped"] is not None for r in runs)),
            # redone iterations per rehearsal (DESIGN §4): counted, and as the plan predicts them
            "redone_mean": float(np.mean([sum(t.get("redone", 0) for t in r["trials"].values()) for r in runs])),
            "redone_predicted": int(sum(s["trials"] * s["predicted"].get("redone", 0) for s in runs[0]["stages"]))}
