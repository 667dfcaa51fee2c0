"""Fitting latency samples: the right family is chosen, moments are recovered, samples are kept."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rubberband.errors import SpecError
from rubberband.profiler.fit import (
    MIN_ITER_S,
    MIN_SAMPLES_FOR_SHAPE,
    checkpoint_interval,
    fit,
    fit_latency,
    split_train_durations,
    to_profile_entry,
)
from rubberband.profiles import (
    Constant,
    Empirical,
    LogNormal,
    ModelProfile,
    Normal,
    parse_distribution,
)


@pytest.mark.parametrize("seed", range(5))
def test_normal_samples_are_fitted_as_normal_with_their_moments(seed):
    samples = np.random.default_rng(seed).normal(4.0, 0.4, 400)
    dist = fit_latency(samples)
    assert isinstance(dist, Normal)
    assert dist.mean == pytest.approx(4.0, abs=0.06)
    assert dist.std == pytest.approx(0.4, rel=0.12)


@pytest.mark.parametrize("seed", range(5))
def test_skewed_samples_are_fitted_as_lognormal_with_the_moments_of_the_latency(seed):
    m, s = 0.0, 1.0
    samples = np.random.default_rng(seed).lognormal(m, s, 2000)
    dist = fit_latency(samples)
    assert isinstance(dist, LogNormal)
    mean = math.exp(m + s * s / 2)                    # of the latency itself, not of its log
    assert dist.mean == pytest.approx(mean, rel=0.1)
    assert dist.std == pytest.approx(mean * math.sqrt(math.expm1(s * s)), rel=0.25)


def test_the_criterion_is_aic_and_the_chosen_family_has_the_lower_score():
    result = fit(np.random.default_rng(7).lognormal(1.0, 0.8, 300))
    assert set(result.aic) == {"normal", "lognormal"}
    assert result.dist.kind == min(result.aic, key=result.aic.get)


@pytest.mark.parametrize("samples", [[2.5] * 10, [2.5, 2.5 * (1 + 1e-12), 2.5], [0.0, 0.0, 0.0], [7.0]])
def test_equal_samples_give_a_constant(samples):
    dist = fit_latency(samples)
    assert isinstance(dist, Constant)
    assert dist.value == pytest.approx(samples[0])


def test_samples_that_differ_by_more_than_the_tolerance_are_not_constant():
    assert not isinstance(fit_latency([1.0, 1.0 + 1e-6, 1.0]), Constant)


def test_few_samples_default_to_normal_with_the_sample_moments():
    dist = fit_latency([1.0, 2.0])
    assert isinstance(dist, Normal)
    assert (dist.mean, dist.std) == pytest.approx((1.5, math.sqrt(0.5)))
    skewed = np.random.default_rng(0).lognormal(0, 1.5, MIN_SAMPLES_FOR_SHAPE - 1)
    assert isinstance(fit_latency(skewed), Normal)


def test_a_zero_sample_rules_out_lognormal():
    samples = np.concatenate([[0.0], np.random.default_rng(1).lognormal(0, 1.2, 200)])
    assert isinstance(fit_latency(samples), Normal)


@pytest.mark.parametrize("samples, match", [
    ([], "no samples"),
    ([1.0, -0.5], "negative"),
    ([1.0, float("nan")], "finite"),
    (["fast"], "measured seconds"),
])
def test_unusable_samples_are_a_spec_error(samples, match):
    with pytest.raises(SpecError, match=match):
        fit_latency(samples)


def test_profile_entry_keeps_the_raw_samples_beside_the_fit():
    samples = list(np.random.default_rng(3).normal(1.0, 0.1, 20))
    entry = to_profile_entry(samples)
    fitted = parse_distribution(entry["fitted"], "fitted")
    empirical = parse_distribution(entry["empirical"], "empirical")
    assert fitted.kind in ("normal", "lognormal") and fitted.mean == pytest.approx(np.mean(samples), rel=0.01)
    assert isinstance(empirical, Empirical)
    assert empirical.samples == pytest.approx(samples, rel=1e-5)
    assert entry["fit"]["n"] == 20 and entry["fit"]["criterion"] == "aic"


def test_profile_entries_make_a_model_profile_that_loads_with_its_samples():
    rng = np.random.default_rng(4)
    lat = {1: to_profile_entry(rng.normal(0.5, 0.05, 12)), 2: to_profile_entry(rng.normal(0.3, 0.03, 3))}
    startup = to_profile_entry(rng.lognormal(-2, 0.5, 12))
    doc = {
        "name": "m", "iter_latency_s": {g: e["fitted"] for g, e in lat.items()},
        "trial_startup_s": startup["fitted"], "sync_s": to_profile_entry([0.05])["fitted"],
        "profiling": {"samples": {"iter_latency_s": {g: e["empirical"]["samples"] for g, e in lat.items()}}},
    }
    model = ModelProfile.from_dict(doc)
    assert model.gpu_counts == (1, 2)
    assert model.extra["profiling"]["samples"]["iter_latency_s"][2] == lat[2]["empirical"]["samples"]


@pytest.mark.parametrize("seed", range(3))
def test_train_durations_split_into_iteration_latency_and_startup(seed):
    rng = np.random.default_rng(seed)
    startup, per_iter, k0, k1 = 0.8, 0.5, 1, 5
    short = startup + k0 * rng.normal(per_iter, 0.02, 40)
    long = startup + k1 * rng.normal(per_iter, 0.02, 40)
    iter_samples, startup_samples = split_train_durations(short, long, k0, k1)
    assert len(iter_samples) == 40 and len(startup_samples) == 40
    assert np.mean(iter_samples) == pytest.approx(per_iter, abs=0.01)
    assert np.std(iter_samples) == pytest.approx(0.02 * k1 / (k1 - k0), rel=0.3)   # a slow trial stays slow
    assert np.mean(startup_samples) == pytest.approx(startup, abs=0.02)


def test_split_keeps_times_positive_and_needs_longer_long_trials():
    # Noise swamps the extra iterations: the time per iteration stays positive (a profile with a
    # zero iteration time is refused when loaded), the start-up at least 0.
    iter_samples, startup_samples = split_train_durations([1.0, 1.2], [0.9], 1, 3)
    assert iter_samples == [MIN_ITER_S] and min(startup_samples) >= 0
    from rubberband.profiles.model import ModelProfile

    entry = to_profile_entry(iter_samples * 3)
    ModelProfile.from_dict({"name": "m", "iter_latency_s": {1: entry["fitted"]}, "trial_startup_s": {"dist": "constant", "value": 1}})
    with pytest.raises(SpecError, match="more iterations"):
        split_train_durations([1.0], [2.0], 3, 3)


@pytest.mark.parametrize("seed", range(3))
def test_timed_trains_read_the_iteration_latency_from_the_workers_timer(seed):
    # Each TRAIN: start-up + per iteration (timed L_i + untimed u). The short trials' single
    # iteration is noisy (a 1-iteration TRAIN sees its own hiccups); the estimate must not move.
    from rubberband.profiler.fit import split_timed_trains

    rng = np.random.default_rng(seed)
    startup, per_iter, untimed, k0, k1 = 0.3, 0.2, 0.01, 1, 5

    def train(k, jitter):
        iters = list(rng.normal(per_iter, 0.01, k) + rng.normal(0, jitter, k).clip(0))
        return startup + k * untimed + sum(iters), iters

    short = [train(k0, 0.2) for _ in range(8)]
    long = [train(k1, 0.0) for _ in range(8)]
    iter_samples, startup_samples = split_timed_trains(short, long, k0, k1)
    assert len(iter_samples) == 8 and len(startup_samples) == 16
    assert np.mean(iter_samples) == pytest.approx(per_iter + untimed, abs=0.01)
    assert np.mean(startup_samples) == pytest.approx(startup, abs=0.01)
    # The durations alone, split the old way, are thrown off by the short trials' noise.
    old, _ = split_train_durations([d for d, _ in short], [d for d, _ in long], k0, k1)
    assert abs(np.mean(old) - per_iter - untimed) > abs(np.mean(iter_samples) - per_iter - untimed)


def test_timed_trains_need_every_iteration_timed():
    from rubberband.profiler.fit import split_timed_trains

    with pytest.raises(SpecError, match="expected 5 timed iterations"):
        split_timed_trains([(0.5, [0.2])], [(1.2, [0.2] * 4)], 1, 5)
    with pytest.raises(SpecError, match="more iterations"):
        split_timed_trains([(0.5, [0.2])], [(1.2, [0.2])], 1, 1)


def test_packed_latencies_keep_the_measured_ratio_against_the_solo_latency():
    # The packed measurement timed k = 1 at 0.2 s and k = 2 at 0.47 s per trial (packing loses
    # 15%), while the profile's solo latency is 0.26 s: written unscaled, k = 2 would look like
    # a 10% gain (2 / 0.47 vs 1 / 0.26) and the planner would pack on it.
    from rubberband.profiler.measure import packed_entries
    from rubberband.profiler.packing import PackedCount, PackingResult

    packing = PackingResult("logical", (PackedCount(1, (0.2, 0.2)), PackedCount(2, (0.46, 0.48))), "stopped")
    scale, entries = packed_entries(packing, 0.26)
    assert scale == pytest.approx(1.3)
    mean2 = np.mean(entries[2]["empirical"]["samples"])
    assert 2 / mean2 == pytest.approx((2 / 0.47) / (1 / 0.2) / 0.26, rel=1e-3)    # ratio 0.851 kept
    assert 2 / mean2 < 1 / 0.26                                                     # no gain: no packing
    assert packed_entries(packing, None)[0] == 1.0


# --- checkpoint_every from the checkpoints a function trainable reported -------------------------

@pytest.mark.parametrize(("trials", "every"), [
    ([((1, 2, 3, 4, 5), 5)], 1),
    ([((2, 4), 5)], 2),
    ([((3,), 5)], 3),               # one at 3 of 5: the first came at 3, none in the 2 after
    ([((1,), 5)], 5),               # one at 1 of 5: none in the 4 after it, so at least 5
    ([((1, 4), 5)], 3),             # epoch % 3 == 0 from epoch 0: the pace, whatever the offset
    ([((2, 4), 5), ((3,), 5)], 3),  # trials disagree: the slowest pace
    ([((1.5, 3.0), 4.5)], 2),       # a time_attr's 1.5 epochs: whole iterations, rounded up
    ([((), 5), ((), 5)], None),     # no checkpoint anywhere: never
    ([], None),
])
def test_checkpoint_interval(trials, every):
    assert checkpoint_interval(trials) == every


@pytest.mark.parametrize("every", [1, 2, 3, None])
def test_a_function_sessions_states_give_its_checkpoint_interval(every):
    """What the profiler reads from the long trials' states (``measure._function_checkpoints``)."""
    from types import SimpleNamespace

    from rubberband import function_api as fa
    from rubberband.profiler.measure import _function_checkpoints
    from tests.unit.test_function_api import counter

    trials = []
    for _ in range(2):
        s = fa.FunctionSession(counter(checkpoint_every=every), {"lr": 0.1})
        for _ in range(5):                      # the Ray runner's chunks: one iteration each
            s.advance(1)
        trials.append(SimpleNamespace(checkpoint=fa.pack_state(s.state())))
        s.stop()
    trials.append(SimpleNamespace(checkpoint=b"a Trainer class's torch checkpoint"))
    seen = _function_checkpoints(trials)
    assert len(seen) == 2 and all(reached == 5 for _, reached in seen)
    assert checkpoint_interval(seen) == every
