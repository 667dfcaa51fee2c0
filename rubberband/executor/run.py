"""rb.execute: run a plan for real on a provider and report actual JCT and cost."""

from __future__ import annotations

import secrets
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rubberband import function_api
from rubberband.errors import SpecError
from rubberband.executor.driver import Driver, DriverOutcome
from rubberband.executor.ledger import Ledger
from rubberband.executor.report import RunResult, stage_entry, surrogate_summary
from rubberband.executor.search_space import Search
from rubberband.executor.session import Session, cluster_session
from rubberband.plan.compile import type_cap
from rubberband.plan.plan import Plan
from rubberband.profiles.cloud import CloudProfile
from rubberband.scheduler import is_target_trial, surrogate_winner
from rubberband.providers import base
from rubberband.providers.base import LAUNCH_ERRORS, ProviderEvent, Release

UNPLANNED = (Release.INTERRUPTED, Release.LOST)    # releases nobody asked for
REPLAN_GROWTH = 2       # a re-planned run may hold up to this many times the plan's most instances
NODE_SETTLE_S = 30.0     # Ray marks a dead node dead after missed heartbeats (about 15-30 s)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def execute(plan: Plan, trainer: Any, search_space: dict[str, Any] | Search, provider: str = base.DEFAULT, metric: str | None = None,
            mode: str | None = None, seed: int = 0, runs_dir: str | Path = "runs", latency_scale: float = 1.0,
            on_event: Callable[[str, dict[str, Any]], None] | None = None, run_id: str | None = None,
            cluster_config: Any = None, launch_attempts: int = 6, launch_backoff_s: float = 2.0,
            spot_emulation: Any = None, replan_with: Any = None, safety_net: Any = None,
            budget_usd: float | None = None, max_failures: int = 0, time_attr: str | None = None,
            surrogate_ratio: int | None = None, target_model: Any = None) -> RunResult:
    """Run ``plan`` for real and return what happened next to what was predicted.

    Args:
        plan: from ``compile_plan``.
        trainer: a ``rubberband.executor.Trainer`` (class, instance or ``module:Name``).
        search_space: rubberband's or Ray Tune's domains, YAML samplers or lists per hyperparameter
            (searched at random), or a ``search_space.Search`` that names its algorithm.
        provider: a registered provider (``rubberband.providers.base``): ``local`` (Ray nodes on
            this machine with logical GPUs) or ``aws`` (EC2 instances launched through Ray's
            autoscaler; needs ``cluster_config``).
        metric, mode: what to rank trials by (default: the trainer's).
        seed: samples the configs and seeds the workers.
        runs_dir: the run writes ``<runs_dir>/<run_id>/`` (checkpoints, ledger, result.json).
        latency_scale: multiplies the provider's emulated provisioning latency (local, and aws
            against an emulator such as moto).
        cluster_config: ``aws`` only: a Ray cluster YAML (path) with ``provider: {type: aws}``.
        launch_attempts, launch_backoff_s: ``aws`` only: how often and how patiently a launch
            that fails for lack of capacity is retried (the backoff doubles each time).
        spot_emulation: on a provider that emulates reclaims (``local``): reclaim the plan's spot
            instances from its preemption model (``""``), an override such as
            ``"rate=2/h,notice=20s"``, or the provider's own emulation object (a ``SpotEmulation``).
        replan_with: the model profile the plan was made from: re-plan the remaining stages at
            every SYNC on it, corrected by the TRAINs seen (``None``: follow the plan as it is),
            within the room the cluster has for each type (``_cluster_room``).
        safety_net: the same profile: move the rest of a spot job to on-demand when the slack
            runs out (``None``: no safety net).
        budget_usd: a hard budget: the run stops cleanly (``RunResult.loop["stopped"]``) rather
            than launch what would break it.
        max_failures: how often a trial whose own code fails (a function trainable that
            raises, or any trial reporting a NaN metric) is retried from its last checkpoint
            before it is marked failed and ranked last (its traceback in ``<run_dir>/failures/``).
        time_attr: the metric a function trainable counts its iterations by (an experiment's
            ``time_attr``; ``function_api``); ``None``: one report is one iteration.

        surrogate_ratio: a surrogate job's ``width_ratio`` S (DESIGN §4.6; the plan ends in a
            target stage), whose ``trainer`` is ``rubberband.surrogate.SurrogateJob(trainer, S)``:
            the tuning stages train at width / S in μP, and the target trial trains the winner's
            config at full width, from scratch.
        target_model: with ``replan_with``, the target stage's profile the re-plans price it by.

    Raises:
        SpecError: ``time_attr`` with a trainer that is not a function trainable; a plan with a
            target stage and no ``surrogate_ratio`` (or one without and a ratio), or a
            ``surrogate_ratio`` with a trainer that is not a ``SurrogateJob`` of that ratio.

    Every instance launched is released when the run ends, fails or is interrupted.
    """
    prov = base.get(provider, "provider")
    search_space = Search.of(search_space)      # a malformed space fails here, before anything is launched
    emulation = None if spot_emulation is None else prov.spot_emulation(spot_emulation, plan.cloud, plan.spot_counts, seed)
    # The provider's configuration must fit the plan before anything is written or launched.
    clouds = plan_clouds(plan)
    config = prov.check(clouds, {t: most + spot for t, (most, spot) in _most_by_type(plan).items()},   # _cluster_room's need
                        base.cluster_yaml_for(prov, cluster_config, where="cluster_config"))
    if emulation is not None:
        config = emulation       # a provider that emulates reclaims is configured by how it reclaims
    from rubberband.executor.worker import load_trainer

    if (plan.spec.target_stage is None) != (surrogate_ratio is None):
        raise SpecError("surrogate.width_ratio: a plan that ends in a target stage (surrogate tuning) runs with the "
                        "surrogate's width ratio, and only such a plan; give surrogate_ratio=S with it" if
                        plan.spec.target_stage is not None else
                        "surrogate.width_ratio: the plan has no target stage to train the winner at full width; "
                        "plan the experiment with `surrogate:` (ExperimentSpec.with_target), or drop the ratio")
    trainer_obj = load_trainer(trainer)
    # SurrogateJob, not a bare surrogate_trainer / target_trainer (both have a ratio): only it
    # builds the target trial at full width and the others at width / S.
    if surrogate_ratio is not None and not (getattr(trainer_obj, "serves_target", False) is True
                                            and getattr(trainer_obj, "ratio", None) == surrogate_ratio):
        raise SpecError(f"trainer: a plan that ends in a target stage trains rubberband.surrogate.SurrogateJob(trainer, "
                        f"{surrogate_ratio}) (surrogates at width / {surrogate_ratio}, the target at full width), "
                        f"got {trainer_obj!r}; wrap the trainer in it")
    if time_attr is not None and not function_api.is_function_trainable(trainer_obj):
        raise SpecError(f"time_attr: {time_attr!r} counts a function trainable's reports (trainer: module:function); "
                        "a Trainer class trains one iteration per call: remove time_attr")
    metric = metric or getattr(trainer_obj, "metric", "val_loss")
    mode = mode or getattr(trainer_obj, "mode", "min")
    run_id = run_id or new_run_id()
    run_dir = Path(runs_dir).resolve() / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.json").write_text(plan.to_json())
    room = _cluster_room(plan, {t: _least(prov.max_workers(config, t), type_cap(plan.info.get("max_instances"), t))
                                for t in _most_by_type(plan)}, replan_with is not None)
    with cluster_session(prov, clouds, room, run_dir, run_id=run_id, trainer=trainer, time_attr=time_attr,
                         seed=seed, config=config, latency_scale=latency_scale, launch_attempts=launch_attempts,
                         launch_backoff_s=launch_backoff_s) as session:
        # A re-plan keeps within the cluster's room (more would wait for instances that never come)
        # and within the max_instances the plan was made within.
        outcome = _drive(plan, session, search_space, metric, mode, seed, run_dir, on_event,
                         dict(replan_with=replan_with, safety_net=safety_net, budget_usd=budget_usd,
                              max_instances={t: _least(r, type_cap(plan.info.get("max_instances"), t)) for t, r in room.items()},
                              max_failures=max_failures, target_model=target_model))
    narrow = trainer_obj.model_config if surrogate_ratio is not None else None
    return _report(plan, outcome, session.read_events(), session.stopped_at, run_id, run_dir, metric, mode,
                   surrogate_ratio, narrow)


def plan_clouds(plan: Plan) -> list[CloudProfile]:
    """The profile of each instance type the plan's stages use, stage 0's first."""
    return list({c.instance_type: c for c in plan.stage_clouds}.values())


def _most_by_type(plan: Plan) -> dict[str, tuple[int, int]]:
    """Per instance type of the plan: the most instances and the most spot instances a stage
    of that type holds."""
    out: dict[str, tuple[int, int]] = {}
    for i, c in enumerate(plan.stage_clouds):
        most, spot = out.get(c.instance_type, (0, 0))
        out[c.instance_type] = (max(most, plan.instances[i]), max(spot, plan.spot_counts[i]))
    return out


def _least(*limits: int | None) -> int | None:
    """The tightest of some instance limits (``None``: no limit)."""
    given = [n for n in limits if n is not None]
    return min(given) if given else None


def _cluster_room(plan: Plan, limits: dict[str, int | None], replans: bool) -> dict[str, int]:
    """How many instances of each instance type the cluster may hold: the most the plan's
    stages of that type hold, one replacement per spot instance (launched while the noticed
    one is still up), and, when the run re-plans, room for REPLAN_GROWTH times the most (a
    re-plan may move later stages onto more instances), within ``limits``: the cluster's own
    ``max_workers`` for each type where the provider's configuration sets one
    (``Provider.max_workers``), and the ``max_instances`` the plan was made within."""
    out = {}
    for name, (most, spot) in _most_by_type(plan).items():
        need, room = most + spot, most * (REPLAN_GROWTH if replans else 1) + spot
        limit = limits.get(name)
        out[name] = max(need, min(room, limit)) if limit else room
    return out


def _drive(plan: Plan, session: Session, search_space, metric, mode, seed, run_dir: Path,
           on_event, loop: dict[str, Any]) -> DriverOutcome:
    t_run = time.time()

    def with_spend(kind: str, data: dict[str, Any]) -> None:
        on_event(kind, {**data, **live_spend(plan, session.read_events(), t_run, time.time())})

    watcher = _ProviderWatcher(session.read_events, on_event)
    watcher.start()
    described = session.provider.describe(session.config)
    if on_event and described is not None:
        on_event("emulation", {"text": described})
    try:
        driver = Driver(plan, session.port, session.runner, search_space, metric, mode, seed=seed,
                        checkpoint_dir=run_dir / "checkpoints", on_event=with_spend if on_event else None,
                        settle_s=NODE_SETTLE_S, **loop)
        return driver.run()
    finally:
        watcher.stop()


def live_spend(plan: Plan, events: list[dict[str, Any]], started: float, now: float) -> dict[str, Any]:
    """What the run has cost so far and how many instances are up (launched, not yet
    released), from the provider's own records."""
    ledger = ledger_from_events(plan, events, started, None, [(0.0, now - started)])
    return {"spend_usd": ledger.cost_usd(now - started),
            "instances_up": sum(1 for rec in ledger.running() if rec.launched_s is not None)}


class _ProviderWatcher:
    """Passes the provider's launch errors and interruptions to ``on_event`` as they happen
    (a launch waiting out a capacity shortage happens while the driver only waits)."""

    def __init__(self, read_events, on_event, poll_s: float = 0.5):
        self.read_events, self.on_event, self.poll_s = read_events, on_event, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._seen = 0

    def start(self) -> None:
        if self.on_event:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
            self._drain()      # what the provider said in the last moments

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._drain()

    def _drain(self) -> None:
        events = self.read_events()
        for e in events[self._seen:]:
            if e.get("event") in LAUNCH_ERRORS or \
                    (e.get("event") == ProviderEvent.TERMINATED and e.get("reason") in UNPLANNED):
                try:
                    self.on_event("provider", dict(e))
                except Exception:
                    pass
        self._seen = len(events)


def ledger_from_events(plan: Plan, events: list[dict[str, Any]], started: float, stop_time: float | None,
                       stage_windows: list[tuple[float, float]], released_in: dict[str, int] | None = None) -> Ledger:
    """Build the ledger from the provider's own timestamps (seconds since the run started).

    ``stop_time``: when the cluster stopped, which released every instance the provider had
    not terminated by then; ``None`` while it runs (those instances are running).
    ``released_in``: the stage each instance the driver released was let go in (its SYNC), from
    the driver's ``release`` events. The provider terminates it a moment later, often once the
    next stage has begun; its billing round-up belongs to the stage it last served, as the
    model puts it (DESIGN §4), not to the one its termination fell in.
    """
    released_in = released_in or {}
    ledger = Ledger(plan.cloud, stage_windows=stage_windows, clouds=dict(plan.type_clouds))

    def stage_at(t: float, ending: bool = False) -> int:
        # A launch at the very start of a stage belongs to that stage; a release at the very
        # end of a stage (its SYNC) belongs to the stage it ends.
        for i, (_, b) in enumerate(stage_windows):
            if t < b or (ending and t <= b):
                return i
        return max(0, len(stage_windows) - 1)

    for e in events:
        t = e["t"] - started
        inst = e.get("instance")
        if e["event"] == ProviderEvent.REQUEST:
            ledger.request(e["instance"], t, stage_at(t), market=e.get("market"),
                           instance_type=e.get("instance_type")).provider_id = e.get("node_id")
        elif e["event"] in LAUNCH_ERRORS:
            ledger.launch_errors.append({"t_s": t, "instance": inst, **{k: e[k] for k in
                                         ("event", "code", "message", "attempt", "retry_in_s", "error") if k in e}})
        elif inst in ledger.instances:
            rec = ledger.instances[inst]
            if e["event"] == ProviderEvent.RUNNING:
                rec.launched_s = t
                rec.provider_id = e.get("ec2_id") or rec.provider_id
                if e.get("market") and e["market"] != rec.market:     # what EC2 says it launched
                    rec.market = e["market"]
                    rec.price_usd_per_hour = ledger.price_usd_per_hour(e["market"], rec.instance_type)
            elif e["event"] == ProviderEvent.READY:
                rec.ready_s = t
            elif e["event"] == ProviderEvent.TERMINATED and rec.released_s is None:
                rec.release_reason = e.get("reason", Release.RELEASED)
                rec.released_s = t
                rec.stage_released = released_in[inst] if inst in released_in and \
                    rec.release_reason == Release.RELEASED else stage_at(t, ending=True)
    for rec in ledger.instances.values():
        if stop_time is not None and rec.released_s is None:   # stopped with the cluster
            rec.released_s = stop_time - started
            rec.stage_released = stage_at(rec.released_s, ending=True)
            rec.release_reason = Release.SHUTDOWN
    return ledger


def _report(plan, outcome, events, stop_time, run_id, run_dir, metric, mode, width_ratio=None, narrow=None) -> RunResult:
    started = outcome.started_at
    windows = [(s.start_s, s.end_s) for s in outcome.stages]
    released_in = {i: e["stage"] for e in outcome.timeline if e.get("event") == "release" for i in e["instances"]}
    ledger = ledger_from_events(plan, events, started, stop_time, windows, released_in)
    ledger.own(outcome.timeline)
    from rubberband.executor.ledger import TrialRun

    def ran_on(run: dict[str, Any]) -> str:
        """The type a TRAIN really ran on (a re-plan may have moved its stage to another type)."""
        first = (run.get("instances") or [None])[0]
        return ledger.instances[first].instance_type if first in ledger.instances \
            else plan.stage_clouds[run["stage"]].instance_type

    # A packed TRAIN held 1/k of its GPU (per-function billing charges that share, DESIGN/docs/model.md).
    ledger.trials = [TrialRun(r["trial"], r["stage"], r["gpus"] / r.get("trials_per_gpu", 1), r["start_s"], r["end_s"],
                              r["iters"], r.get("iter_s", []), instance_type=ran_on(r),
                              instances=list(r.get("instances", [])), gpu_ids=r.get("gpu_ids"),
                              redone=int(r.get("redone", 0)))
                     for r in outcome.train_runs]
    last_release = max((r.released_s or 0.0) for r in ledger.instances.values()) if ledger.instances else 0.0
    jct = outcome.ended_at - started
    costs = ledger.stage_costs(now=last_release)
    stages = []
    for rec in outcome.stages:
        stages.append(stage_entry(plan, rec.index, ledger, trials=len(rec.trials), promoted=rec.promoted,
                                  duration_s=rec.end_s - rec.start_s, instances=rec.instances,
                                  cost_usd=costs[rec.index], spot_instances=rec.spot_instances))
    best = outcome.trials.get(outcome.best) if outcome.best else None
    trials = {t.id: {"config": t.config, "metric": t.metric, "step": t.step, "eliminated_after": t.eliminated_after,
                     "history": t.history, "restarts": t.restarts, "ranks_in_sync": t.ranks_in_sync,
                     **({"redone": t.redone} if t.redone else {}),
                     **({"failed": t.failed, "failures": t.failures} if t.failures else {})}
              for t in outcome.trials.values()}
    # An eager target superseded before its instances were up never reached the driver: the
    # scheduler's record of it (DESIGN §4.6).
    for tid, rec in (outcome.report.trials.items() if outcome.report is not None else ()):
        if tid not in trials and is_target_trial(tid) and surrogate_winner(tid) in trials:
            trials[tid] = {"config": trials[surrogate_winner(tid)]["config"], "metric": rec.metric, "step": rec.step,
                           "eliminated_after": rec.eliminated_after, "history": [], "restarts": 0,
                           "ranks_in_sync": True}
    result = RunResult(
        run_id=run_id, run_dir=str(run_dir),
        best={"trial": best.id, "config": best.config, "metric": best.metric, "metric_name": metric, "step": best.step} if best else {},
        predicted={"jct_s": plan.predicted.mean_jct_s, "cost_usd": plan.predicted.mean_cost_usd},
        actual={"jct_s": jct, "cost_usd": ledger.cost_usd(now=last_release)},
        stages=stages,
        trials=trials,
        ledger=ledger.to_dict(now=last_release),
        plan=plan.summary(),
        loop={"deadline_s": plan.deadline_s,
              "met_deadline": outcome.stopped is None and jct <= plan.deadline_s + 1e-9,
              "replans": [r.to_dict() for r in outcome.replans], "safety_net": [s.to_dict() for s in outcome.switches],
              "stopped": outcome.stopped, "budget_usd": outcome.budget_usd, "budget_left_usd": outcome.budget_left_usd},
        timeline=outcome.timeline,
        surrogate=surrogate_summary(plan, trials, stages, metric, width_ratio, narrow),
    )
    result.save()
    return result


def progress_printer(stream=None) -> Callable[[str, dict[str, Any]], None]:
    """Progress: on a terminal, a live status line (stage, trials running, instances, spend so
    far) under the event lines; otherwise plain log lines only."""
    stream = stream or sys.stderr
    live = hasattr(stream, "isatty") and stream.isatty()
    t0 = time.time()
    state: dict[str, Any] = {"stage": "-", "running": 0, "instances": 0, "spend": 0.0, "budget": None}

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if live:
            print("\r\033[K", end="", file=stream)
        _line(kind, data)
        state["spend"] = data.get("spend_usd", state["spend"])
        state["instances"] = data.get("instances_up", state["instances"])
        state["budget"] = data.get("budget_left_usd", state["budget"])
        if kind == "stage":
            state["stage"], state["running"] = data["index"], 0
        elif kind == "start":
            state["running"] += 1
        elif kind == "trial":
            state["running"] = max(0, state["running"] - 1)
        if live:
            budget = "" if state["budget"] is None else f" | budget left ${state['budget']:.4f}"
            print(f"stage {state['stage']} | trials running {state['running']} | instances {state['instances']} | "
                  f"spent ${state['spend']:.4f}{budget} | {time.time() - t0:.0f}s", end="", file=stream, flush=True)

    def _line(kind: str, data: dict[str, Any]) -> None:
        stamp = f"[{time.time() - t0:7.1f}s]"
        if kind == "stage":
            packed = f", {data['trials_per_gpu']} trials {'fused ' if data.get('fused') else ''}per GPU" \
                if data.get("trials_per_gpu", 1) > 1 else ""
            print(f"{stamp} stage {data['index']}: {data['trials']} trial{'' if data['trials'] == 1 else 's'} x {data['iters']} iters, "
                  f"{data['gpus_per_trial']} GPU(s)/trial{packed} on {data['instances']} instance(s)", file=stream, flush=True)
        elif kind == "trial":
            print(f"{stamp}   trial {data['trial']} done: metric {data['metric']:.4g} at step {data['step']}", file=stream, flush=True)
        elif kind == "sync":
            print(f"{stamp} sync {data['index']}: promoted {', '.join(data['promoted']) or '-'}", file=stream, flush=True)
        elif kind == "recover":
            print(f"{stamp}   trial {data['trial']} lost its gang; resuming from step {data['step']}", file=stream, flush=True)
        elif kind == "failed":
            print(f"{stamp}   trial {data['trial']} failed: {data['reason']} (ranked last; see failures/ in the run "
                  "directory)", file=stream, flush=True)
        elif kind in ("replan", "switch"):
            print(f"{stamp} {data['line']}", file=stream, flush=True)
        elif kind == "stopped":
            print(f"{stamp} stopped: {data['reason']} (best so far: {data.get('best') or '-'})", file=stream, flush=True)
        elif kind == "emulation":
            print(f"{stamp} {data['text']}", file=stream, flush=True)
        elif kind == "notice":
            print(f"{stamp}   instance {data['instance']} will be reclaimed in {data['reclaim_at'] - data['at']:.0f}s "
                  "(spot notice); its replacement is requested", file=stream, flush=True)
        elif kind == "resume":
            print(f"{stamp}   trial {data['trial']} resumed from step {data['step']} on {', '.join(data['instances'])}",
                  file=stream, flush=True)
        elif kind == "provider" and data.get("event") == ProviderEvent.LAUNCH_ERROR:
            retry = f"retrying in {data['retry_in_s']:.1f}s" if data.get("retry_in_s") is not None else "giving up"
            print(f"{stamp}   launch of {data.get('instance_type', 'an instance')} in {data.get('region', '?')} failed "
                  f"(attempt {data.get('attempt')}): {data.get('code')}; {retry}", file=stream, flush=True)
        elif kind == "provider" and data.get("event") == ProviderEvent.LAUNCH_FAILED:
            print(f"{stamp}   launch of {data.get('instance')} given up: {data.get('error')}", file=stream, flush=True)
        elif kind == "provider" and data.get("event") == ProviderEvent.TERMINATED:
            what = "was interrupted (spot reclaim)" if data.get("reason") == Release.INTERRUPTED else "was lost"
            name = " ".join(x for x in (data.get("instance"), data.get("ec2_id")) if x)
            print(f"{stamp}   instance {name} {what}; a replacement is on its way",
                  file=stream, flush=True)
        elif kind == "nodes" and "spend_usd" in data:
            print(f"{stamp}   {len(data['instances'])} instance(s) ready, spent ${data['spend_usd']:.4f} so far",
                  file=stream, flush=True)

    return on_event
