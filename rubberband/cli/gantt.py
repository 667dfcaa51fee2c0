"""Draw a sampled timeline as a Gantt chart (instances over time, trials as bars)."""

from __future__ import annotations

from rubberband.errors import SpecError
from rubberband.simulator.trace import Timeline
from rubberband.units import format_duration


def gantt_figure(timeline: Timeline, title: str = ""):
    """A matplotlib figure: one row per instance, SCALE/INIT phases shaded, trials as coloured bars.

    A trial is drawn on every instance its GPUs are on, in its own lane of the row, so trials
    sharing an instance do not hide each other.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
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
    lanes: dict[int, int] = {}
    for trial in timeline.trials:
        lanes[trial.stage] = max(lanes.get(trial.stage, 1), trial.lane + 1)
    for trial in timeline.trials:
        height = 0.8 / lanes[trial.stage]
        for instance in trial.instances:
            ax.barh(instance - 0.4 + (trial.lane + 0.5) * height, trial.end_s - trial.start_s, left=trial.start_s,
                    height=0.85 * height, color=colors(trial.stage % 10), alpha=0.7, edgecolor="black", linewidth=0.2)
    for start, _, _ in timeline.stages:
        ax.axvline(start, color="black", linewidth=0.4, linestyle=":")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("seconds since the job started")
    ax.set_ylabel("instance (launch order)")
    ax.set_title((title or f"sample {timeline.sample} of {timeline.samples}: JCT {format_duration(timeline.jct_s)}")
                 + "\nlight grey: SCALE, dark grey: INIT, bars: trials coloured by stage", fontsize="medium")
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


def draw_gantt(timeline: Timeline, path: str, title: str = "") -> None:
    """Write ``gantt_figure`` as a PNG."""
    import matplotlib.pyplot as plt

    fig = gantt_figure(timeline, title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
