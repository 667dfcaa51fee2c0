"""Draw a sampled timeline as a Gantt chart (instances over time, trials as bars, spot reclaims,
instance types and packed trials), and a finished run's actual timeline, from its ledger, above
the predicted one."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rubberband.errors import SpecError
from rubberband.providers.base import Release
from rubberband.simulator.dag import SPOT
from rubberband.simulator.trace import InstanceSpan, Timeline, TrialSpan
from rubberband.units import format_duration

RECLAIM = "#d62728"       # reclaims, lost work and the line to the replacement
SPOT_EDGE = "#ff7f0e"     # the outline of a spot instance's life


WAIT = "#f3e3c3"          # a replacement up before the instance it replaces is gone: waiting, not INIT


def _pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecError("--gantt: needs matplotlib; install it with `pip install 'rubberband[plot]'`") from None
    return plt


def gantt_figure(timeline: Timeline, title: str = "", init_s=None):
    """A matplotlib figure: one row per instance, SCALE/INIT phases shaded, trials as coloured bars.

    A trial is drawn on every instance its GPUs are on, in its own lane of the row, so trials
    sharing an instance do not hide each other. Spot instances (labelled "spot", outlined in
    orange) end at their reclaim, marked with a red x; the work an interrupted TRAIN lost
    since its last checkpoint is hatched red. A red line on the reclaimed instance's row runs
    from the replacement's request (at the notice) to the reclaim, and a dotted one leads from
    there to the replacement's row, whose SCALE and INIT follow; then the TRAIN resumes.
    A replacement that is initialised before the instance it replaces is gone waits for it (its
    trials resume at the reclaim): with ``init_s`` (the cloud's INIT latency, when constant) that
    wait is drawn apart from its INIT; without, the two are drawn together as the wait. Every row
    is labelled with its instance number (and its type when a plan uses several, its market on
    spot). Packed trials (``k`` to a GPU) take ``k`` adjacent lanes of their GPU; the title says
    which stages pack.
    """
    plt = _pyplot()
    rows = len(timeline.instances)
    fig, ax = plt.subplots(figsize=(11, max(2.5, 0.32 * rows + 1.5)))
    head = title or f"sample {timeline.sample} of {timeline.samples}: JCT {format_duration(timeline.jct_s)}"
    draw_timeline(ax, timeline, head, init_s)
    ax.set_xlabel("seconds since the job started")
    fig.tight_layout()
    return fig


def draw_timeline(ax, timeline: Timeline, head: str, init_s=None, labels: dict[int, str] | None = None,
                  notices: Mapping[int, float] | None = None) -> None:
    """Draw ``timeline`` on ``ax`` as ``gantt_figure`` describes, titled ``head`` (the reclaims
    and packed stages added); ``labels``: each row's label instead of its number, type and market;
    ``notices``: when a reclaimed instance was noticed, where that is not its replacement's request."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    rows = len(timeline.instances)
    colors = _stage_colors()
    by_id = {span.instance: span for span in timeline.instances}
    waits = False
    for span in timeline.instances:
        y = span.instance
        if span.replaces is not None:
            # The request: at the notice on the reclaimed instance's row (a red line to its
            # reclaim, or to the SYNC that released it first), then down to the replacement's
            # row, where its SCALE begins (a replacement the SYNC cancelled too).
            old = by_id[span.replaces]
            gone = old.reclaimed_s if old.reclaimed_s is not None else old.released_s
            noticed = (notices or {}).get(old.instance, span.requested_s)
            ax.plot([min(noticed, gone), gone], [old.instance, old.instance], color=RECLAIM, linewidth=1.5,
                    zorder=4)
            ax.plot([span.requested_s, span.requested_s], [old.instance, y], color=RECLAIM, linestyle=":",
                    linewidth=0.9, zorder=4)
        if span.cancelled:        # asked for, then released before its SCALE ended
            ax.barh(y, span.released_s - span.requested_s, left=span.requested_s, color="#eeeeee", height=0.8)
            continue
        ax.barh(y, span.launched_s - span.requested_s, left=span.requested_s, color="#dddddd", height=0.8)
        init_end = _init_end(span, by_id, init_s)
        if init_end > span.launched_s:
            ax.barh(y, init_end - span.launched_s, left=span.launched_s, color="#aaaaaa", height=0.8)
        wait_end = _wait_end(span, by_id, init_end)
        if wait_end > init_end:
            waits = True
            ax.barh(y, wait_end - init_end, left=init_end, color=WAIT, height=0.8)
        spot = span.market == SPOT
        ax.barh(y, span.released_s - span.ready_s, left=span.ready_s, color="none",
                edgecolor=SPOT_EDGE if spot else "#555555", height=0.8, linewidth=0.9 if spot else 0.5)
        if span.reclaimed_s is not None:
            ax.plot([span.reclaimed_s], [y], marker="x", color=RECLAIM, markersize=9, markeredgewidth=2, zorder=5)
    lanes: dict[int, int] = {}
    for trial in timeline.trials:
        lanes[trial.stage] = max(lanes.get(trial.stage, 1), trial.lane + 1)
    for trial in timeline.trials:
        height = 0.8 / lanes[trial.stage]
        for instance in trial.instances:
            lane_y = instance - 0.4 + (trial.lane + 0.5) * height
            ax.barh(lane_y, trial.end_s - trial.start_s, left=trial.start_s, height=0.85 * height,
                    color=colors(trial.stage % 10), alpha=0.7, edgecolor="black", linewidth=0.2)
            if trial.lost_from_s is not None:
                ax.barh(lane_y, trial.end_s - trial.lost_from_s, left=trial.lost_from_s, height=0.85 * height,
                        color="white", alpha=0.8, hatch="////", edgecolor=RECLAIM, linewidth=0.0)
    for start, _, _ in timeline.stages:
        ax.axvline(start, color="black", linewidth=0.4, linestyle=":")
    markets = {span.instance: span.market for span in timeline.instances}
    types = {span.instance: span.instance_type for span in timeline.instances}
    several = len(set(types.values())) > 1
    labels = labels or {i: " ".join([str(i), *([types[i]] if several else []),
                                     *([markets[i]] if SPOT in markets.values() else [])]) for i in markets}
    # Every row labelled, however many (the tick font shrinks with them).
    ax.set_yticks(sorted(labels), [labels[i] for i in sorted(labels)], fontsize=max(4.0, min(10.0, 400 / max(rows, 1))))
    handles = []
    if SPOT in markets.values():
        handles = [Patch(facecolor="none", edgecolor=SPOT_EDGE, label="spot instance"),
                   Line2D([], [], marker="x", color=RECLAIM, linestyle="none", markeredgewidth=2, label="reclaim"),
                   Patch(facecolor="white", hatch="////", edgecolor=RECLAIM, label="work lost"),
                   Line2D([], [], color=RECLAIM, linewidth=1.5, label="notice: replacement\nrequested (dotted)")]
    if waits:
        handles.append(Patch(facecolor=WAIT, label="waiting for the instance\nit replaces"
                             + ("" if init_s is not None else "\n(INIT included)")))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    ax.set_ylabel("instance (launch order)")
    if SPOT in markets.values():
        head += f", {timeline.reclaims} spot reclaim{'' if timeline.reclaims == 1 else 's'}"
    fused: dict[int, int] = {}           # stage -> its largest fused group
    for t in timeline.trials:
        if t.fused > 1:
            fused[t.stage] = max(fused.get(t.stage, 1), t.fused, t.trials_per_gpu)
    packed = sorted({(t.stage, t.trials_per_gpu) for t in timeline.trials if t.trials_per_gpu > 1 and t.stage not in fused})
    shares = ([f"packed: {', '.join(f'stage {i} {k}/GPU' for i, k in packed)}"] if packed else []) + \
        ([f"fused: {', '.join(f'stage {i} {f}/GPU' for i, f in sorted(fused.items()))}"] if fused else [])
    if shares:           # a line of its own: beside the JCT it ran past the figure's width
        head += "\n" + ", ".join(shares)
    ax.set_title(head + "\nlight grey: SCALE, dark grey: INIT, bars: trials coloured by stage", fontsize="medium")
    ax.invert_yaxis()


def _stage_colors():
    """The colour of each stage's trials (tab10, by stage index)."""
    import matplotlib.pyplot as plt

    return plt.get_cmap("tab10")


def _init_end(span, by_id, init_s) -> float:
    """When a span's INIT ended: its ready time, but for a replacement that was ready before the
    instance it replaces was reclaimed (the kernel's ready time is then that reclaim): with a
    constant ``init_s`` (a ``Distribution``) its real end, else its launch (all of it drawn as the wait)."""
    old = by_id.get(span.replaces) if span.replaces is not None else None
    if old is None or old.reclaimed_s is None or span.ready_s > old.reclaimed_s + 1e-9:
        return span.ready_s
    if init_s is not None and getattr(init_s, "is_constant", False):
        return min(span.ready_s, span.launched_s + float(init_s.mean))
    return span.launched_s


def _wait_end(span, by_id, init_end: float) -> float:
    """Until when a replacement initialised by ``init_end`` waits for the instance it replaces
    to be reclaimed (its trials resume there): that reclaim, within its own life; else no wait."""
    old = by_id.get(span.replaces) if span.replaces is not None else None
    if old is None or old.reclaimed_s is None:
        return init_end
    return max(init_end, min(old.reclaimed_s, span.released_s))


def draw_gantt(timeline: Timeline, path: str, title: str = "", init_s=None) -> None:
    """Write ``gantt_figure`` as an image (its type by the file's extension)."""
    import matplotlib.pyplot as plt

    fig = gantt_figure(timeline, title, init_s)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the actual run: its ledger as a timeline, beside the predicted one -----------------------

REPLAN = "#9467bd"        # a re-plan or a safety-net switch of the closed loop
REPLACE_WITHIN_S = 60.0   # a replacement is requested at the notice, or this soon after the reclaim
TIMELINE_EPS_S = 1e-3     # the driver's timeline rounds its times to 0.1 ms


@dataclass(frozen=True)
class RunChart:
    """A finished run as the chart draws it: its ledger as a ``Timeline`` (one row per instance
    in request order, each TRAIN a bar on the instances and GPUs it ran on, one bar per
    instance it ran on when a reclaim moved it), each row's name, the closed loop's marks
    ``(seconds, text)`` (re-plans, safety-net switches), each reclaimed row's notice, and how
    many TRAINs a reclaim moved where the result has no driver timeline to say from where
    (such a bar starts when its last instance was ready)."""

    timeline: Timeline
    names: tuple[str, ...]
    marks: tuple[tuple[float, str], ...] = ()
    moved: int = 0
    notices: dict[int, float] = field(default_factory=dict)     # row -> when its spot notice came


def run_chart(result: Mapping[str, Any], events: Sequence[Mapping[str, Any]] = (), notice_s: float = 0.0) -> RunChart:
    """The chart of a finished run from its ``result.json`` (``result``: the ledger, the trials,
    the driver's ``timeline``) and its provider's events (``provider/events.jsonl``, for the
    spot notices of a result with no timeline; optional).

    Instances are the ledger's: SCALE from request to launch, INIT from launch to usable (its
    workers warm: the driver's ``nodes`` event in ``timeline``; else its ready time, else the
    first TRAIN on it), then held until released; one the
    cloud took back (release reason ``interrupted``) is reclaimed there. Its replacement is the
    first instance of its type requested from its notice (the event's, else ``notice_s`` before
    the reclaim, not before its launch) to ``REPLACE_WITHIN_S`` after the reclaim and not
    replacing another: an inference, as the ledger does not link the two. A TRAIN is drawn on
    the instances of each gang the driver gave it (``timeline``'s ``gang`` events), in the
    lane of the GPU its ranks reported (``gpu_ids``), else in the first free one. Re-plans and
    safety-net switches are marked when the timeline has them (else at the SYNC they
    followed, as ``replans`` says).

    Raises:
        SpecError: for a result without a ledger of instances and TRAINs.
    """
    ledger = result.get("ledger")
    if not isinstance(ledger, Mapping) or not isinstance(ledger.get("instances"), list):
        raise SpecError("result.json: no `ledger.instances`; it is not a result `rubberband run` wrote")
    recs = sorted(ledger["instances"], key=lambda r: r["requested_s"])
    row = {r["instance_id"]: i for i, r in enumerate(recs)}
    jct = float(result.get("actual", {}).get("jct_s", 0.0))
    end = max([jct, *(r["released_s"] for r in recs if r.get("released_s") is not None)])
    placed = {(tid, h["stage"]): h for tid, t in (result.get("trials") or {}).items() for h in t.get("history", [])}
    runs = [(run, _placement(run, placed.get((run["trial"], run["stage"]), {}), row)) for run in ledger.get("trials", [])]
    first_train: dict[int, float] = {}
    for run, (rows, _, _) in runs:
        for i in rows:
            first_train[i] = min(first_train.get(i, math.inf), run["start_s"])

    # INIT runs until the instance is usable, as the model's does: its workers warm (the
    # driver's first ``nodes`` event naming it), not just its raylet up.
    warm: dict[str, float] = {}
    for e in result.get("timeline") or []:
        if isinstance(e, Mapping) and e.get("event") == "nodes" and "t" in e:
            for name in e.get("instances") or []:
                warm.setdefault(name, float(e["t"]))
    spans: list[dict[str, Any]] = []
    for i, r in enumerate(recs):
        released = r["released_s"] if r.get("released_s") is not None else end
        launched = r["launched_s"] if r.get("launched_s") is not None else released    # never launched
        ready = r.get("ready_s")
        if ready is None:
            ready = min(first_train.get(i, released), released)
        if r["instance_id"] in warm:
            ready = min(max(ready, warm[r["instance_id"]]), first_train.get(i, released), released)
        reclaimed = released if r.get("release_reason") == Release.INTERRUPTED and r.get("launched_s") is not None else None
        spans.append(dict(instance=i, requested_s=r["requested_s"], launched_s=launched,
                          ready_s=min(max(ready, launched), released), released_s=released,
                          market=r.get("market") or "on-demand", reclaimed_s=reclaimed, replaces=None,
                          instance_type=r.get("instance_type") or ""))
    driver = [e for e in result.get("timeline") or [] if isinstance(e, Mapping) and "t" in e]
    noticed = {**_notices(events, recs), **{e["instance"]: float(e["t"]) for e in driver if e.get("event") == "notice"}}
    for old in sorted((s for s in spans if s["reclaimed_s"] is not None), key=lambda s: s["reclaimed_s"]):
        since = noticed.get(recs[old["instance"]]["instance_id"], old["reclaimed_s"] - notice_s)
        since = max(since, old["launched_s"])         # no notice comes before the launch
        new = next((s for s in spans if s["instance"] != old["instance"] and s["replaces"] is None
                    and s["instance_type"] == old["instance_type"]
                    and since - 1e-6 <= s["requested_s"] <= old["reclaimed_s"] + REPLACE_WITHIN_S), None)
        if new is not None:
            new["replaces"] = old["instance"]
    instances = tuple(InstanceSpan(**s) for s in spans)

    gangs: dict[str, list[tuple[float, list[int]]]] = {}      # trial -> (when, rows) of each gang it got
    for e in driver:
        if e.get("event") == "gang":
            gangs.setdefault(e["trial"], []).append((float(e["t"]), [row[x] for x in dict.fromkeys(e["instances"]) if x in row]))
    trials, moved = [], 0
    taken: dict[int, list[tuple[float, float, int]]] = {}      # row -> (start, end, lane) drawn so far
    for n, (run, (rows, gpu, per_gpu)) in enumerate(sorted(runs, key=lambda x: (x[0]["start_s"], x[0]["trial"]))):
        if not rows:
            continue
        start, stop = run["start_s"], run["end_s"]
        digits = "".join(ch for ch in str(run["trial"]) if ch.isdigit())
        number = int(digits) if digits else n
        gpus = 1 if per_gpu > 1 else int(round(run["gpus"]))
        for a, b, where, own_gpu in _segments(gangs.get(run["trial"], []), start, stop, rows, gpu):
            b = min(b, *(instances[i].released_s for i in where))    # a reclaim ends it; it resumes elsewhere
            if b <= a:
                continue
            up = max(instances[i].ready_s for i in where)
            if a < up - 1e-6 < b:        # moved by a reclaim, and the driver's record of it is missing
                a, moved = up, moved + 1
            lane = _lane(taken, where, a, b, own_gpu, per_gpu)
            trials.append(TrialSpan(run["stage"], number, tuple(where), lane, gpus, a, b, trials_per_gpu=per_gpu,
                                    fused=per_gpu if placed.get((run["trial"], run["stage"]), {}).get("fused") else 1))
    windows = [tuple(w) for w in ledger.get("stage_windows") or []]
    stages = tuple((a, min([t.start_s for t in trials if t.stage == i] or [a]), b) for i, (a, b) in enumerate(windows))
    timeline = Timeline(instances, tuple(trials), stages, jct, cost_usd=float(result.get("actual", {}).get("cost_usd", math.nan)))
    notices = {row[name]: t for name, t in noticed.items() if name in row}
    marks = tuple(sorted((float(e["t"]), "re-plan" if e["event"] == "replan" else "safety net")
                         for e in driver if e.get("event") in ("replan", "switch"))) if driver \
        else _marks(result, windows, instances)
    return RunChart(timeline, tuple(r["instance_id"] for r in recs), marks, moved, notices)


def _segments(gangs: Sequence[tuple[float, list[int]]], start: float, stop: float, rows: list[int],
              gpu: int | None) -> list[tuple[float, float, list[int], int | None]]:
    """Where a TRAIN ran, piece by piece: ``(from, to, rows, GPU)``. A real run's ledger has
    the rows it finished on (``rows``, on ``gpu``); the driver's ``gang`` events say where it
    was before a reclaim moved it (no GPU recorded there)."""
    moves = [(t, where) for t, where in gangs if start + TIMELINE_EPS_S < t < stop - TIMELINE_EPS_S and where]
    if not moves:
        return [(start, stop, rows, gpu)]
    first = [where for t, where in gangs if t <= start + TIMELINE_EPS_S and where]
    out: list[tuple[float, float, list[int], int | None]] = []
    a, where = start, first[-1] if first else moves[0][1]
    for t, nxt in moves:
        out.append((a, t, where, None))
        a, where = t, nxt
    out.append((a, stop, rows, gpu))
    return out


def _placement(run: Mapping[str, Any], history: Mapping[str, Any], row: Mapping[str, int]) -> tuple[list[int], int | None, int]:
    """Where a TRAIN ran: its rows (each instance once), the GPU its first rank reported (``None``:
    not reported) and its trials per GPU. From the ledger's TRAIN, else its trial's history (a
    ``result.json`` from before the ledger kept placements)."""
    names = run.get("instances") or history.get("instances") or []
    gpu_ids = run.get("gpu_ids") or history.get("gpu_ids")
    per_gpu = int(history.get("trials_per_gpu") or (round(1 / run["gpus"]) if 0 < run["gpus"] < 1 else 1))
    rows = list(dict.fromkeys(row[n] for n in names if n in row))
    gpu = None
    if gpu_ids and names:
        own = [str(g) for name, ids in zip(names, gpu_ids) if name == names[0] for g in (ids or [])]
        if own and all(g.isdigit() for g in own):
            gpu = min(int(g) for g in own) // max(1, len(own))     # in trial slots of its GPU count
    return rows, gpu, max(1, per_gpu)


def _lane(taken: dict[int, list[tuple[float, float, int]]], rows: list[int], start: float, stop: float,
          gpu: int | None, per_gpu: int) -> int:
    """The lane of a TRAIN: its GPU's (``per_gpu`` adjacent lanes a GPU, when packed), the first of
    them free on all its rows; else the first lane free; and take it."""
    def free(lane: int) -> bool:
        return all(not (a < stop - 1e-9 and start < b - 1e-9 and lane == x) for i in rows for a, b, x in taken.get(i, []))

    preferred = [] if gpu is None else list(range(gpu * per_gpu, gpu * per_gpu + per_gpu))
    lane = next((x for x in preferred if free(x)), None)
    if lane is None:
        lane = next(x for x in itertools.count() if free(x))
    for i in rows:
        taken.setdefault(i, []).append((start, stop, lane))
    return lane


def _notices(events: Sequence[Mapping[str, Any]], recs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """When each instance was noticed, in the ledger's seconds: the provider's events are in
    wall-clock seconds, set apart from the ledger's by the first request's."""
    requested = {r["instance_id"]: r["requested_s"] for r in recs}
    zero = next((e["t"] - requested[e["instance"]] for e in events
                 if e.get("event") == "request" and e.get("instance") in requested), None)
    if zero is None:
        return {}
    return {e["instance"]: e["t"] - zero for e in events if e.get("event") == "notice" and "instance" in e}


def _marks(result: Mapping[str, Any], windows: Sequence[tuple[float, float]],
           instances: Sequence[InstanceSpan]) -> tuple[tuple[float, str], ...]:
    """The closed loop's marks: a re-plan at the SYNC it followed (one a reclaim triggered: at
    the stage's first reclaim), a safety-net switch when it happened."""
    out = []
    for r in result.get("replans") or []:
        i = int(r.get("sync", 0))
        if not 0 <= i < len(windows):
            continue
        a, b = windows[i]
        at = b
        if r.get("trigger", "sync") != "sync":
            at = min((s.reclaimed_s for s in instances if s.reclaimed_s is not None and a <= s.reclaimed_s <= b), default=b)
        out.append((at, "re-plan"))
    for sw in result.get("safety_net") or []:
        if sw.get("at_s") is not None:
            out.append((float(sw["at_s"]), "safety net"))
    return tuple(sorted(out))


def run_figure(chart: RunChart, predicted: Timeline | None = None, title: str = "", predicted_title: str = "",
               init_s=None):
    """Two panels on one time axis: the actual run (``chart``) above, the ``predicted`` sample
    below (left out when ``None``), in ``gantt_figure``'s style; re-plans are dashed purple."""
    plt = _pyplot()
    timeline = chart.timeline
    n_act, n_pred = len(timeline.instances), len(predicted.instances) if predicted is not None else 0
    panels = 2 if predicted is not None else 1
    fig, axes = plt.subplots(panels, 1, sharex=True, squeeze=False,
                             figsize=(12, max(4.0, 0.3 * (n_act + n_pred) + 2.2 * panels)),
                             gridspec_kw={"height_ratios": [max(n_act, 3), max(n_pred, 3)][:panels]})
    ax = axes[0][0]
    markets = {s.market for s in timeline.instances}
    types = {s.instance_type for s in timeline.instances}
    labels = {s.instance: " ".join([chart.names[s.instance], *([s.instance_type] if len(types) > 1 else []),
                                    *([s.market] if SPOT in markets else [])]) for s in timeline.instances}
    head = title or f"actual: JCT {format_duration(timeline.jct_s)}"
    if chart.moved:
        head += (f"\n{chart.moved} TRAIN{' a reclaim moved is' if chart.moved == 1 else 's a reclaim moved are'} "
                 "drawn from the move")
    draw_timeline(ax, timeline, _plain(head), labels=labels, notices=chart.notices)
    ax.set_ylabel("instance (request order)")
    for at, text in chart.marks:
        ax.axvline(at, color=REPLAN, linestyle="--", linewidth=1.3, zorder=6)
        ax.annotate(text, (at, 0.0), xycoords=("data", "axes fraction"), xytext=(2, 3), textcoords="offset points",
                    rotation=90, color=REPLAN, fontsize="small", va="bottom")
    if predicted is not None:
        draw_timeline(axes[1][0], predicted, _plain(predicted_title or f"predicted: JCT {format_duration(predicted.jct_s)}"),
                      init_s=init_s)
    axes[-1][0].set_xlabel("seconds since the job started")
    axes[-1][0].tick_params(labelbottom=True)
    fig.tight_layout()
    return fig


def _plain(text: str) -> str:
    """``text`` as matplotlib shows it literally (a ``$`` would start its math mode)."""
    return text.replace("$", r"\$")


def draw_run_gantt(chart: RunChart, path: str, predicted: Timeline | None = None, title: str = "",
                   predicted_title: str = "", init_s=None) -> None:
    """Write ``run_figure`` as an image (its type by the file's extension)."""
    import matplotlib.pyplot as plt

    fig = run_figure(chart, predicted, title, predicted_title, init_s)
    fig.savefig(path, dpi=110)
    plt.close(fig)
