"""`rubberband report RUN_DIR`: a finished run's predicted-vs-actual table again (``--json``: its
``result.json``), and with ``--gantt`` its actual timeline drawn above the predicted one.

A run directory (``runs/<run id>/``, which ``run`` prints; a rehearsal writes one too) holds
``plan.json``, ``result.json`` (ledger, stages, trials, the closed loop's re-plans),
``provider/events.jsonl`` (local and aws: the provider's own records, for the spot notices) and
``model_profile.json`` (the model profile the plan was made from, to draw the predicted run).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rubberband.cli.common import IMAGE_TYPES, command, emit, output_path
from rubberband.errors import SpecError
from rubberband.units import format_duration, format_usd

MODEL_FILE = "model_profile.json"
RESULT_FILE = "result.json"


def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run's directory, runs/<run id> (`run` prints it at its end)")
    p.add_argument("--gantt", metavar="PNG",
                   help="draw the actual run (from its ledger) above the predicted median run to this image file")


def report_cmd(args: argparse.Namespace) -> int:
    from rubberband.executor.report import RunResult

    output_path(args.gantt, "--gantt", "actual.png", IMAGE_TYPES)
    run_dir, data = load_result(args.run_dir)
    text = run_summary(RunResult.from_dict(data))
    payload = dict(data)
    if args.gantt:
        text += "\n" + draw_run(run_dir, data, args.gantt)
        payload["gantt"] = args.gantt
    emit(args, payload, text)
    return 0


def run_summary(result) -> str:
    """What ``run`` prints at its end: the predicted-vs-actual table (``RunResult.table``) and
    where the run's files are."""
    return result.table() + f"\nrun directory: {result.run_dir}"


def load_result(path: str) -> tuple[Path, dict[str, Any]]:
    """The run directory ``path`` and its ``result.json``.

    Raises:
        SpecError: naming the path and the fix, for no directory, a run that has not finished
            (no ``result.json``: still running, or killed) or a file that is no run's result.
    """
    where = Path(path)
    if where.is_file() and where.name == RESULT_FILE:
        where = where.parent
    if not where.exists():
        raise SpecError(f"RUN_DIR: {path!r} does not exist; give a run's directory, runs/<run id>, as `rubberband run` "
                        "prints it at its end")
    if not where.is_dir():
        raise SpecError(f"RUN_DIR: {path!r} is a file, not a run's directory; give runs/<run id> as `rubberband run` prints it")
    result = where / RESULT_FILE
    if not result.exists():
        if (where / "plan.json").exists():
            raise SpecError(f"RUN_DIR: {path!r} has no {RESULT_FILE}: the run has not finished (it is still running, "
                            "or was killed before its end); wait for it to end, or run it again")
        raise SpecError(f"RUN_DIR: {path!r} is not a run's directory (no {RESULT_FILE}, no plan.json); give runs/<run id> "
                        "as `rubberband run` prints it")
    try:
        data = json.loads(result.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SpecError(f"RUN_DIR: cannot read {str(result)!r} ({getattr(exc, 'strerror', None) or exc}); "
                        "it was cut short: run the job again") from None
    missing = [k for k in ("predicted", "actual", "stages", "ledger") if not isinstance(data, dict) or k not in data]
    if missing:
        raise SpecError(f"RUN_DIR: {str(result)!r} is no run's result (no {', '.join(missing)}); give the directory "
                        "of a run `rubberband run` made")
    return where, data


def keep_model(run_dir: str | Path, model, target=None) -> None:
    """Write the model profile(s) a plan was made from into its run directory (``MODEL_FILE``),
    so that ``report --gantt`` can draw the predicted run beside the actual one; ``target``: a
    surrogate job's target stage's profile (DESIGN §4.6), kept beside the surrogate's ``model``."""
    body = {"models": {k: m.to_dict() for k, m in model.items()}} if isinstance(model, dict) \
        else {"model_profile": model.to_dict()}
    if target is not None:
        body["target_model_profile"] = {k: m.to_dict() for k, m in target.items()} if isinstance(target, dict) \
            else target.to_dict()
    (Path(run_dir) / MODEL_FILE).write_text(json.dumps(body, indent=2))


def write_rehearsal(runs_dir: str | Path, data: dict[str, Any], plan, model, target=None) -> Path:
    """Write a rehearsal's run directory as a run writes its own (``runs_dir/<run id>-sim``:
    ``plan.json``, ``result.json`` with ``data``, ``MODEL_FILE``), so that ``report`` reads it;
    ``data``'s ``run_id`` and ``run_dir`` are set to it."""
    from rubberband.executor.run import new_run_id

    run_dir = Path(runs_dir).resolve() / f"{new_run_id()}-sim"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"--runs-dir: cannot create {str(run_dir)!r} ({exc.strerror or exc}); "
                        "give a writable directory") from None
    data["run_id"], data["run_dir"] = run_dir.name, str(run_dir)
    (run_dir / "plan.json").write_text(plan.to_json())
    (run_dir / RESULT_FILE).write_text(json.dumps(data, indent=2, default=str))
    keep_model(run_dir, model, target)
    return run_dir


def _read_model(run_dir: Path):
    """The model profile(s) ``keep_model`` wrote, or ``None`` (a run from before it did); a
    surrogate job's: ``(model, target)``."""
    from rubberband.profiles.model import ModelProfile

    path = run_dir / MODEL_FILE
    if not path.exists():
        return None
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        target = body.get("target_model_profile")
        if target is not None:
            target = ModelProfile.from_dict(target, where=f"{path}.target_model_profile") if "name" in target else \
                {k: ModelProfile.from_dict(m, where=f"{path}.target_model_profile.{k}") for k, m in target.items()}
        model: ModelProfile | dict[str, ModelProfile] = \
            {k: ModelProfile.from_dict(m, where=f"{path}.models.{k}") for k, m in body["models"].items()} \
            if "models" in body else ModelProfile.from_dict(body["model_profile"], where=str(path))
        return model if target is None else (model, target)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecError(f"RUN_DIR: cannot read {str(path)!r} ({exc}); delete it to draw the actual run alone") from None


def _read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The provider's events (``provider/events.jsonl``), the lines that parse; none for a rehearsal."""
    path = run_dir / "provider" / "events.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue         # a line the provider was writing when it was killed
        if isinstance(event, dict) and "t" in event:
            out.append(event)
    return out


def predicted_timeline(plan, model, target=None):
    """The predicted run ``simulate --gantt`` draws for ``plan``: its median sample by JCT,
    simulated as the plan says (``simulate_plan``), and the title ``simulate`` gives it."""
    from rubberband.cli.simulate_cmd import gantt_title
    from rubberband.plan.plan import simulate_plan
    from rubberband.simulator.trace import median_sample, sample_timeline

    samples = plan.samples or 1000
    result = simulate_plan(plan, model, samples=samples, target_model=target)
    k = median_sample(result.jct_s.tolist())
    sim = plan.simulation_args()
    timeline = sample_timeline(plan.spec, plan.allocation, model, sim["cloud"], seed=plan.seed, samples=samples, sample=k,
                               instances=sim["instances"], spot_instances=sim["spot_instances"],
                               trials_per_gpu=sim["trials_per_gpu"], instance_types=sim["instance_types"],
                               fused_per_gpu=sim["fused_per_gpu"], target_model=target)
    return timeline, gantt_title("predicted", "median", k, samples, plan.seed, result, timeline.jct_s)


def draw_run(run_dir: str | Path, data: dict[str, Any], png: str) -> str:
    """Draw the run of ``run_dir`` (its ``result.json`` is ``data``) to ``png``: the actual run
    above, the predicted median run below when the run directory has the model profile.

    Returns:
        The line to print: what was written, and why a panel was left out.
    """
    from rubberband.cli.gantt import draw_run_gantt, run_chart
    from rubberband.plan.plan import Plan

    run_dir = Path(run_dir)
    plan = None
    if (run_dir / "plan.json").exists():
        try:
            plan = Plan.from_json((run_dir / "plan.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SpecError) as exc:
            raise SpecError(f"RUN_DIR: cannot read {str(run_dir / 'plan.json')!r} ({exc}); the run directory is damaged") from None
    model = _read_model(run_dir)
    spot = getattr(plan.cloud, "spot", None) if plan is not None else None
    chart = run_chart(data, _read_events(run_dir), notice_s=float(getattr(spot, "notice_s", 0.0) or 0.0))
    actual, predicted = data["actual"], data["predicted"]
    reclaims = chart.timeline.reclaims
    title = (f"actual run {data.get('run_id', run_dir.name)}: JCT {format_duration(actual['jct_s'])} "
             f"(predicted mean {format_duration(predicted['jct_s'])}),\ncost {format_usd(actual['cost_usd'])} "
             f"(predicted mean {format_usd(predicted['cost_usd'])})")
    note = ""
    if plan is None or model is None:
        missing = "plan.json" if plan is None else MODEL_FILE
        draw_run_gantt(chart, png, title=title)
        note = f"; the predicted run is left out: {run_dir} has no {missing} (`rubberband run` writes it)"
    else:
        timeline, predicted_title = predicted_timeline(plan, *(model if isinstance(model, tuple) else (model,)))
        draw_run_gantt(chart, png, timeline, title=title, predicted_title=predicted_title, init_s=plan.cloud.init_latency_s)
    where = "" if note else " above the predicted median run"
    n, k = len(chart.timeline.instances), len(chart.timeline.trials)
    return (f"wrote {png}: the actual run ({_count(n, 'instance')}, {_count(k, 'TRAIN')}, "
            f"{_count(reclaims, 'spot reclaim')}){where}{note}")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


report_cmd.arguments = _report_args  # type: ignore[attr-defined]
command("report", "a finished run again: predicted vs actual, and its timeline drawn with --gantt")(report_cmd)
