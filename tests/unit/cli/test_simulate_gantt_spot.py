"""The Gantt chart of a spot run: reclaims marked where they happen, lost work hatched, markets in the labels."""

from __future__ import annotations

import numpy as np
import pytest

from rubberband.profiles.cloud import Billing, BillingModel, CloudProfile, DataCost, Market
from rubberband.profiles.distributions import Constant, Normal
from rubberband.profiles.model import ModelProfile
from rubberband.profiles.spot import SpotMarket
from rubberband.simulator.trace import sample_timeline
from rubberband.spec import ExperimentSpec

MODEL = ModelProfile({1: Normal(4.0, 0.4), 2: Normal(2.2, 0.2), 4: Normal(1.3, 0.1), 8: Normal(0.8, 0.08)},
                     trial_startup_s=Normal(8.0, 1.0), sync_s=Constant(1.0), name="m")
CLOUD = CloudProfile(instance_type="p3.8xlarge", gpus_per_instance=4, price_usd_per_hour=12.24,
                     spot_price_usd_per_hour=3.67, market=Market.SPOT, spot=SpotMarket(notice_s=120, rate_per_hour=30.0),
                     provision_latency_s=Normal(30.0, 5.0), init_latency_s=Normal(60.0, 10.0),
                     data=DataCost(0.15, 0.09), billing=Billing(BillingModel.PER_INSTANCE, 1.0, 60.0))


@pytest.fixture(scope="module")
def drawn():
    """A mixed run with reclaims: (timeline, axes)."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from rubberband.cli.gantt import gantt_figure

    spec = ExperimentSpec.sha(num_trials=16, min_iters=2, max_iters=40, eta=2)
    timeline = next(t for k in range(20) if (t := sample_timeline(spec, [16, 8, 8, 16, 8], MODEL, CLOUD, seed=1,
                                                                  samples=20, sample=k, spot_instances=[2, 1, 1, 2, 2]))
                    .reclaims >= 2 and any(a.lost_from_s is not None for a in t.trials))
    fig = gantt_figure(timeline)
    fig.canvas.draw()
    yield timeline, fig.axes[0]
    plt.close(fig)


def test_every_reclaim_is_a_red_x_on_its_instance(drawn):
    timeline, ax = drawn
    marks = sorted((float(line.get_xdata()[0]), float(line.get_ydata()[0])) for line in ax.lines if line.get_marker() == "x")
    want = sorted((s.reclaimed_s, float(s.instance)) for s in timeline.instances if s.reclaimed_s is not None)
    assert len(marks) == len(want) >= 2 and np.allclose(marks, want, rtol=1e-12)


def test_lost_work_is_hatched_from_the_last_checkpoint_to_the_reclaim(drawn):
    timeline, ax = drawn
    hatched = sorted((round(p.get_x(), 6), round(p.get_x() + p.get_width(), 6)) for p in ax.patches if p.get_hatch())
    want = sorted((round(a.lost_from_s, 6), round(a.end_s, 6)) for a in timeline.trials if a.lost_from_s is not None
                  for _ in a.instances)
    assert hatched == want and want


def test_rows_name_their_market_and_the_title_counts_the_reclaims(drawn):
    timeline, ax = drawn
    labels = {int(t.get_position()[1]): t.get_text() for t in ax.get_yticklabels() if t.get_text()}
    markets = {s.instance: s.market for s in timeline.instances}
    assert labels and all(text == f"{row} {markets[row]}" for row, text in labels.items())
    assert {"on-demand", "spot"} <= {text.split()[1] for text in labels.values()}
    assert f", {timeline.reclaims} spot reclaims" in ax.get_title()
    assert [t.get_text() for t in ax.get_legend().get_texts()][:3] == ["spot instance", "reclaim", "work lost"]


def test_a_replacement_is_linked_to_the_instance_it_replaces_at_its_request(drawn):
    timeline, ax = drawn
    spans = {s.instance: s for s in timeline.instances}
    dotted = {(float(line.get_xdata()[0]), tuple(np.asarray(line.get_ydata(), dtype=float)))
              for line in ax.lines if line.get_linestyle() == ":" and len(line.get_xdata()) == 2
              and line.get_xdata()[0] == line.get_xdata()[1]}
    for s in timeline.instances:
        if s.replaces is not None:
            assert (s.requested_s, (float(spans[s.replaces].instance), float(s.instance))) in dotted


# --- issue 21 -------------------------------------------------------------------------------------

INIT_GREY = "#aaaaaa"


def _waiting_timeline():
    """A spot run whose replacements (asked for 300 s before the reclaim, ready in 40 s) wait for
    the instance they replace: a constant INIT, so its end is known."""
    cloud = CLOUD.replace(spot=SpotMarket(notice_s=300, rate_per_hour=6.0), provision_latency_s=Constant(10.0),
                          init_latency_s=Constant(30.0))
    spec = ExperimentSpec.sha(num_trials=16, min_iters=2, max_iters=40, eta=2)
    for k in range(20):
        t = sample_timeline(spec, [16, 8, 8, 16, 8], MODEL, cloud, seed=1, samples=20, sample=k,
                            spot_instances=[2, 1, 1, 2, 2])
        if _waited(t):
            return t, cloud
    raise AssertionError("no replacement waits in 20 samples")


def _waited(timeline):
    """Replacements that were initialised (30 s after launch) well before the instance they replace was reclaimed."""
    spans = {s.instance: s for s in timeline.instances}
    return [s for s in timeline.instances if s.replaces is not None and not s.cancelled
            and spans[s.replaces].reclaimed_s is not None and spans[s.replaces].reclaimed_s > s.launched_s + 31
            and (s.reclaimed_s is None or s.reclaimed_s > spans[s.replaces].reclaimed_s)]


def test_a_replacements_wait_for_the_instance_it_replaces_is_not_drawn_as_init():
    pytest.importorskip("matplotlib")
    import matplotlib.colors as mcolors
    import matplotlib.pyplot as plt

    from rubberband.cli.gantt import gantt_figure

    timeline, cloud = _waiting_timeline()
    fig = gantt_figure(timeline, init_s=cloud.init_latency_s)
    ax = fig.axes[0]
    plt.close(fig)
    grey = mcolors.to_rgba(INIT_GREY)
    init_bars = {round(p.get_y() + p.get_height() / 2): p.get_width() for p in ax.patches
                 if p.get_facecolor() == grey}
    waited = _waited(timeline)
    assert waited
    for s in waited:
        assert init_bars[s.instance] == pytest.approx(30.0)        # INIT only, then the wait drawn apart
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "waiting for the instance\nit replaces" in labels


def test_every_instance_row_is_labelled():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from rubberband.cli.gantt import gantt_figure

    od = CLOUD.replace(market=Market.ON_DEMAND, gpus_per_instance=1, instance_type="p3.2xlarge")
    timeline = sample_timeline(ExperimentSpec.sha(32, 1, 50, 3), [32, 10, 6, 2], MODEL, od, samples=5)
    fig = gantt_figure(timeline)
    fig.canvas.draw()
    ax = fig.axes[0]
    plt.close(fig)
    labelled = {int(t.get_position()[1]) for t in ax.get_yticklabels() if t.get_text()}
    assert labelled == {s.instance for s in timeline.instances} and len(labelled) >= 32


@pytest.mark.parametrize("run", ["median", "p90"])
def test_the_gantt_titles_jct_is_the_tables_quantile(capsys, tmp_path, run):
    pytest.importorskip("matplotlib")
    import json

    from rubberband.cli.main import main
    from rubberband.units import format_duration

    from .helpers import ROOT

    png = tmp_path / "g.png"
    code = main(["simulate", str(ROOT / "experiments" / "resnet101_cifar10.yaml"), "--allocation", "32,20,12,8",
                 "--samples", "40", "--gantt", str(png), "--gantt-run", run, "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0
    quantile = {"median": payload["jct_s_p50"], "p90": payload["jct_s_p90"]}[run]     # 40 samples: between two runs
    assert f"JCT {'p50' if run == 'median' else run} {format_duration(quantile)}" in payload["gantt_title"]
