"""ModelProfile: log2 interpolation between profiled GPU counts, range errors, YAML I/O."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest

from rubberband import ModelProfile, SpecError
from rubberband.errors import RubberbandWarning
from rubberband.profiles import Constant, Empirical, LogNormal, Normal

ROOT = Path(__file__).resolve().parents[3]
PROFILES = sorted((ROOT / "profiles").glob("*.yaml"))


@pytest.fixture
def two_point() -> ModelProfile:
    return ModelProfile({1: Normal(4.0, 0.4), 4: Normal(1.3, 0.1)}, name="two-point")


def test_log2_midpoint(two_point):
    # log2(2) is halfway between log2(1) = 0 and log2(4) = 2.
    lat = two_point.latency(2)
    assert isinstance(lat, Normal)
    assert lat.mean == pytest.approx(2.65, rel=1e-12)
    assert lat.std == pytest.approx(0.25, rel=1e-12)


def test_log2_interpolation_off_the_midpoint(two_point):
    t = math.log2(3) / 2
    lat = two_point.latency(3)
    assert lat.mean == pytest.approx((1 - t) * 4.0 + t * 1.3, rel=1e-12)
    assert lat.std == pytest.approx((1 - t) * 0.4 + t * 0.1, rel=1e-12)


def test_profiled_points_are_returned_as_written(two_point):
    assert two_point.latency(1) == Normal(4.0, 0.4)
    assert two_point.latency(4) == Normal(1.3, 0.1)
    assert two_point.latency(4.0) == Normal(1.3, 0.1)


def test_interpolation_takes_the_family_of_the_lower_point():
    profile = ModelProfile({1: Constant(4.0), 4: Normal(1.0, 0.2), 16: LogNormal(0.5, 0.1),
                            64: Empirical((0.1, 0.3))})
    assert profile.latency(2) == Normal(2.5, 0.1)             # constant below, normal above
    assert isinstance(profile.latency(8), Normal)
    assert profile.latency(8).mean == pytest.approx(0.75, rel=1e-12)
    assert isinstance(profile.latency(32), LogNormal)
    assert profile.latency(32).mean == pytest.approx((0.5 + 0.2) / 2, rel=1e-12)
    assert profile.latency(64) == Empirical((0.1, 0.3))


def test_beyond_the_largest_count_is_an_error(two_point):
    with pytest.raises(SpecError, match=r"gpus per trial: 5 is outside the profiled range 1\.\.4 of model profile 'two-point'"):
        two_point.latency(5)


def test_below_the_smallest_count_is_an_error():
    profile = ModelProfile({2: Normal(2.0, 0.2), 8: Normal(0.7, 0.1)})
    assert not profile.covers(1)
    assert profile.covers(5)
    with pytest.raises(SpecError, match=r"gpus per trial: 1 is outside the profiled range 2\.\.8"):
        profile.latency(1)


@pytest.mark.parametrize("gpus", [2.5, "2", True])
def test_non_integer_gpu_counts_are_errors(two_point, gpus):
    with pytest.raises(SpecError, match="gpus per trial: expected an integer"):
        two_point.latency(gpus)


def test_profiled_counts_are_sorted():
    profile = ModelProfile({8: Constant(1.0), 1: Constant(5.0), 2: Constant(3.0)})
    assert profile.gpu_counts == (1, 2, 8)
    assert (profile.min_gpus, profile.max_gpus) == (1, 8)


def test_from_dict_to_dict_round_trip():
    data = {
        "name": "resnet101-cifar10-bs1024",
        "measured_on": {"provider": "aws", "instance_type": "p3.8xlarge"},
        "global_batch_size": 1024,
        "iter_latency_s": {
            1: {"dist": "normal", "mean": 4.0, "std": 0.4},
            "2": {"dist": "lognormal", "mean": 2.2, "std": 0.2},
            4: {"dist": "empirical", "samples": [1.2, 1.3, 1.4]},
        },
        "trial_startup_s": {"dist": "constant", "value": 8},
        "sync_s": 1,
    }
    profile = ModelProfile.from_dict(data)
    assert profile.gpu_counts == (1, 2, 4)
    assert profile.trial_startup_s == Constant(8.0)
    assert profile.sync_s == Constant(1.0)
    assert profile.extra == {"global_batch_size": 1024}
    again = ModelProfile.from_dict(profile.to_dict())
    assert again == profile
    assert again.to_dict() == profile.to_dict()


def test_defaults_for_startup_and_sync():
    profile = ModelProfile.from_dict({"iter_latency_s": {1: 2.0}})
    assert profile.trial_startup_s == Constant(0.0)
    assert profile.sync_s == Constant(0.0)


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.name)
def test_every_shipped_profile_loads_and_round_trips(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RubberbandWarning)   # the shipped profiles give no warning
        profile = ModelProfile.load(path)
    assert profile.min_gpus == 1
    assert len(profile.gpu_counts) >= 2
    # Every count in range interpolates; the paper-shaped approximations scale sublinearly
    # (latency falls as GPUs are added). Measured profiles say what they measured: on a CPU,
    # DDP over logical GPUs can be slower than one worker.
    means = [profile.latency(g).mean for g in range(1, profile.max_gpus + 1)]
    assert all(m > 0 for m in means)
    if profile.measured_on.get("approximate"):
        assert all(a > b for a, b in zip(means, means[1:]))
    assert ModelProfile.from_dict(profile.to_dict()) == profile


def test_there_are_shipped_profiles():
    assert len(PROFILES) >= 3


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        ({}, r"^model_profile\.iter_latency_s: missing required field"),
        ({"iter_latency_s": {}}, r"^model_profile\.iter_latency_s: expected a mapping of GPU count"),
        ({"iter_latency_s": [1, 2]}, r"^model_profile\.iter_latency_s: expected a mapping of GPU count"),
        ({"iter_latency_s": {0: 1.0}}, r"^model_profile\.iter_latency_s\.0: must be at least 1"),
        ({"iter_latency_s": {"one": 1.0}}, r"^model_profile\.iter_latency_s\.one: expected an integer"),
        ({"iter_latency_s": {1: {"dist": "normal", "mean": 1}}}, r"^model_profile\.iter_latency_s\.1\.std: missing"),
        ({"iter_latency_s": {1: 1.0}, "sync": 1}, r"^model_profile\.sync: unknown key \(did you mean `sync_s`\?\)"),
        ({"iter_latency_s": {1: 1.0}, "measured_on": "aws"}, r"^model_profile\.measured_on: expected a mapping"),
        ({"iter_latency_s": {1: 1.0}, "trial_startup_s": -1}, r"^model_profile\.trial_startup_s: must be at least 0"),
        ({"iter_latency_s": {1: 1.0, "1": 2.0}}, r"^model_profile\.iter_latency_s\.1: 1 GPUs given twice; keep one entry$"),
        ({"iter_latency_s": {1: 0, 2: 0, 4: 0}},
         r"^model_profile\.iter_latency_s\.1: the mean time per iteration with 1 GPU per trial must be greater than 0 s, got 0;"),
        ({"iter_latency_s": {1: 4.0, 2: {"dist": "normal", "mean": 0, "std": 0.1}}},
         r"^model_profile\.iter_latency_s\.2: the mean time per iteration with 2 GPUs per trial must be greater than 0 s, got 0;"),
        ({"iter_latency_s": {1: 4.0, 8: {"dist": "empirical", "samples": [0, 0, 0]}}},
         r"^model_profile\.iter_latency_s\.8: the mean time per iteration with 8 GPUs"),
    ],
)
def test_from_dict_errors_name_the_field(data, pattern):
    with pytest.raises(SpecError, match=pattern):
        ModelProfile.from_dict(data)


def test_an_empty_profile_is_rejected():
    with pytest.raises(SpecError, match="iter_latency_s: needs at least one GPU count"):
        ModelProfile({})


def test_load_of_a_missing_file():
    with pytest.raises(SpecError, match="no such file"):
        ModelProfile.load(ROOT / "profiles" / "does-not-exist.yaml")


def test_a_zero_latency_built_in_python_names_the_gpu_count():
    with pytest.raises(SpecError, match=r"^iter_latency_s\.4: the mean time per iteration with 4 GPUs per trial must be greater than 0 s"):
        ModelProfile({1: Constant(2.0), 4: Constant(0.0)})


def test_a_profile_that_slows_down_with_more_gpus_is_a_warning_not_an_error():
    with pytest.warns(RubberbandWarning, match=(
        r"^model profile 'nm': more GPUs per trial make an iteration slower: "
        r"2 GPUs \(5s\) slower than 1 \(4s\), 8 GPUs \(3\.5s\) slower than 4 \(3s\); check the profile")):
        profile = ModelProfile.from_dict({"name": "nm", "iter_latency_s": {1: 4.0, 2: 5.0, 4: 3.0, 8: 3.5}})
    assert profile.latency(2).mean == 5.0   # still planned with as measured


def test_a_profile_measured_on_logical_gpus_may_slow_down_silently():
    # The demo's: DDP over logical GPUs on one CPU is slower than one worker, as expected.
    with warnings.catch_warnings():
        warnings.simplefilter("error", RubberbandWarning)
        ModelProfile({1: Constant(0.4), 2: Constant(1.2)}, measured_on={"provider": "local", "gpu_model": "logical"})


def test_a_profile_that_speeds_up_or_stays_flat_gives_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RubberbandWarning)
        ModelProfile({1: Constant(4.0), 2: Constant(2.0), 4: Constant(2.0), 8: Normal(1.0, 0.5)})


# --- packing: several 1-GPU trials on one GPU ---------------------------------------------

PACKED = {
    "name": "small-cnn",
    "iter_latency_s": {1: 1.0, 2: 0.6},
    "packed_iter_latency_s": {2: 1.3, "4": {"dist": "normal", "mean": 2.2, "std": 0.1}},
    "gpu_memory_gb_per_trial": 7.5,
}


def test_packed_latencies_round_trip_and_answer_by_trials_per_gpu():
    profile = ModelProfile.from_dict(PACKED)
    assert profile.packing_counts == (1, 2, 4)
    assert profile.packed_latency(1) == profile.latency(1) == Constant(1.0)
    assert profile.packed_latency(2) == Constant(1.3)
    assert profile.packed_latency(4.0) == Normal(2.2, 0.1)
    assert profile.gpu_memory_gb_per_trial == 7.5
    assert "packed_iter_latency_s" not in profile.extra
    data = profile.to_dict()
    assert data["packed_iter_latency_s"] == {2: {"dist": "constant", "value": 1.3},
                                             4: {"dist": "normal", "mean": 2.2, "std": 0.1}}
    assert data["gpu_memory_gb_per_trial"] == 7.5
    assert ModelProfile.from_dict(data) == profile
    # A profile without packing writes no packing keys, and packs nothing.
    plain = ModelProfile.from_dict({"iter_latency_s": {1: 2.0}})
    assert "packed_iter_latency_s" not in plain.to_dict() and plain.packing_counts == (1,)
    assert plain.max_trials_per_gpu(16) == 1


def test_gpu_memory_caps_the_trials_per_gpu():
    profile = ModelProfile.from_dict(PACKED)
    assert profile.max_trials_per_gpu(None) == 4            # the type does not say: no memory cap
    assert profile.max_trials_per_gpu(80) == 4
    assert profile.max_trials_per_gpu(16) == 2              # 4 x 7.5 GB > 16 GB
    assert profile.max_trials_per_gpu(7.5) == 1
    assert profile.replace(gpu_memory_gb_per_trial=None).max_trials_per_gpu(1) == 4


def test_a_trial_larger_than_the_gpu_memory_is_one_line_naming_the_field():
    profile = ModelProfile.from_dict(PACKED)
    with pytest.raises(SpecError, match=r"^gpu_memory_gb_per_trial: 7\.5 GB is above the 4 GB of one GPU"):
        profile.max_trials_per_gpu(4)


def test_an_unprofiled_packing_count_is_an_error():
    profile = ModelProfile.from_dict(PACKED)
    with pytest.raises(SpecError, match=r"trials per GPU: 3 has no packed latency .* \(profiled: 1, 2, 4\)"):
        profile.packed_latency(3)
    with pytest.raises(SpecError, match="trials per GPU: expected an integer"):
        profile.packed_latency(1.5)


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"packed_iter_latency_s": {0: 1.0}}, r"^model_profile\.packed_iter_latency_s\.0: trials per GPU must be a whole number of at least 2"),
        ({"packed_iter_latency_s": {-2: 1.0}}, r"^model_profile\.packed_iter_latency_s\.-2: trials per GPU must be a whole number"),
        ({"packed_iter_latency_s": {1: 1.0}}, r"^model_profile\.packed_iter_latency_s\.1: .*\(k = 1 is iter_latency_s\.1\)"),
        ({"packed_iter_latency_s": {2.5: 1.0}}, r"^model_profile\.packed_iter_latency_s\.2\.5: trials per GPU must be a whole number"),
        ({"packed_iter_latency_s": {"two": 1.0}}, r"^model_profile\.packed_iter_latency_s\.two: trials per GPU must be a whole number"),
        ({"packed_iter_latency_s": {2: 1.3, "2": 1.4}}, r"^model_profile\.packed_iter_latency_s\.2: 2 trials per GPU given twice"),
        ({"packed_iter_latency_s": [1.3]}, r"^model_profile\.packed_iter_latency_s: expected a mapping of trials per GPU"),
        ({"packed_iter_latency_s": {2: 0}}, r"^model_profile\.packed_iter_latency_s\.2: the mean time per iteration of one of 2"),
        ({"gpu_memory_gb_per_trial": 0}, r"^model_profile\.gpu_memory_gb_per_trial: expected a peak GPU memory in GB greater than 0"),
        ({"gpu_memory_gb_per_trial": "8GB"}, r"^model_profile\.gpu_memory_gb_per_trial: expected a peak GPU memory"),
        ({"iter_latency_s": {2: 0.6}}, r"^model_profile\.packed_iter_latency_s: only 1-GPU trials are packed"),
    ],
)
def test_bad_packing_input_is_one_line_naming_the_field(changes, pattern):
    with pytest.raises(SpecError, match=pattern):
        ModelProfile.from_dict({**PACKED, **changes})


def test_a_packed_latency_below_the_solo_one_is_a_warning():
    with pytest.warns(RubberbandWarning, match=(
            r"^model profile 'small-cnn': packed_iter_latency_s\.2 \(0\.9s\) lower than the solo latency "
            r"iter_latency_s\.1 \(1s\): one trial alone under-used the GPU, or a measurement is off")):
        profile = ModelProfile.from_dict({**PACKED, "packed_iter_latency_s": {2: 0.9, 4: 2.2}})
    assert profile.packed_latency(2).mean == 0.9     # planned with as measured
    with warnings.catch_warnings():
        warnings.simplefilter("error", RubberbandWarning)
        ModelProfile.from_dict(PACKED)               # slower per trial, faster per GPU: no warning


def test_latency_is_built_once_per_count(two_point):
    # The planner asks for the same count on every candidate: one distribution, kept.
    first = two_point.latency(2)
    assert two_point.latency(2) is first
    assert two_point.latency(2.0) is first
    import numpy as np
    assert two_point.latency(np.int64(2)) is first


def test_a_replaced_profile_has_its_own_latencies(two_point):
    # The re-planner's corrected profile (every latency times c) must not read the old cache.
    before = two_point.latency(2)
    slower = two_point.replace(iter_latency_s={g: d.with_moments(d.mean * 1.25, d.std * 1.25)
                                               for g, d in two_point.iter_latency_s.items()})
    assert slower.latency(2).mean == pytest.approx(before.mean * 1.25, rel=1e-12)
    assert two_point.latency(2) is before
    assert slower == two_point.replace(iter_latency_s=dict(slower.iter_latency_s))   # the cache is not compared


@pytest.mark.parametrize("gpus", [True, 2.5, 0, 5])
def test_latency_refuses_every_time(two_point, gpus):
    two_point.latency(1)      # 1 is cached: True must still be refused, not read as 1
    for _ in range(2):
        with pytest.raises(SpecError, match="gpus per trial"):
            two_point.latency(gpus)


# --- fused trials (DESIGN §4.5) ----------------------------------------------------------------

FUSED = {"iter_latency_s": {1: 1.0}, "fused_iter_latency_s": {"1": 1.5, 8: {"dist": "normal", "mean": 2.7, "std": 0.2}},
         "fused_memory_gb": {1: 2.0, 2: 2.5, 8: 5.5}}


def test_fused_latencies_and_memory_round_trip_and_answer_by_group_size():
    profile = ModelProfile.from_dict(FUSED)
    assert profile.fused_counts == (1, 8)
    assert profile.fused_latency(8) == Normal(2.7, 0.2) and profile.fused_latency(1) == Constant(1.5)
    assert ModelProfile.from_dict(profile.to_dict()) == profile
    assert profile.to_dict()["fused_memory_gb"] == {1: 2.0, 2: 2.5, 8: 5.5}
    with pytest.raises(SpecError, match=r"fused per GPU: 4 has no fused_iter_latency_s .*profiled: 1, 8"):
        profile.fused_latency(4)
    # A profile without fusion writes no fused keys (files written before stay as they were).
    assert "fused_iter_latency_s" not in ModelProfile.from_dict({"iter_latency_s": {1: 1.0}}).to_dict()


def test_hydros_rule_on_the_fitted_memory():
    """m(F) = 2 + (F - 1) * 0.5 exactly through the three points; F_max = floor((M - m1) / delta) + 1."""
    profile = ModelProfile.from_dict(FUSED)
    m1, delta = profile.fused_memory_fit
    assert m1 == pytest.approx(2.0) and delta == pytest.approx(0.5)
    assert profile.max_fused(5.4) == 7           # m(7) = 5.0 <= 5.4 < m(8) = 5.5
    assert profile.max_fused(5.5) == 8           # exactly full fits
    assert profile.max_fused(2.0) == 1
    assert profile.max_fused(None) is None
    assert profile.fused_fits(8, 5.5) and not profile.fused_fits(8, 5.4) and profile.fused_fits(8, None)
    assert profile.fused_memory(4) == pytest.approx(3.5) and profile.fused_memory(8) == 5.5
    with pytest.raises(SpecError, match=r"fused_memory_gb: one fused member needs 2 GB \(fitted m1\), above the 1.5 GB"):
        profile.max_fused(1.5)
    # A measured size above the device is out even where the fitted line would let it in.
    bumpy = ModelProfile.from_dict({**FUSED, "fused_memory_gb": {1: 2.0, 4: 5.0, 8: 5.5}})
    assert not bumpy.fused_fits(4, 4.9) and bumpy.fused_fits(2, 4.9)
    # Memory that does not grow with F gives no cap.
    flat = ModelProfile.from_dict({**FUSED, "fused_memory_gb": {1: 3.0, 8: 3.0}})
    assert flat.max_fused(16.0) is None


@pytest.mark.parametrize(("changes", "pattern"), [
    ({"fused_iter_latency_s": {0: 1.0}}, r"p.yaml.fused_iter_latency_s.0: trials in a fused group must be a whole "
                                         r"number of at least 1, got 0"),
    ({"fused_iter_latency_s": {2: 0.0}}, r"fused_iter_latency_s.2: the mean time of one iteration of a group of 2"),
    ({"fused_iter_latency_s": [1, 2]}, r"p.yaml.fused_iter_latency_s: expected a mapping of trials in a fused group"),
    ({"fused_iter_latency_s": {2: 1.0, "2": 1.0}}, r"fused_iter_latency_s.2: 2 given twice"),
    ({"fused_memory_gb": {1: 2.0}}, r"fused_memory_gb: one group size \(1\) cannot fit m1 \+ \(F - 1\) \* delta"),
    ({"fused_memory_gb": {1: 2.0, 2: "x"}}, r"fused_memory_gb.2: expected the group's peak GPU memory in GB"),
    ({"iter_latency_s": {2: 1.0}}, r"fused_iter_latency_s: only 1-GPU trials are fused"),
])
def test_bad_fusion_input_is_one_line_naming_the_field(changes, pattern):
    with pytest.raises(SpecError, match=pattern):
        ModelProfile.from_dict({**FUSED, **changes}, where="p.yaml")


# --- checkpoint_every: a function trainable's reports per checkpoint ----------------------------

@pytest.mark.parametrize(("written", "every", "done", "redone"), [
    (None, 1, 7, 0),         # absent: every report (the model without redone iterations)
    (3, 3, 7, 1),
    (3, 3, 9, 0),
    ("never", None, 7, 7),   # no checkpoint: all of it again
])
def test_checkpoint_every_round_trips_and_gives_the_iterations_redone(written, every, done, redone):
    data = {"iter_latency_s": {1: 2.0}, **({"checkpoint_every": written} if written is not None else {})}
    profile = ModelProfile.from_dict(data)
    assert profile.checkpoint_every == every
    assert profile.redone_after(done) == redone
    out = profile.to_dict()
    assert out.get("checkpoint_every") == written
    assert ModelProfile.from_dict(out) == profile


@pytest.mark.parametrize("bad", [0, -2, 1.5, "sometimes", True, None, [3]])
def test_a_bad_checkpoint_every_is_one_line_naming_the_field(bad):
    with pytest.raises(SpecError, match=r"^model_profile\.checkpoint_every: expected the reports per checkpoint.*'never'"):
        ModelProfile.from_dict({"iter_latency_s": {1: 2.0}, "checkpoint_every": bad})
