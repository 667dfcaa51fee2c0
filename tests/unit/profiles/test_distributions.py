"""Latency distributions: moments of the samplers, clipping, seeding, parsing, with_moments."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rubberband import SpecError
from rubberband.profiles import Constant, Empirical, LogNormal, Normal, parse_distribution

N = 200_000   # samples per moment check
Z = 5.0       # how many standard errors a sample moment may stray


def check_moments(samples: np.ndarray, mean: float, std: float) -> None:
    """Sample mean and std agree with ``mean``/``std`` within ``Z`` standard errors.

    The standard error of the mean is std/sqrt(n); that of the sample std comes from the
    variance of the sample variance, (m4 - s^4) / n, divided by 2s (the delta method).
    """
    n = samples.size
    assert abs(samples.mean() - mean) <= Z * std / math.sqrt(n)
    s = samples.std()
    m4 = np.mean((samples - samples.mean()) ** 4)
    se_std = math.sqrt(max(m4 - s**4, 0.0) / n) / (2 * s)
    assert abs(s - std) <= Z * se_std


@pytest.mark.parametrize(
    "dist",
    [
        Normal(10.0, 0.5),                       # 20 sigma above 0: clipping is negligible
        Normal(4.0, 0.4),
        LogNormal(2.0, 1.5),
        LogNormal(90.0, 15.0),
        Empirical((1.0, 2.0, 3.0, 10.0)),
        Empirical((0.5, 0.5, 0.7, 1.9, 2.4)),
    ],
    ids=repr,
)
def test_sample_moments_match_the_distribution(dist):
    samples = dist.sample(np.random.default_rng(1234), N)
    assert samples.shape == (N,)
    assert (samples >= 0).all()
    check_moments(samples, dist.mean, dist.std)


def test_empirical_moments_are_those_of_the_measured_samples():
    dist = Empirical((1.0, 2.0, 3.0, 10.0))
    assert dist.mean == 4.0
    assert dist.std == pytest.approx(np.std([1.0, 2.0, 3.0, 10.0]), rel=1e-12)
    assert set(np.unique(dist.sample(np.random.default_rng(0), 1000))) <= {1.0, 2.0, 3.0, 10.0}


def test_constant_always_returns_its_value():
    dist = Constant(3.5)
    samples = dist.sample(np.random.default_rng(0), (4, 5))
    assert samples.shape == (4, 5)
    assert (samples == 3.5).all()
    assert dist.mean == 3.5
    assert dist.std == 0.0
    assert dist.is_constant


def test_zero_std_distributions_are_constant():
    for dist in (Normal(2.0, 0.0), LogNormal(2.0, 0.0)):
        assert dist.is_constant
        assert (dist.sample(np.random.default_rng(0), 10) == 2.0).all()


def test_normal_samples_are_clipped_at_zero():
    samples = Normal(0.1, 1.0).sample(np.random.default_rng(5), N)
    assert samples.min() == 0.0
    # About Phi(-0.1) = 46% of the draws fall below 0 and are clipped to exactly 0.
    assert np.mean(samples == 0.0) == pytest.approx(0.46, abs=0.01)


@pytest.mark.parametrize(
    "dist", [Normal(4.0, 0.4), LogNormal(2.0, 0.5), Empirical((1.0, 2.0, 3.0)), Constant(1.0)], ids=repr
)
def test_same_seed_same_draws_and_shapes(dist):
    a = dist.sample(np.random.default_rng(42), (3, 100))
    b = dist.sample(np.random.default_rng(42), (3, 100))
    assert a.shape == (3, 100)
    np.testing.assert_array_equal(a, b)
    if not dist.is_constant:
        c = dist.sample(np.random.default_rng(43), (3, 100))
        assert not np.array_equal(a, c)


# --- with_moments -------------------------------------------------------------------------

def test_with_moments_keeps_the_family():
    assert Normal(4.0, 0.4).with_moments(2.0, 0.3) == Normal(2.0, 0.3)
    assert LogNormal(4.0, 0.4).with_moments(2.0, 0.3) == LogNormal(2.0, 0.3)
    assert Constant(4.0).with_moments(2.0, 0.0) == Constant(2.0)
    # A constant moved to a positive std can no longer be constant.
    assert Constant(4.0).with_moments(2.0, 0.5) == Normal(2.0, 0.5)


def test_empirical_with_moments_shifts_and_scales_the_samples():
    moved = Empirical((1.0, 2.0, 3.0, 10.0)).with_moments(20.0, 2.0)
    assert isinstance(moved, Empirical)
    assert moved.mean == pytest.approx(20.0, rel=1e-12)
    assert moved.std == pytest.approx(2.0, rel=1e-12)
    # The shape is kept: the samples are an affine image of the originals.
    assert np.corrcoef(moved.samples, (1.0, 2.0, 3.0, 10.0))[0, 1] == pytest.approx(1.0)


def test_empirical_with_moments_of_identical_samples():
    moved = Empirical((2.0, 2.0)).with_moments(5.0, 1.0)
    assert moved.samples == (5.0, 5.0)


def test_lognormal_with_moments_samples_the_new_moments():
    moved = LogNormal(1.0, 0.1).with_moments(3.0, 0.9)
    check_moments(moved.sample(np.random.default_rng(9), N), 3.0, 0.9)


# --- parsing ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ({"dist": "constant", "value": 8}, Constant(8.0)),
        ({"dist": "normal", "mean": 4.0, "std": 0.4}, Normal(4.0, 0.4)),
        ({"dist": "lognormal", "mean": 90, "std": 15}, LogNormal(90.0, 15.0)),
        ({"dist": "empirical", "samples": [1, 2.5, 3]}, Empirical((1.0, 2.5, 3.0))),
        (7, Constant(7.0)),
        (0, Constant(0.0)),
    ],
)
def test_parse_and_round_trip(text, expected):
    dist = parse_distribution(text, "lat")
    assert dist == expected
    assert parse_distribution(dist.to_dict(), "lat") == dist


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ({"dist": "norml", "mean": 1, "std": 1}, r"^lat\.dist: unknown value 'norml' \(did you mean `normal`\?\)"),
        ({"dist": "gamma", "mean": 1, "std": 1}, r"^lat\.dist: unknown value 'gamma'.*constant, normal, lognormal, empirical"),
        ({"dist": "normal", "mean": 1}, r"^lat\.std: missing required field"),
        ({"dist": "normal", "std": 1}, r"^lat\.mean: missing required field"),
        ({"dist": "constant"}, r"^lat\.value: missing required field"),
        ({"dist": "empirical"}, r"^lat\.samples: missing required field"),
        ({"dist": "normal", "mean": -1, "std": 1}, r"^lat\.mean: must be at least 0"),
        ({"dist": "normal", "mean": 1, "std": -0.5}, r"^lat\.std: must be at least 0"),
        ({"dist": "constant", "value": -2}, r"^lat\.value: must be at least 0"),
        ({"dist": "lognormal", "mean": 0, "std": 1}, r"^lat\.mean: must be greater than 0"),
        ({"dist": "empirical", "samples": []}, r"^lat: .*needs at least one measured sample"),
        ({"dist": "empirical", "samples": [1, -2]}, r"^lat: .*samples\[1\]: must be at least 0"),
        ({"dist": "empirical", "samples": "1 2 3"}, r"^lat\.samples: expected a list"),
        ({"dist": "normal", "mean": "four", "std": 1}, r"^lat\.mean: expected a number"),
        ({"dist": "normal", "mean": float("nan"), "std": 1}, r"^lat\.mean: expected a number"),
        ({"dist": "normal", "mean": 1, "std": 1, "skew": 2}, r"^lat\.skew: unknown key"),
        ({"mean": 1, "std": 1}, r"^lat: expected a distribution such as"),
        ("fast", r"^lat: expected a distribution such as"),
        (-3, r"^lat: must be at least 0"),
        (True, r"^lat: expected a distribution"),
    ],
)
def test_parse_errors_name_the_field(text, pattern):
    with pytest.raises(SpecError, match=pattern):
        parse_distribution(text, "lat")


@pytest.mark.parametrize(
    ("build", "field"),
    [(lambda: Normal(-1.0, 1.0), r"normal\.mean: must be at least 0"),
     (lambda: Normal(1.0, -1.0), r"normal\.std: must be at least 0"),
     (lambda: LogNormal(0.0, 1.0), r"lognormal\.mean: must be greater than 0"),
     (lambda: Constant(-1.0), r"constant\.value: must be at least 0"),
     (lambda: Empirical(()), r"empirical\.samples: needs at least one")],
)
def test_constructors_validate(build, field):
    with pytest.raises(SpecError, match=field):
        build()
