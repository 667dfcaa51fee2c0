"""Spot emulation on the local provider: the --spot-emulation override, reclaim times, and the
fake metadata endpoint."""

from __future__ import annotations

import math

import numpy as np
import pytest

import rubberband as rb
from rubberband.errors import SpecError
from rubberband.profiles.spot import SpotMarket
from rubberband.providers.spot_emulation import (
    SHIPPED_TRACES,
    Reclaimer,
    SpotEmulation,
    spot_emulation,
)

CLOUD = rb.CloudProfile.load("cloud_profiles/aws/us-east-1.yaml", "p3.2xlarge", market="spot")


def with_spot(**kw):
    return CLOUD.replace(spot=SpotMarket(**kw))


def test_the_plans_preemption_model_is_emulated_unless_overridden():
    cloud = with_spot(notice_s=120, rate_per_hour=0.3, explicit=True)
    assert spot_emulation("", cloud, (2, 1), seed=4) == SpotEmulation(rate_per_hour=0.3, notice_s=120, seed=4)
    assert spot_emulation("rate=2/h,notice=20s", cloud, (1,)) == SpotEmulation(rate_per_hour=2.0, notice_s=20)
    assert spot_emulation("rate=0.5/m", cloud, (1,)).rate_per_hour == 30.0
    assert spot_emulation("life=30s,notice=0,max=1", cloud, (1,)) == SpotEmulation(life_s=30, notice_s=0, max_reclaims=1)
    zoned = spot_emulation("zone=us-east-1a", cloud, (1,))
    assert (zoned.trace_file, zoned.zone, zoned.notice_s) == (str(SHIPPED_TRACES), "us-east-1a", 120)


@pytest.mark.parametrize(("override", "spot", "message"), [
    ("rate=2/h", (0, 0), r"^--spot-emulation: the plan holds no spot instances, so there is nothing to reclaim; plan on spot"),
    ("rat=2/h", (1,), r"^--spot-emulation: unknown key 'rat' \(did you mean `rate`\?\); use rate, life, zone, notice, max"),
    ("rate", (1,), r"^--spot-emulation: expected key=value pairs, got 'rate'; e\.g\. --spot-emulation rate=2/h,notice=20s$"),
    ("rate=fast", (1,), r"^--spot-emulation: rate: expected reclaims per instance-hour such as 2/h, got 'fast'$"),
    ("notice=soon", (1,), r"^--spot-emulation: notice: expected a duration"),
    ("rate=1/h,life=10s", (1,), r"^--spot-emulation: give one of rate, life or zone, not rate and life$"),
    ("max=-1", (1,), r"^--spot-emulation: max: expected a whole number of reclaims such as 1, got '-1'$"),
    ("zone=mars-1a", (1,), r"^--spot-emulation: zone\.zone: 'mars-1a' has no 1-instance trace"),
    ("rate=1/h,rate=2/h", (1,), r"^--spot-emulation: rate given twice; give it once$"),
])
def test_bad_emulation_input_is_one_line_naming_the_flag_and_the_fix(override, spot, message):
    with pytest.raises(SpecError, match=message) as err:
        spot_emulation(override, with_spot(rate_per_hour=0.3, explicit=True), spot)
    assert "\n" not in str(err.value)


def test_a_type_without_a_preemption_model_needs_one_to_be_emulated():
    with pytest.raises(SpecError, match=r"^--spot-emulation: p3\.2xlarge has no preemption model .* rate=2/h,notice=20s$"):
        spot_emulation(None, with_spot(), (1,))


def test_the_emulation_says_what_it_does():
    assert SpotEmulation(rate_per_hour=2.0, notice_s=20).describe() == \
        "spot emulation: 2 reclaims per instance-hour, 20s notice"
    assert SpotEmulation(trace_file="f.json", zone="us-east-1a", max_reclaims=2).describe() == \
        "spot emulation: zone us-east-1a replayed, 0s notice, at most 2 reclaim(s)"


def test_reclaim_times_follow_the_model():
    assert Reclaimer(SpotEmulation(life_s=30.0), started_at=0.0).reclaim_at(100.0) == 130.0
    assert Reclaimer(SpotEmulation(rate_per_hour=0.0), 0.0).reclaim_at(5.0) == math.inf
    rates = Reclaimer(SpotEmulation(rate_per_hour=6.0, seed=1), 0.0)
    lives = np.array([rates.reclaim_at(0.0) for _ in range(4000)])
    assert lives.mean() == pytest.approx(600.0, rel=0.05)            # exponential, mean 1/rate
    capped = Reclaimer(SpotEmulation(life_s=1.0, max_reclaims=1), 0.0)
    assert [capped.take(), capped.take()] == [True, False]


def test_a_trace_reclaims_when_the_zone_loses_capacity_and_requests_wait_for_it():
    from rubberband.profiles.spot import load_trace

    emu = SpotEmulation(trace_file=str(SHIPPED_TRACES), zone="us-east-1a", seed=3)
    r = Reclaimer(emu, started_at=1000.0)
    trace = load_trace(SHIPPED_TRACES, "us-east-1a")
    for wall in (1000.0, 1500.0, 9000.0):
        t = r.offset + wall - 1000.0
        up = r.capacity_at(wall)
        assert trace.available_at(up - wall + t) > 0 and up >= wall
        if trace.available_at(t) > 0:
            assert up == wall
            down = r.reclaim_at(wall)
            assert down > wall and trace.available_at(down - wall + t) == 0
            assert trace.available_at((down - wall + t) - 1e-3) > 0       # the first moment without capacity
