"""Draw a sampled timeline as a Gantt chart (instances over time, trials as bars, spot reclaims,
instance types and packed trials)."""

from __future__ import annotations

from rubberband.errors import SpecError
from rubberband.simulator.dag import SPOT
from rubberband.simulator.trace import Timeline
from rubberband.units import format_duration

RECLAIM = "#d62728"       # reclaims, lost work and the line to the replacement
SPOT_EDGE = "#ff7f0e"     # the outline of a spot instance's life


WAIT = "#f3e3c3"          # a replacement up before the instance it replaces is gone: waiting, not INIT


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
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError:
        raise SpecError("--gantt: needs matplotlib; install it with `pip install 'rubberband[plot]'`") from None
    rows = len(timeline.instances)
    fig, ax = plt.subplots(figsize=(11, max(2.5, 0.32 * rows + 1.5)))
    colors = plt.get_cmap("tab10")
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
            ax.plot([span.requested_s, gone], [old.instance, old.instance], color=RECLAIM, linewidth=1.5,
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
                ax.barh(y, trial.end_s - trial.lost_from_s, left=trial.lost_from_s, height=0.85 * height,
                        color="white", alpha=0.8, hatch="////", edgecolor=RECLAIM, linewidth=0.0)
    for start, _, _ in timeline.stages:
        ax.axvline(start, color="black", linewidth=0.4, linestyle=":")
    markets = {span.instance: span.market for span in timeline.instances}
    types = {span.instance: span.instance_type for span in timeline.instances}
    several = len(set(types.values())) > 1
    labels = {i: " ".join([str(i), *([types[i]] if several else []), *([markets[i]] if SPOT in markets.values() else [])])
              for i in markets}
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
    ax.set_xlabel("seconds since the job started")
    ax.set_ylabel("instance (launch order)")
    head = title or f"sample {timeline.sample} of {timeline.samples}: JCT {format_duration(timeline.jct_s)}"
    if SPOT in markets.values():
        head += f", {timeline.reclaims} spot reclaim{'' if timeline.reclaims == 1 else 's'}"
    packed = sorted({(t.stage, t.trials_per_gpu) for t in timeline.trials if t.trials_per_gpu > 1})
    if packed:
        head += ", packed: " + ", ".join(f"stage {i} {k}/GPU" for i, k in packed)
    ax.set_title(head + "\nlight grey: SCALE, dark grey: INIT, bars: trials coloured by stage", fontsize="medium")
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


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
