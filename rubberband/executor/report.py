"""RunResult: what a real run did next to what its plan predicted."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rubberband.units import format_duration, format_usd


def stage_entry(plan: Any, index: int, ledger: Any, *, trials: int, promoted: list[str], duration_s: float,
                instances: int, cost_usd: float, spot_instances: int, gpus_per_trial: int | None = None) -> dict[str, Any]:
    """One stage of a run's ``RunResult.stages`` (a real run's and a rehearsal's alike): what it
    ran on (the types of its TRAINs in ``ledger``; the plan's when none ran), predicted vs actual.
    ``gpus_per_trial``: what the stage ran at, where a re-plan changed it (default: the plan's)."""
    from rubberband.providers.base import Release

    pred, planned = plan.predicted.stages[index], plan.stage_clouds[index].instance_type
    ran_on = "+".join(dict.fromkeys(t.instance_type or planned for t in ledger.trials if t.stage == index)) or planned
    return {
        "index": index, "trials": trials, "instance_type": ran_on,
        "gpus_per_trial": plan.gpus_per_trial[index] if gpus_per_trial is None else gpus_per_trial,
        "promoted": promoted,
        **({"fused_per_gpu": plan.fusion[index]} if plan.fusion[index] > 1 else {}),
        "predicted": {"duration_s": pred.mean_duration_s, "instances": pred.instances, "cost_usd": pred.mean_cost_usd,
                      "spot_instances": plan.spot_counts[index], "instance_type": planned,
                      **({"redone": pred.redone} if getattr(pred, "redone", 0) else {})},   # per trial (DESIGN §4)
        "actual": {"duration_s": duration_s, "instances": instances, "cost_usd": cost_usd, "spot_instances": spot_instances,
                   "reclaimed": sum(1 for r in ledger.instances.values() if r.stage_released == index
                                    and r.release_reason == Release.INTERRUPTED)},
    }


def surrogate_summary(plan: Any, trials: dict[str, Any], stages: list[dict[str, Any]], metric: str,
                      width_ratio: int | None = None, narrow: Any = None) -> dict[str, Any]:
    """A surrogate job's parts (DESIGN §4.6), for ``RunResult.surrogate``: the surrogate winner
    (its trial, config and surrogate metric), the target trial that trained its config at full
    width (config and final metric; ``None`` when the run stopped before it), and what each part
    took and cost, predicted and actual (the tuning stages' sum, the target stage's).
    ``narrow(config)``: the config the winner's model was built from (widths divided), when known.
    Empty for a job without a target stage."""
    from rubberband.scheduler import is_superseded, is_target_trial, surrogate_winner

    target_stage = plan.spec.target_stage
    if target_stage is None:
        return {}
    # An eager target restarted with the winner's config (DESIGN §4.6) is superseded: the one that
    # stands is the job's; the superseded one is listed under ``restarted``.
    targets = [t for t in trials if is_target_trial(t)]
    target = next((t for t in targets if not is_superseded(t, trials[t].get("eliminated_after"), target_stage)),
                  targets[-1] if targets else None)
    superseded = [t for t in targets if t != target]
    winner = surrogate_winner(target) if target is not None else None

    def trial(tid: str | None, **extra: Any) -> dict[str, Any] | None:
        if tid is None or tid not in trials:
            return None
        t = trials[tid]
        return {"trial": tid, "config": t["config"], "metric": t["metric"], "metric_name": metric, "step": t["step"],
                **extra}

    def part(indices: range) -> dict[str, float]:
        # Predicted: the plan's, stages run or not (a run that stopped before its target still
        # shows what the target was planned to cost); actual: the stages that ran.
        pred = [plan.predicted.stages[i] for i in indices]
        ran = [s for s in stages if s["index"] in indices]
        return {"predicted_cost_usd": sum(p.mean_cost_usd for p in pred),
                "predicted_duration_s": sum(p.mean_duration_s for p in pred),
                "actual_cost_usd": sum(s["actual"]["cost_usd"] for s in ran),
                "actual_duration_s": sum(s["actual"]["duration_s"] for s in ran)}

    model = {"model_config": narrow(trials[winner]["config"])} if narrow and winner in trials else {}
    eager = plan.spec.eager
    handed = superseded[0] if superseded else target
    return {"width_ratio": width_ratio, "target_stage": target_stage,
            "winner": trial(winner, **model), "target": trial(target, iters=plan.spec.stages[target_stage].iters),
            "cost": {"tuning": part(range(target_stage)), "target": part(range(target_stage, target_stage + 1))},
            **({"eager_transfer": {**eager.to_dict(), "handed_over": handed, "restarted": bool(superseded)}}
               if eager is not None else {})}


def surrogate_lines(surrogate: dict[str, Any]) -> list[str]:
    """``RunResult.table``'s lines for a surrogate job's parts."""
    if not surrogate:
        return []
    ratio = surrogate.get("width_ratio")
    narrow = f"width / {ratio}" if ratio else "narrow"
    lines = []
    win, tgt = surrogate.get("winner"), surrogate.get("target")
    if win:
        built = f" (built from {win['model_config']})" if win.get("model_config") else ""
        lines.append(f"surrogate winner {win['trial']} ({narrow}): {win['metric_name']} = {win['metric']:.4g}  "
                     f"config {win['config']}{built}")
    if tgt:
        metric = "-" if tgt["metric"] is None else f"{tgt['metric']:.4g}"
        iters = f", {tgt['iters']} iterations" if "iters" in tgt else ""
        lines.append(f"target trial {tgt['trial']} (full width, from scratch{iters}): "
                     f"{tgt['metric_name']} = {metric}  config {tgt['config']}")
    else:
        lines.append("target trial: not run (the job stopped before its target stage)")
    eager = surrogate.get("eager_transfer")
    if eager and eager.get("handed_over"):
        verdict = ("restarted with the winner's config at the tuning's end" if eager.get("restarted")
                   else "kept: the winner was the leader it started with")
        lines.append(f"eager transfer: {eager['handed_over']} started at the SYNC ending stage {eager['after_stage']}, "
                     f"{verdict} (the model's restart probability {eager['restart_probability']:.2g})")
    for name, c in surrogate.get("cost", {}).items():
        lines.append(f"{name:8s} predicted {format_usd(c['predicted_cost_usd'])} in "
                     f"{format_duration(c['predicted_duration_s'])}, actual {format_usd(c['actual_cost_usd'])} in "
                     f"{format_duration(c['actual_duration_s'])}")
    return lines


@dataclass
class RunResult:
    """A finished run: the best trial, every trial's history, the ledger, and predicted vs actual.

    ``predicted`` and ``actual`` hold ``jct_s`` and ``cost_usd``; ``stages`` lists per stage
    the predicted and actual duration, instances and cost (and the instance type it ran on,
    ``predicted.instance_type`` the plan's); ``best``
    has ``config`` and ``metric``; with several instance types, ``ledger["by_type"]`` holds
    each type's ledger.
    """

    run_id: str
    run_dir: str
    best: dict[str, Any]
    predicted: dict[str, float]
    actual: dict[str, float]
    stages: list[dict[str, Any]]
    trials: dict[str, Any]
    ledger: dict[str, Any]
    plan: dict[str, Any] = field(default_factory=dict)
    # What the closed loop reports (deadline_s, met_deadline, replans, safety_net, stopped,
    # budget_usd, budget_left_usd): the same keys as a rehearsal's.
    loop: dict[str, Any] = field(default_factory=dict)
    # The driver's events in order ({t: seconds since the start, event, ...}): stages, nodes
    # warm, TRAIN starts, SYNCs, re-plans, notices, replacements.
    timeline: list[dict[str, Any]] = field(default_factory=list)
    # A surrogate job's parts (``surrogate_summary``): winner, target trial, cost of each; else empty.
    surrogate: dict[str, Any] = field(default_factory=dict)

    def error(self, key: str) -> float:
        """Relative error of the prediction: (actual - predicted) / predicted."""
        return (self.actual[key] - self.predicted[key]) / self.predicted[key] if self.predicted[key] else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "run_dir": self.run_dir, "best": self.best, "predicted": self.predicted,
            "actual": self.actual, "error": {k: self.error(k) for k in ("jct_s", "cost_usd")},
            "stages": self.stages, "trials": self.trials, "ledger": self.ledger, "plan": self.plan, **self.loop,
            "timeline": self.timeline, **({"surrogate": self.surrogate} if self.surrogate else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """The result ``to_dict`` wrote (``result.json``): the keys beside the fields are the loop's
        (``error`` is computed again)."""
        own = ("run_id", "run_dir", "best", "predicted", "actual", "stages", "trials", "ledger", "plan", "timeline",
               "surrogate")
        return cls(**{k: data[k] for k in own if k in data},
                   loop={k: v for k, v in data.items() if k not in own and k != "error"})

    def save(self, path: str | Path | None = None) -> Path:
        path = Path(path) if path else Path(self.run_dir) / "result.json"
        path.write_text(json.dumps(self.to_dict(), indent=2, default=str))
        return path

    def table(self) -> str:
        from rubberband.render import render

        by_type = self.ledger.get("by_type") or {}
        fused = any(s.get("fused_per_gpu", 1) > 1 for s in self.stages)
        rows = []
        for s in self.stages:
            planned, ran = s["predicted"].get("instance_type"), s.get("instance_type", "")
            kind = ran if planned in (None, ran) else f"{planned}→{ran}"     # a re-plan moved the stage
            rows.append([s["index"], s["trials"], s["gpus_per_trial"], *([s.get("fused_per_gpu", 1)] if fused else []),
                         *([kind] if by_type else []),
                         s["predicted"]["instances"], s["actual"]["instances"],
                         format_duration(s["predicted"]["duration_s"]), format_duration(s["actual"]["duration_s"]),
                         format_usd(s["predicted"]["cost_usd"]), format_usd(s["actual"]["cost_usd"])])
        lines = [render(["stage", "trials", "GPUs/trial", *(["fused/GPU"] if fused else []), *(["type"] if by_type else []),
                         "inst pred", "inst real",
                         "time pred", "time real", "cost pred", "cost real"], rows, title="predicted vs actual")]
        for s in self.stages:
            if s.get("fused_per_gpu", 1) > 1:
                lines.append(f"stage {s['index']}: {s['fused_per_gpu']} trials fused per GPU (one program per GPU)")
        lines.append(
            f"JCT  predicted {format_duration(self.predicted['jct_s'])}  actual {format_duration(self.actual['jct_s'])}  "
            f"({self.error('jct_s'):+.1%})"
        )
        lines.append(
            f"cost predicted {format_usd(self.predicted['cost_usd'])}  actual {format_usd(self.actual['cost_usd'])}  "
            f"({self.error('cost_usd'):+.1%})"
        )
        if self.stages:
            lines.append("instances per stage  planned " + ",".join(str(s["predicted"]["instances"]) for s in self.stages)
                         + "  actual " + ",".join(str(s["actual"]["instances"]) for s in self.stages))
        for market, m in (self.ledger.get("markets") or {}).items():
            lines.append(f"{market:9s} {m['instances']} instance(s) at {format_usd(m['price_usd_per_hour'])}/h, "
                         f"{m['reclaimed']} reclaimed, {format_usd(m['cost_usd'])}")
        for name, t in by_type.items():
            launched = sum(m["instances"] for m in t["markets"].values())
            lines.append(f"{name}: {launched} instance(s) launched, {format_usd(t['cost_usd'])}")
        for replan in self.loop.get("replans", []):
            lines.append(replan["line"])
        for switch in self.loop.get("safety_net", []):
            lines.append(switch["line"])
        redone = sum(t.get("redone", 0) for t in self.trials.values())
        expected = sum(s["trials"] * s["predicted"].get("redone", 0) for s in self.stages)
        if redone or expected:
            lines.append(f"redone iterations  predicted {expected}  actual {redone} (trained again on resuming from a "
                         "checkpoint older than the stage's end)")
        if self.loop.get("budget_usd") is not None:
            lines.append(f"budget {format_usd(self.loop['budget_usd'])}: {format_usd(self.loop['budget_left_usd'])} left")
        if self.loop.get("stopped"):
            lines.append(f"stopped: {self.loop['stopped']}")
        lines += surrogate_lines(self.surrogate)
        if self.best:
            lines.append(f"best trial {self.best['trial']}: {self.best['metric_name']} = {self.best['metric']:.4g}  config {self.best['config']}")
        return "\n".join(lines)
