"""``StageDraws.train_stats`` (simulator/model.py): the slowest and summed TRAIN durations of
every GPU count from the stage's one draw of standard normals, the very numbers
``train_durations`` gives, so ``StageTable``'s entries, bounds and floors are unchanged to the bit."""

from __future__ import annotations

import numpy as np
import pytest

from rubberband import ExperimentSpec
from rubberband.plan.table import StageTable
from rubberband.profiles.cloud import Market
from rubberband.profiles.distributions import Constant, Empirical, LogNormal, Normal
from rubberband.profiles.model import ModelProfile
from rubberband.profiles.spot import SpotMarket
from rubberband.simulator.model import StageDraws, stage_shape

from .test_search import fig12, wide_model


def profile(latency: dict, startup) -> ModelProfile:
    return ModelProfile.from_dict({"name": "stats", "iter_latency_s": latency, "trial_startup_s": startup,
                                   "sync_s": {"dist": "constant", "value": 1.0}})


@pytest.mark.parametrize("dist", [Normal(3.0, 0.3), Normal(1.0, 2.0), Normal(4.0, 0.0), LogNormal(3.0, 1.0),
                                  Empirical((1.0, 2.5, 7.0)), Constant(2.0)],
                         ids=["normal", "clipped-normal", "normal-std-0", "lognormal", "empirical", "constant"])
def test_from_standard_normal_is_sample_to_the_bit_or_none(dist):
    z = np.random.Generator(np.random.PCG64(5)).standard_normal((40, 30))
    shared = dist.from_standard_normal(z)
    if isinstance(dist, Normal):
        assert np.array_equal(shared, dist.sample(np.random.Generator(np.random.PCG64(5)), (40, 30)))
    else:
        assert shared is None


@pytest.mark.parametrize("startup", [{"dist": "constant", "value": 5.0}, {"dist": "normal", "mean": 5.0, "std": 2.0}],
                         ids=["constant-startup", "random-startup"])
@pytest.mark.parametrize("latency", ["normal", "clipped", "lognormal"])
@pytest.mark.parametrize("trials,samples", [(1, 7), (37, 100), (300, 1000), (5, 70000)])
def test_train_stats_are_train_durations_max_and_sum_to_the_bit(latency, startup, trials, samples):
    dists = {"normal": lambda m: {"dist": "normal", "mean": 12.0 / m, "std": 1.2 / m},
             "clipped": lambda m: {"dist": "normal", "mean": 1.0 / m, "std": 3.0 / m},
             "lognormal": lambda m: {"dist": "lognormal", "mean": 12.0 / m, "std": 6.0 / m}}
    model = profile({m: dists[latency](m) for m in (1, 2, 4, 8)}, startup)
    cloud = fig12().cloud
    shared, alone = StageDraws(3, 1, samples), StageDraws(3, 1, samples)
    for m in (8, 1, 3, 4, 2):        # every count reads the same shared normals, in any order
        shape = stage_shape(1, trials, 17, trials * m, model, cloud)
        durations = StageDraws(3, 1, samples).train_durations(model, shape)
        longest, total = shared.train_stats(model, shape)
        assert np.array_equal(longest, durations.max(axis=0)) and np.array_equal(total, durations.sum(axis=0)), m
        assert np.array_equal(StageDraws(3, 1, samples).train_longest(model, shape), longest), m   # from max z
        alone.train_durations(model, shape)      # known durations are reused: the same numbers
        assert all(np.array_equal(a, b) for a, b in zip(alone.train_stats(model, shape), (longest, total)))
        assert np.array_equal(alone.train_longest(model, shape), longest), m


def test_table_entries_and_bounds_are_those_of_the_full_durations():
    """Every parallel entry's makespan and cost and every bound are what the durations give."""
    spec = ExperimentSpec.sha(27, 4, 108, 3)
    table = StageTable(spec, wide_model(16), fig12().cloud, samples=60, seed=4)
    for i in range(spec.num_stages()):
        for a in table.candidates(i):
            shape = table.shape(i, a)
            durations = StageDraws(4, i, 60).train_durations(table.model, shape)
            entry = table.entry(i, a)
            if table.parallel(i, a):
                assert entry.train_s == float(durations.max(axis=0).mean()), (i, a)
            busy = float(durations.sum(axis=0).mean()) * shape.gpu_share * table.stage_usd_per_s[i] / table.cloud.gpus_per_instance
            assert entry.busy_usd == busy, (i, a)


@pytest.mark.parametrize("spot", [False, True], ids=["on-demand", "spot-reclaimed"])
def test_train_s_is_the_entrys_without_building_it(spot):
    """``train_s`` before any entry is the number the entry then has; the search asks it first."""
    cloud = fig12().cloud
    if spot:
        cloud = cloud.replace(spot_price_usd_per_hour=3.0, spot=SpotMarket(notice_s=120, rate_per_hour=2.0))
    spec = ExperimentSpec.sha(27, 4, 108, 3)
    first = StageTable(spec, wide_model(16), cloud, samples=40, seed=6)
    then = StageTable(spec, wide_model(16), cloud, samples=40, seed=6)
    if spot:
        first, then = (t.for_markets((Market.SPOT,) * spec.num_stages()) for t in (first, then))
    for i in range(spec.num_stages()):
        for a in first.candidates(i):
            assert first.train_s(i, a) == then.entry(i, a).train_s == first.entry(i, a).train_s, (i, a)
    assert first.fast_s == then.fast_s


@pytest.mark.parametrize("latency", ["normal", "clipped", "lognormal"])
def test_train_longest_of_many_counts_at_once_is_each_ones_to_the_bit(latency):
    """``StageDraws.train_longest_many`` (what a table's ``fast_s`` reads, issue 22): one row per
    GPU count, the numbers ``train_longest`` gives each alone, in any order, some known before."""
    dists = {"normal": lambda m: {"dist": "normal", "mean": 12.0 / m, "std": 1.2 / m},
             "clipped": lambda m: {"dist": "normal", "mean": 1.0 / m, "std": 3.0 / m},
             "lognormal": lambda m: {"dist": "lognormal", "mean": 12.0 / m, "std": 6.0 / m}}
    model = profile({m: dists[latency](m) for m in (1, 2, 4, 8)}, {"dist": "constant", "value": 5.0})
    cloud = fig12().cloud
    shapes = [stage_shape(1, 9, 17, 9 * m, model, cloud) for m in (8, 1, 3, 4, 2, 6)]
    draws = StageDraws(3, 1, 50)
    draws.train_longest(model, shapes[2])          # one known already
    many = draws.train_longest_many(model, shapes)
    for shape, longest in zip(shapes, many):
        assert np.array_equal(longest, StageDraws(3, 1, 50).train_longest(model, shape)), shape.gpus_per_trial
        assert draws.train_longest(model, shape) is longest      # kept: asked again, the same array
