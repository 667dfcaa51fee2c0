"""What-if sweeps over the spot market (DESIGN §4.1): market, reclaim rate, trace zone, notice."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from rubberband import load_experiment
from rubberband.errors import SpecError
from rubberband.plan import whatif
from rubberband.profiles.spot import SpotMarket

ROOT = Path(__file__).resolve().parents[3]
TRACES = str(ROOT / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json")


@cache
def experiment():
    return load_experiment(ROOT / "experiments" / "resnet101_cifar10.yaml")


def sweep(vary, cloud=None, deadline_s=1200.0, **kw):
    exp = experiment()
    return whatif(exp.spec, exp.model, cloud or exp.cloud.replace(spot=SpotMarket(notice_s=120)), deadline_s, vary,
                  ["optimal"], samples=60, seed=0, **kw)


def test_market_and_reclaim_rate_axes():
    scenarios = sweep({"market": ["on-demand", "spot", "auto"], "preemption_rate": [0.0, 2.0]})
    cost = {(s.values["market"], s.values["preemption_rate"]): s.costs["optimal"] for s in scenarios}
    assert cost[("on-demand", 0.0)] == cost[("on-demand", 2.0)]          # never reclaimed
    assert cost[("spot", 0.0)] < cost[("spot", 2.0)] < cost[("on-demand", 0.0)]
    assert cost[("auto", 0.0)] == pytest.approx(cost[("spot", 0.0)])
    assert cost[("auto", 2.0)] <= cost[("spot", 2.0)] + 1e-9


def test_a_longer_notice_never_costs_more_time():
    scenarios = sweep({"market": ["spot"], "preemption_rate": [3.0], "notice_s": [0.0, 120.0]})
    assert scenarios[1].jcts["optimal"] <= scenarios[0].jcts["optimal"] * 1.02


def test_zone_axis_replays_each_zone_s_trace():
    scenarios = sweep({"market": ["spot", "auto"], "zone": ["us-east-1a", "us-west-2b"]}, deadline_s=3600.0,
                      trace_file=TRACES)
    cost = {(s.values["market"], s.values["zone"]): s.costs["optimal"] for s in scenarios}
    assert cost[("spot", "us-east-1a")] is None                # 17% available: spot cannot carry the job
    assert cost[("spot", "us-west-2b")] is not None            # 91%: it can, at a fraction of the price
    assert cost[("auto", "us-west-2b")] == cost[("spot", "us-west-2b")] < cost[("auto", "us-east-1a")]


def test_zone_axis_prices_each_zone_at_its_own_spot_price():
    # A zone replays its trace and, where the profile knows the zone's price (a region file with
    # the account's `zones:` mapping), is priced at it: the same plan, only dearer spot.
    base = experiment().cloud.replace(spot=SpotMarket(notice_s=120))
    priced = base.replace(spot_price_usd_per_hour_by_zone=(("us-west-2b", base.spot_price_usd_per_hour * 2),))
    cheap, dear = (sweep({"market": ["spot"], "zone": ["us-west-2b"]}, cloud=c, deadline_s=3600.0, trace_file=TRACES)[0]
                   for c in (base, priced))
    assert cheap.costs["optimal"] is not None and dear.costs["optimal"] > cheap.costs["optimal"] * 1.5


@pytest.mark.parametrize(("vary", "kw", "pattern"), [
    ({"preemption_rate": [0.3]}, {}, r"preemption_rate: on-demand instances are never reclaimed; sweep --market spot,auto"),
    ({"market": ["spot", "cheap"]}, {}, r"market: unknown market 'cheap'"),
    ({"market": ["auto"], "zone": ["us-east-1b"]}, {"trace_file": TRACES}, r"zone: 'us-east-1b' is not in .*did you mean `us-east-2b`"),
    ({"market": ["auto"], "zone": ["us-east-1a"]}, {}, r"zone: no trace file to replay the zone from"),
])
def test_bad_spot_sweeps_name_the_axis(vary, kw, pattern):
    with pytest.raises(SpecError, match=pattern):
        sweep(vary, **kw)


def test_spot_axes_need_a_spot_price():
    exp = experiment()
    with pytest.raises(SpecError, match=r"market: p3\.8xlarge has no spot_price_usd_per_hour"):
        sweep({"market": ["spot"]}, cloud=exp.cloud.replace(spot_price_usd_per_hour=None))


def test_a_zone_and_a_rate_are_not_swept_together():
    with pytest.raises(SpecError, match=r"zone: a zone's trace and a reclaim rate are two preemption models"):
        sweep({"market": ["spot"], "zone": ["us-west-2b"], "preemption_rate": [0.3]}, trace_file=TRACES)
