"""Spot market models: the shipped traces, their replay, and the Spot Advisor prior."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rubberband.errors import SpecError
from rubberband.profiles.spot import SpotTrace, advisor_rate_per_hour, load_trace, trace_zones

ROOT = Path(__file__).resolve().parents[3]
TRACES = ROOT / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json"

# The raw data's own summary (shared/data/spot-traces-aws-v100/README.md).
RAW_SUMMARY = {"us-east-1a": (0.167, 1.39), "us-east-1c": (0.467, 0.67), "us-east-1d": (0.447, 0.60),
               "us-east-1f": (0.591, 0.44), "us-east-2a": (0.759, 0.17), "us-east-2b": (0.682, 0.23),
               "us-west-2a": (0.883, 0.16), "us-west-2b": (0.905, 0.10), "us-west-2c": (0.891, 0.15)}


@pytest.mark.parametrize("zone", sorted(RAW_SUMMARY))
def test_the_shipped_traces_say_what_the_raw_data_says(zone):
    trace = load_trace(TRACES, zone)
    fraction, drops = RAW_SUMMARY[zone]
    assert trace.available_fraction == pytest.approx(fraction, abs=0.0015)
    assert trace.drops_per_available_hour == pytest.approx(drops, abs=0.006)


def test_the_shipped_file_carries_its_licence_and_source():
    folder = TRACES.parent
    assert "Apache License" in (folder / "LICENSE").read_text()
    assert "SkyNomad" in (folder / "NOTICE").read_text()
    source = json.loads(TRACES.read_text())["source"]
    assert "Can't Be Late" in source and "Apache License 2.0" in source
    assert trace_zones(TRACES, nodes=4) == ["us-east-1f", "us-east-2a", "us-west-2c"]
    assert load_trace(TRACES, "us-west-2a", nodes=16).values.max() == 16


def _brute_next(trace: SpotTrace, t: float, up: bool, step: float = 0.5) -> float:
    x = t
    while x < t + 3 * trace.duration_s:
        if (trace.available_at(x) > 0) == up:
            return x
        x = math.floor(x / step) * step + step
    return math.inf


def test_next_change_agrees_with_a_walk_along_the_trace():
    trace = SpotTrace("z", 2, np.array([0.0, 10.0, 12.0, 30.0]), np.array([0, 2, 0, 1]), 40.0)
    rng = np.random.default_rng(0)
    ts = np.concatenate([rng.uniform(0, 130, 200), [0, 10, 12, 30, 40, 52, 9.99]])
    for up in (True, False):
        got = trace.next_change(ts, up=up)
        want = [_brute_next(trace, float(t), up) for t in ts]
        assert got == pytest.approx(want, abs=0.5)
        # Exactly at the change points the answer is exact.
        assert trace.next_change(np.array([12.0]), up=True)[0] == 30.0
        assert trace.next_change(np.array([41.0]), up=True)[0] == 50.0


def test_a_zone_that_never_comes_back_never_does():
    trace = SpotTrace("z", 1, np.array([0.0]), np.array([0]), 100.0)
    assert np.isinf(trace.next_change(np.array([5.0]), up=True)).all()
    assert trace.available_fraction == 0.0 and trace.drops_per_available_hour == 0.0


def test_advisor_buckets_turn_into_monthly_shares():
    rate = advisor_rate_per_hour("<5%")
    assert 1 - math.exp(-rate * 730) == pytest.approx(0.025)
    assert advisor_rate_per_hour(">20%") > advisor_rate_per_hour("15-20%") > rate
    with pytest.raises(SpecError, match=r"spot\.preemption\.advisor: unknown bucket '5%'.*<5%"):
        advisor_rate_per_hour("5%")


@pytest.mark.parametrize(
    ("content", "pattern"),
    [(None, r"trace\.file: no trace file at"),
     ("", r"trace\.file: .* is not a JSON trace file"),
     ("[1, 2]", r"trace\.file: .* has no `traces:` list"),
     ('{"traces": []}', r"has no `traces:` list"),
     ('{"traces": [{"zone": "a", "nodes": 1, "duration_s": 5, "changes": 3}]}', r"traces\[0\]\.changes: expected"),
     ('{"traces": [{"zone": "a", "nodes": 1, "duration_s": 5, "changes": [[0, 1]], "extra": 1}]}',
      r"traces\[0\]\.extra: unknown key")],
)
def test_bad_trace_files_are_one_line(tmp_path, content, pattern):
    path = tmp_path / "t.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SpecError, match=pattern):
        load_trace(path, "a")


def test_a_zone_not_in_the_file_names_the_zones_that_are():
    with pytest.raises(SpecError, match=r"zone: 'us-east-1b' has no 1-instance trace .*did you mean .*us-east-1a"):
        load_trace(TRACES, "us-east-1b")


# --- the `spot:` block of a cloud profile -------------------------------------------------------
from rubberband.config import experiment_from_dict  # noqa: E402
from rubberband.profiles.cloud import CloudProfile  # noqa: E402
from rubberband.profiles.spot import SpotMarket  # noqa: E402

ONE_TYPE = {"instance_type": "p3.2xlarge", "gpus_per_instance": 1, "price_usd_per_hour": 3.06,
            "spot_price_usd_per_hour": 0.92}


def test_a_profile_without_a_spot_block_is_never_reclaimed():
    cloud = CloudProfile.from_dict(ONE_TYPE)
    assert cloud.spot == SpotMarket() and not cloud.spot.at_risk
    assert "spot" not in cloud.to_dict()


@pytest.mark.parametrize(
    ("block", "rate", "zone"),
    [({"notice_s": 120, "preemption": {"rate_per_hour": 0.3}}, 0.3, None),
     ({"preemption": {"advisor": ">20%"}}, -math.log(0.75) / 730, None),
     ({"preemption": {"trace": {"file": str(TRACES), "zone": "us-west-2b"}}}, 0.0, "us-west-2b")],
)
def test_each_preemption_model_reads_and_round_trips(block, rate, zone):
    cloud = CloudProfile.from_dict({**ONE_TYPE, "spot": block})
    assert cloud.spot.at_risk
    assert cloud.spot.rate_per_hour == pytest.approx(rate)
    assert (cloud.spot.trace.zone if cloud.spot.trace else None) == zone
    assert cloud.spot.notice_s == block.get("notice_s", 0)
    again = CloudProfile.from_dict(cloud.to_dict())
    assert again.spot == cloud.spot and again == cloud


@pytest.mark.parametrize(
    ("block", "pattern"),
    [({"preemption": {"rates_per_hour": 0.2}}, r"spot\.preemption\.rates_per_hour: unknown key \(did you mean `rate_per_hour`\?\)"),
     ({"preemption": {"poisson": 0.2}}, r"spot\.preemption\.poisson: unknown key.*allowed keys: rate_per_hour, trace, advisor"),
     ({"preemption": {"rate_per_hour": -0.1}}, r"spot\.preemption\.rate_per_hour: must be at least 0"),
     ({"preemption": {"rate_per_hour": 0.1, "advisor": "<5%"}}, r"spot\.preemption: give exactly one of"),
     ({"preemption": {}}, r"spot\.preemption: give exactly one of .*got none"),
     ({"notice_s": -1}, r"spot\.notice_s: must be at least 0"),
     ({"preemption": {"trace": {"file": "/nowhere.json", "zone": "a"}}}, r"spot\.preemption\.trace\.file: no trace file"),
     ({"preemption": {"trace": {"file": str(TRACES)}}}, r"spot\.preemption\.trace\.zone: missing required field"),
     ({"preemption": {"trace": {"file": str(TRACES), "zone": "eu-west-1a"}}},
      r"spot\.preemption\.trace\.zone: 'eu-west-1a' has no 1-instance trace")],
)
def test_bad_spot_blocks_name_the_field(block, pattern):
    with pytest.raises(SpecError, match=pattern):
        CloudProfile.from_dict({**ONE_TYPE, "spot": block})


def _experiment(tmp_path, overrides):
    return experiment_from_dict({
        "sha": {"num_trials": 4, "min_iters": 1, "max_iters": 4, "eta": 2},
        "model_profile": str(ROOT / "profiles" / "resnet101_cifar10_p3.yaml"),
        "cloud": {"profile": str(ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml"), "instance_type": "p3.2xlarge",
                  "market": "spot", "overrides": overrides},
    }, base=tmp_path)


def test_an_experiment_sets_the_spot_model_and_its_trace_file_resolves_beside_it(tmp_path):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.json").write_text(TRACES.read_text())
    exp = _experiment(tmp_path, {"spot": {"notice_s": 120, "preemption": {"trace": {"file": "traces/t.json",
                                                                                     "zone": "us-east-1a"}}}})
    cloud = exp.cloud_for("p3.2xlarge")
    assert cloud.spot.trace.zone == "us-east-1a" and cloud.spot.notice_s == 120
    assert cloud.spot.trace_file == str(tmp_path / "traces" / "t.json")


def test_a_spot_override_merges_with_the_profile_s_block():
    from rubberband.profiles.cloud import CloudCatalog

    catalog = CloudCatalog.from_dict({"provider": "aws", "region": "us-east-1", "instance_types": {
        "p3.2xlarge": {**{k: v for k, v in ONE_TYPE.items() if k != "instance_type"}, "spot": {"notice_s": 120, "preemption": {"rate_per_hour": 0.5}}}}})
    cloud = catalog.get("p3.2xlarge", "spot", {"spot": {"notice_s": 30}})
    assert (cloud.spot.notice_s, cloud.spot.rate_per_hour) == (30, 0.5)
    swapped = catalog.get("p3.2xlarge", "spot", {"spot": {"preemption": {"advisor": "<5%"}}})
    assert (swapped.spot.notice_s, swapped.spot.advisor) == (120, "<5%")


def test_a_window_of_a_trace_is_a_trace_of_its_own():
    trace = load_trace(TRACES, "us-east-1c")
    half = trace.duration_s / 2
    first, second = trace.window(0.0, half), trace.window(half, trace.duration_s)
    assert first.duration_s + second.duration_s == pytest.approx(trace.duration_s)
    whole = (first.available_fraction * first.duration_s + second.available_fraction * second.duration_s)
    assert whole / trace.duration_s == pytest.approx(trace.available_fraction)
    t = np.linspace(0, half - 1, 500)
    assert np.array_equal(second.available_at(t), trace.available_at(t + half))
    with pytest.raises(SpecError, match=r"window 0\.\.1e\+07 s is not inside"):
        trace.window(0.0, 1e7)


def test_a_zone_that_never_has_capacity_is_refused_as_a_market():
    never = SpotTrace("z", 1, np.array([0.0]), np.array([0]), 100.0)
    with pytest.raises(SpecError, match=r"spot\.preemption\.trace\.zone: z never has spot capacity"):
        SpotMarket(trace=never)


def test_a_gang_trace_is_a_market_whose_count_caps_the_instances_held():
    market = SpotMarket.from_dict({"preemption": {"trace": {"file": str(TRACES), "zone": "us-east-1f", "nodes": 4}}})
    assert market.trace.nodes == 4 and market.trace.values.max() == 4
    assert SpotMarket.from_dict(market.to_dict()) == market
    # The first time at least 3 of the 4 are up is no earlier than the first time one is.
    t = np.linspace(0.0, market.trace.duration_s, 200)
    one, three = market.trace.next_change(t, up=True), market.trace.next_change(t, up=True, at_least=3)
    assert (three >= one).all() and (three > one).any()
    assert (market.trace.available_at(three[np.isfinite(three)]) >= 3).all()
    below = market.trace.next_change(t, up=False, at_least=3)
    assert (market.trace.available_at(below[np.isfinite(below)]) < 3).all()


def test_a_drop_at_the_wrap_around_counts():
    trace = SpotTrace("z", 1, np.array([0.0, 100.0]), np.array([0, 1]), 200.0)
    assert trace.drops_per_available_hour == pytest.approx(1 / (100 / 3600))


@pytest.mark.parametrize("value", ['"a"', "1.7", "true", "-1"])
def test_trace_counts_must_be_whole_numbers(tmp_path, value):
    path = tmp_path / "t.json"
    path.write_text('{"traces": [{"zone": "a", "nodes": 1, "duration_s": 5, "changes": [[0, ' + value + ']]}]}')
    with pytest.raises(SpecError, match=r"changes: expected a non-empty list of \[seconds, instances available\]"):
        load_trace(path, "a")


def test_two_windows_of_one_trace_are_different_markets():
    trace = load_trace(TRACES, "us-west-2b")
    a = SpotMarket(trace=trace.window(0, 1e6), trace_file=str(TRACES))
    b = SpotMarket(trace=trace.window(1e6, 2e6), trace_file=str(TRACES))
    assert a != b and a == SpotMarket(trace=trace.window(0, 1e6), trace_file=str(TRACES))


def test_an_explicit_rate_of_zero_is_a_model_and_a_notice_alone_is_not():
    assert SpotMarket.from_dict({"preemption": {"rate_per_hour": 0}}).modelled
    assert not SpotMarket.from_dict({"notice_s": 120}).modelled
    assert SpotMarket.from_dict(SpotMarket.from_dict({"preemption": {"rate_per_hour": 0}}).to_dict()).modelled
