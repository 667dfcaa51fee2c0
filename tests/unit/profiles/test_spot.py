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
