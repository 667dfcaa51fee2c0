"""`rubberband whatif --budget`: the shortest JCT per budget, as a table, JSON and a plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import assert_one_line_error, run

ROOT = Path(__file__).resolve().parents[3]
CIFAR = str(ROOT / "experiments" / "resnet101_cifar10.yaml")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_whatif_budget_table_shows_each_policy_s_jct(capsys):
    code, out, err = run(capsys, "whatif", CIFAR, "--budget", "5,15,40", "--samples", "200",
                         "--policies", "static,optimal")
    assert code == 0, err
    assert "shortest mean JCT within each budget per policy" in out
    assert "budget (USD)" in out and "optimal JCT" in out and "static/optimal JCT" in out
    rows = {line.split()[0]: line for line in out.splitlines() if line.strip()[:2] in ("5 ", "15", "40")}
    assert "over budget" in rows["5"]
    assert "16m51s" in rows["15"]         # what `plan --budget 15` gives


def test_whatif_budget_json_and_plot_of_jct_over_budget(capsys, tmp_path):
    from rubberband.cli.whatif_cmd import plot_series
    from rubberband.plan import Scenario

    png = tmp_path / "jct.png"
    code, out, err = run(capsys, "whatif", CIFAR, "--budget", "15,40", "--samples", "200", "--policies", "optimal",
                         "--json", "--plot", str(png))
    assert code == 0, err
    data = json.loads(out)
    assert data["axes"] == ["budget_usd"] and [s["budget_usd"] for s in data["scenarios"]] == [15.0, 40.0]
    jcts = [s["jct_s"]["optimal"] for s in data["scenarios"]]
    assert jcts[0] > jcts[1]
    assert all(s["cost_usd"]["optimal"] <= s["budget_usd"] for s in data["scenarios"])
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    # The plotted line is the JCT, not the cost.
    scenarios = [Scenario({"budget_usd": s["budget_usd"]}, s["cost_usd"], s["jct_s"], {}) for s in data["scenarios"]]
    assert plot_series(scenarios, ["budget_usd"], ["optimal"]) == [("optimal", [15.0, 40.0], jcts)]


@pytest.mark.parametrize(("argv", "needle"), [
    (["--budget", "0,20"], "--budget: expected positive amounts of dollars, e.g. 20,50,100"),
    (["--budget", "20,fifty"], "--budget"),
    (["--budget", "20", "--deadline", "20m"], "--budget: a budget sweep plans the shortest JCT per budget, with no "
                                              "deadline; drop --deadline"),
])
def test_bad_budget_sweeps_are_one_line(capsys, argv, needle):
    code, _, err = run(capsys, "whatif", CIFAR, *argv)
    assert code != 0
    assert_one_line_error(err, needle)


def test_a_single_valued_axis_is_never_the_plots_x_axis():
    # issue 21: `whatif --market spot --preemption-rate 0,0.3,2 --plot` drew cost over the one market.
    from rubberband.cli.whatif_cmd import plot_series, whatif_figure
    from rubberband.plan.whatif import Scenario

    rates = [0.0, 0.3, 2.0]
    scenarios = [Scenario({"market": "spot", "preemption_rate": r}, {"optimal": 10.0 + r}, {"optimal": 600.0},
                          {"optimal": (4,)}) for r in rates]
    assert plot_series(scenarios, ["market", "preemption_rate"], ["optimal"]) == [
        ("optimal", rates, [10.0, 10.3, 12.0])]
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    fig = whatif_figure(scenarios, ["market", "preemption_rate"], ["optimal"])
    assert fig.axes[0].get_xlabel() == "reclaims/instance-h"
    plt.close(fig)
