"""Choosing the Availability Zone of a spot plan (issue #13 item 5): plan each zone, keep the cheapest."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from rubberband import load_experiment
from rubberband.errors import InfeasibleDeadlineError, SpecError
from rubberband.plan import compile_plan
from rubberband.plan.zones import plan_zones, zone_candidates
from rubberband.profiles.cloud import Market
from rubberband.profiles.spot import SpotMarket, load_trace

ROOT = Path(__file__).resolve().parents[3]
TRACES = ROOT / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json"
KW = {"samples": 40, "seed": 3}


@cache
def experiment():
    return load_experiment(ROOT / "experiments" / "resnet101_cifar10.yaml")


def traced(zone: str = "us-west-2a", **prices):
    c = experiment().cloud
    return c.replace(spot_price_usd_per_hour=0.3 * c.price_usd_per_hour, region="us-west-2",
                     spot=SpotMarket(notice_s=120, trace=load_trace(TRACES, zone), trace_file=str(TRACES), explicit=True),
                     spot_price_usd_per_hour_by_zone=tuple(sorted(prices.items())))


def test_candidates_are_the_trace_zones_of_the_clouds_region():
    assert zone_candidates(traced()) == ["us-west-2a", "us-west-2b", "us-west-2c"]
    assert zone_candidates(traced(), ["us-east-1a", "us-east-1a"]) == ["us-east-1a"]


def test_the_cheapest_zone_wins_and_its_plan_is_exactly_that_zones_plan():
    exp = experiment()
    plan = plan_zones(exp.spec, exp.model, traced(), 3600, zones=["us-east-1a", "us-west-2b"], market="spot", **KW)
    alone = compile_plan(exp.spec, exp.model, traced("us-west-2b").replace(market=Market.SPOT), 3600, **KW)
    # us-east-1a has spot capacity 17% of the time: its plans wait and cost more at the same price.
    assert plan.info["zone"] == plan.cloud.spot.trace.zone == "us-west-2b"
    assert plan.info["zones"]["us-east-1a"] is None or plan.info["zones"]["us-east-1a"] > plan.info["zones"]["us-west-2b"]
    assert plan.allocation == alone.allocation and np.array_equal(plan.predicted.cost_usd, alone.predicted.cost_usd)
    assert [row["zone"] for row in plan.considered if "zone" in row] == (
        ["us-east-1a"] if plan.info["zones"]["us-east-1a"] is not None else [])


def test_a_zones_price_counts_against_its_availability():
    exp = experiment()
    cheap_elsewhere = plan_zones(exp.spec, exp.model, traced(**{"us-west-2b": 9.0, "us-west-2c": 0.5}), 3600,
                                 zones=["us-west-2b", "us-west-2c"], market="spot", **KW)
    assert cheap_elsewhere.info["zone"] == "us-west-2c" and cheap_elsewhere.cloud.hourly_usd == 0.5
    pricey_elsewhere = plan_zones(exp.spec, exp.model, traced(**{"us-west-2b": 0.5, "us-west-2c": 9.0}), 3600,
                                  zones=["us-west-2b", "us-west-2c"], market="spot", **KW)
    assert pricey_elsewhere.info["zone"] == "us-west-2b"


def test_no_zone_meeting_the_deadline_raises_the_closest_zones_error():
    exp = experiment()
    with pytest.raises(InfeasibleDeadlineError, match=r"deadline"):
        plan_zones(exp.spec, exp.model, traced(), 60, zones=["us-west-2a", "us-west-2b"], market="spot", **KW)


def test_bad_zone_choices_are_one_line_errors():
    exp = experiment()
    with pytest.raises(SpecError, match=r"^--zone: 'us-west-2q' is not in .*p3\.2xlarge\.json \(did you mean `us-west-2c`\?\); choose among"):
        zone_candidates(traced(), ["us-west-2q"])
    with pytest.raises(SpecError, match=r"^--zone: choosing a zone replays each zone's availability trace, and the cloud has none"):
        zone_candidates(exp.cloud)
    with pytest.raises(SpecError, match=r"^--zone: .* has no zone in eu-west-1 \(it has us-east-1a"):
        zone_candidates(traced().replace(region="eu-west-1"))
    with pytest.raises(SpecError, match=r"^--zone: zones differ in their spot markets only; plan with --market spot or auto"):
        plan_zones(exp.spec, exp.model, traced(), 3600, market="on-demand", **KW)


def test_a_zone_that_cannot_carry_the_job_is_screened_from_the_fewest_spot_stages_up():
    """us-east-1a has capacity 17% of the time: the fastest plan of every market vector with spot
    stages misses the deadline there. Only all spot and the vectors not containing the spot
    stages of one that failed are simulated; the rest fail without a simulation (``None``)."""
    from rubberband.plan.compile import _screen_zone, market_vectors
    from rubberband.plan.table import StageTable

    exp = experiment()
    cloud = traced("us-east-1a")
    base = StageTable(exp.spec, exp.model, cloud.replace(market=Market.ON_DEMAND), **KW)
    vectors = market_vectors(exp.spec.num_stages())
    screened = _screen_zone(base, vectors, 3600, 0.9)
    spot_vectors = [v for v in vectors if Market.SPOT in v]
    assert set(screened) == set(spot_vectors)
    simulated = [v for v, why in screened.items() if why is not None]
    assert all(isinstance(screened[v], InfeasibleDeadlineError) for v in simulated)
    assert (Market.SPOT,) * 4 in simulated and len(simulated) < len(spot_vectors) / 2
    plan = compile_plan(exp.spec, exp.model, cloud, 3600, confidence=0.9, market="auto", **KW)
    assert not any(plan.spot_counts) and any("all spot cannot meet the deadline" in w for w in plan.warnings)


def test_a_zone_that_can_carry_the_job_is_not_screened_out():
    from rubberband.plan.compile import _screen_zone, market_vectors
    from rubberband.plan.table import StageTable

    exp = experiment()
    base = StageTable(exp.spec, exp.model, traced("us-west-2b").replace(market=Market.ON_DEMAND), **KW)
    assert (Market.SPOT,) * 4 not in _screen_zone(base, market_vectors(4), 3600, 0.9)
