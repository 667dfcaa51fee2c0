"""``plan/queue.py``'s list scheduling, a round at a time with a round stepped one trial at a time
only in the samples where it goes otherwise: the simulator's makespans to the bit, on queues
long enough that most samples have such rounds."""

from __future__ import annotations

import numpy as np
import pytest

from rubberband.plan.queue import list_schedule
from rubberband.simulator.model import list_schedule as one_at_a_time


@pytest.mark.parametrize("n,gpus,cv,ties", [(1000, 50, 0.1, False), (1000, 7, 0.3, False), (400, 33, 2.0, False),
                                            (300, 16, 0.5, True), (64, 63, 0.1, False), (12, 5, 5.0, True)])
def test_long_queues_are_the_simulators_list_schedule_to_the_bit(n, gpus, cv, ties):
    rng = np.random.default_rng(n + gpus)
    durations = np.maximum(rng.normal(10.0, 10.0 * cv, (n, 200)), 0.0) + 1.0
    if ties:        # equal durations and free times everywhere: which GPU takes a trial may differ
        durations = np.round(durations / 2.0) * 2.0
    assert np.array_equal(list_schedule(durations, gpus), one_at_a_time(durations, gpus))
