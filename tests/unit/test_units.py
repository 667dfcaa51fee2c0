"""Durations: every format rubberband prints reads back, and hour-scale times keep their seconds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rubberband.errors import SpecError
from rubberband.units import format_duration, parse_duration, parse_range


@given(st.integers(min_value=1, max_value=400 * 86400))
def test_whole_seconds_round_trip(seconds):
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.integers(min_value=1, max_value=599))
def test_tenths_below_a_minute_round_trip(tenths):
    assert parse_duration(format_duration(tenths / 10)) == pytest.approx(tenths / 10)


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90), ("90s", 90), ("20m", 1200), ("1.5h", 5400), ("2d", 172800),
    ("1h30m", 5400), ("20m30s", 1230), ("7m32s", 452), ("1h0m5s", 3605), ("1h02m05s", 3725),
    ("1d2h", 93600), (" 1 h 30 m ", 5400), ("1H30M", 5400), ("2 hours", 7200), ("45.2s", 45.2),
])
def test_parses_simple_and_compound_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


def test_hour_scale_keeps_its_seconds():
    assert format_duration(3725) == "1h02m05s"
    assert format_duration(5400) == "1h30m00s"


def test_just_under_a_minute_rounds_into_minutes():
    assert format_duration(59.94) == "59.9s"
    assert format_duration(59.97) == "1m00s"


def test_a_one_second_sweep_at_hour_scale_prints_distinct_values():
    values = parse_range("90m:91m:1s")
    assert len(values) == 61
    assert len({format_duration(v) for v in values}) == 61


@pytest.mark.parametrize("text", ["30m1h", "1m2m", "1x", "1h-2m", "soon", "", "1e", "h"])
def test_rejects_what_is_not_a_duration_naming_the_field(text):
    with pytest.raises(SpecError, match=r"^--deadline: expected a duration such as 90s, 20m or 1\.5h, got "):
        parse_duration(text, "--deadline")
