"""``StageTable.init_means`` (plan/table.py): E[max of n INIT] for every n at once, the very
numbers ``init_s`` gives one at a time, so ``stage_many`` still equals ``stage`` to the bit."""

from __future__ import annotations

import numpy as np
import pytest

from rubberband import ExperimentSpec
from rubberband.plan.table import StageTable
from rubberband.profiles.distributions import Constant, LogNormal, Normal

from .test_search import fig12, wide_model


@pytest.mark.parametrize("init", [Normal(30.0, 9.0), LogNormal(40.0, 20.0), Constant(0.1)], ids=["normal", "lognormal", "constant"])
@pytest.mark.parametrize("samples", [37, 200])
def test_init_means_are_init_s_to_the_bit(init, samples):
    cloud = fig12().cloud.replace(init_latency_s=init)
    spec = ExperimentSpec.sha(16, 4, 64, 2)
    one, many = (StageTable(spec, wide_model(4), cloud, samples=samples, seed=9) for _ in range(2))
    assert np.array_equal(many.init_means(1, 40)[1:], [one.init_s(1, n) for n in range(1, 41)])
    assert many.init_means(1, 60)[0] == 0.0 and len(many.init_means(1, 5)) == 61     # grown, never shrunk
    previous = np.arange(0, 12)[:, None]
    held = np.arange(1, 13)[None, :]
    allocations = np.full(held.shape, 16)
    d, c = many.stage_many(1, allocations, held, previous)
    for p in range(previous.shape[0]):
        for h in range(held.shape[1]):
            assert (d[p, h], c[p, h]) == one.stage(1, 16, int(held[0, h]), int(previous[p, 0]))


@pytest.mark.parametrize("init", [Normal(30.0, 9.0), Constant(0.1)], ids=["normal", "constant"])
def test_init_means_count_the_contention_of_instances_launched_together(init):
    # init_contention_s (DESIGN §4): n new instances wait c * (n - 1) longer; the table's
    # means (what the planner adds up) are the simulator's own, to the bit.
    plain = fig12().cloud.replace(init_latency_s=init)
    spec = ExperimentSpec.sha(16, 4, 64, 2)
    base, slow = (StageTable(spec, wide_model(4), c, samples=37, seed=9)
                  for c in (plain, plain.replace(init_contention_s=0.7)))
    means = slow.init_means(1, 8)
    assert np.array_equal(means[1:], [slow.init_s(1, n) for n in range(1, 9)])
    assert means[1:] - base.init_means(1, 8)[1:] == pytest.approx([0.7 * (n - 1) for n in range(1, 9)], abs=1e-9)
