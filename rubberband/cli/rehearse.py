"""`rubberband run EXP --provider sim`: rehearse a plan in virtual time with the real scheduler.

The rehearsal itself and its report are the library's (``rubberband.executor.rehearse``:
``rehearse``, ``rehearse_runs``, ``summary``, re-exported here); this module takes the
options, reads the truth profiles, shows progress on stderr and prints or emits the result.

Exit codes: 0 the job ran to its end, ``EXIT_BUDGET`` (3) a rehearsal stopped because the
``--budget`` ran out (with the best trial so far); errors exit 1 or 2 as every command does.
"""

from __future__ import annotations

import argparse
import math
import time

from rubberband.cli.common import StatusLine
from rubberband.errors import SpecError
from rubberband.executor.rehearse import rehearse, rehearse_runs, result_of, run_dict, summary

__all__ = ["EXIT_BUDGET", "SIM_ONLY", "plan_model", "target_plan_model", "rehearse", "rehearse_args", "rehearse_cmd", "rehearse_runs",
           "result_of", "run_dict", "summary", "truth_of", "wants_rehearsal"]


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
    from rubberband.providers import base as providers

    if not providers.get(args.provider, "--provider").starts_cluster:
        if args.repeat is not None and args.repeat < 1:
            raise SpecError(f"--repeat: expected a whole number of rehearsals >= 1, got {args.repeat}")
        return True
    for dest in SIM_ONLY:
        if getattr(args, dest, None) not in (None, False):
            rehearsing = [n for n in providers.names() if not providers.get(n).starts_cluster]
            raise SpecError(f"--{dest.replace('_', '-')}: only a rehearsal takes it; add --provider {rehearsing[0]} or drop it")
    return False


def plan_model(exp, plan):
    """The one profile a plan's re-planning and safety net reason with: its (first) type's GPU
    model's, when the experiment gives one per GPU model; a surrogate job's tuning stages' (the
    surrogate's, DESIGN §4.6)."""
    from rubberband.profiles.by_gpu import model_of

    return model_of(exp.job_models()[0], plan.cloud, "plan.cloud.instance_type")


def target_plan_model(exp, plan):
    """A surrogate job's target stage's profile on the plan's (first) type (``None``: no target stage)."""
    from rubberband.profiles.by_gpu import model_of

    target = exp.job_models()[1]
    return None if target is None else model_of(target, plan.cloud, "plan.cloud.instance_type")


def truth_of(args: argparse.Namespace, exp, plan):
    """The truth model and cloud a rehearsal draws from: the planning ones unless overridden.

    Raises:
        SpecError: naming ``--truth-model`` or ``--truth-cloud`` for a file that cannot be the truth.
    """
    from rubberband.executor.rehearse import check_truth
    from rubberband.profiles.cloud import OVERRIDABLE
    from rubberband.profiles.model import ModelProfile
    from rubberband.schema import check_mapping, load_yaml

    model = exp.job_models()[0]     # by default each type runs by its GPU model's own profile (a surrogate's)
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


PROGRESS_AFTER_S = 2.0      # rehearsals quicker than this show no progress
PROGRESS_EVERY_S = 0.5


class RepeatProgress(StatusLine):
    """``rehearsing: 37 of 200`` on one stderr line that overwrites itself, once rehearsing has
    taken ``PROGRESS_AFTER_S`` (as the planner's progress line); silent with ``--json`` or
    when stderr is not a terminal, wiped when the rehearsals end."""

    def __init__(self, args: argparse.Namespace, stream=None, clock=time.monotonic, tty: bool | None = None):
        super().__init__(args, PROGRESS_AFTER_S, PROGRESS_EVERY_S, stream=stream, clock=clock, tty=tty)

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if done < total and self.due(now):
            self.show(f"rehearsing: {done:,} of {total:,} (sim, {now - self.start:.0f}s)", now)


def rehearse_cmd(args: argparse.Namespace, exp, plan, budget_usd: float | None = None) -> int:
    """``run --provider sim``: one rehearsal (or ``--repeat N``), printed like a run or as JSON;
    ``EXIT_BUDGET`` when a rehearsal stopped on the budget."""
    from rubberband.cli.common import emit
    from rubberband.units import format_duration, format_usd

    repeat = 1 if args.repeat is None else args.repeat
    model, cloud = truth_of(args, exp, plan)
    seed = args.seed if args.seed is not None else exp.seed
    replan_with = None if args.no_replan else plan_model(exp, plan)
    net = None if args.no_safety_net else plan_model(exp, plan)
    surrogate = exp.surrogate if plan.spec.target_stage is not None else None
    job = dict(target_model=exp.job_models()[1], replan_target=target_plan_model(exp, plan),
               width_ratio=surrogate.width_ratio if surrogate is not None else None)
    from rubberband.executor.search_space import Search

    with RepeatProgress(args) as progress:     # configs drawn as a run draws them (search: optuna included)
        results, runs = rehearse_runs(plan, model, cloud, seeds=range(seed, seed + repeat), mode=exp.mode,
                                      metric=exp.metric, replan_with=replan_with, safety_net=net,
                                      budget_usd=budget_usd, progress=progress,
                                      search_space=Search.of(exp.search_space, exp.search), **job)
    code = EXIT_BUDGET if any(r["stopped"] for r in runs) else 0
    if budget_usd is not None and plan.predicted.mean_cost_usd > budget_usd and not args.json:
        print(f"note: the plan is predicted to cost {format_usd(plan.predicted.mean_cost_usd)}, more than the budget "
              f"{format_usd(budget_usd)}: expect it to stop before its end")
    if args.repeat is None:
        from rubberband.cli.report_cmd import draw_run, write_rehearsal

        one, result = runs[0], results[0]
        # A run directory as a real run's, for `rubberband report` (and --gantt) to read.
        run_dir = write_rehearsal(args.runs_dir, one, plan, *exp.job_models())
        drawn = f"\n{draw_run(run_dir, one, args.gantt)}" if args.gantt else ""
        if args.gantt:
            one["gantt"] = args.gantt
        # A budget's plan, or an allocation run without --deadline, has no deadline (inf).
        verdict = (f"{'met' if one['met_deadline'] else 'missed'} the deadline {format_duration(plan.deadline_s)}"
                   if math.isfinite(plan.deadline_s) else "no deadline to meet")
        lines = [*one["replans"], *one["safety_net"]]
        budget = "" if budget_usd is None else f"; {format_usd(one['budget_left_usd'])} of {format_usd(budget_usd)} left"
        stopped = f"\nstopped: {one['stopped']} (best so far: {one['best'].get('trial')})" if one["stopped"] else ""
        emit(args, one, "".join(r["line"] + "\n" for r in lines) + result.table() +
             f"\nrehearsal (sim, seed {seed}): {verdict}; "
             f"{one['reclaims']} spot reclaim(s), {len(one['replans'])} re-plan(s){budget}{stopped}"
             f"\nrun directory: {run_dir}{drawn}")
        return code
    s = summary(runs, plan.deadline_s)
    emit(args, {"summary": s, "runs": runs},
         f"{repeat} rehearsals (sim, seeds {seed}..{seed + repeat - 1}):\n"
         + (f"P(met {format_duration(plan.deadline_s)}, not stopped) = {s['p_meet']:.1%}\n" if math.isfinite(plan.deadline_s) else "")
         + f"JCT  mean {format_duration(s['jct_s_mean'])}  p90 {format_duration(s['jct_s_p90'])}\n"
         f"cost mean {format_usd(s['cost_usd_mean'])}  p90 {format_usd(s['cost_usd_p90'])}\n"
         f"re-planned {s['replans_mean']:.2f} times per rehearsal on average; safety net used in "
         f"{s['safety_net_share']:.0%}" + (f"; {s['stopped_on_budget']} stopped on the budget" if budget_usd else "")
         + (f"\nredone iterations per rehearsal  predicted {s['redone_predicted']}  mean {s['redone_mean']:.1f}"
            if s["redone_predicted"] or s["redone_mean"] else ""))
    return code
