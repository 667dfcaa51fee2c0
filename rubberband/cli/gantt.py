"""Draw a sampled timeline as a Gantt chart (instances over time, trials as bars)."""

from __future__ import annotations

from rubberband.errors import SpecError
from rubberband.simulator.trace import Timeline


def draw_gantt(timeline: Timeline, path: str, title: str = "") -> None:
    """Write a PNG: one row per instance, SCALE/INIT phases shaded, trials as coloured bars."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecError("--gantt: needs matplotlib; install it with `pip install 'rubberband[plot]'`") from None
    rows = len(timeline.instances)
    fig, ax = plt.subplots(figsize=(11, max(2.5, 0.32 * rows + 1.5)))
    colors = plt.get_cmap("tab10")
    for span in timeline.instances:
        y = span.instance
        ax.barh(y, span.launched_s - span.requested_s, left=span.requested_s, color="#dddddd", height=0.8)
        ax.barh(y, span.ready_s - span.launched_s, left=span.launched_s, color="#aaaaaa", height=0.8)
        ax.barh(y, span.released_s - span.ready_s, left=span.ready_s, color="none", edgecolor="#555555",
                height=0.8, linewidth=0.5)
    for trial in timeline.trials:
        ax.barh(trial.instance, trial.end_s - trial.start_s, left=trial.start_s, height=0.5,
                color=colors(trial.stage % 10), alpha=0.55, edgecolor="black", linewidth=0.2)
    for start, _, _ in timeline.stages:
        ax.axvline(start, color="black", linewidth=0.4, linestyle=":")
    ax.set_xlabel("seconds since the job started")
    ax.set_ylabel("instance (launch order)")
    ax.set_title(title or f"one sampled run: JCT {timeline.jct_s:.0f}s (grey: SCALE, dark grey: INIT, bars: trials by stage)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
