"""whatif's packing axis (issue #16 item 7): the most trials per GPU the optimal plan may pack."""

from __future__ import annotations

import pytest

from rubberband import ExperimentSpec, SpecError
from rubberband.plan import compile_plan, whatif
from rubberband.testing.builders import scaling_model

from .test_variants import p3_catalog

SHA256 = ExperimentSpec.sha(256, 1, 64, 4)
SAMPLES = 60


def cloud():
    return p3_catalog().get("p3.2xlarge")


def sweep(m, packing, deadline_s=3600.0, **kw):
    return whatif(SHA256, m, cloud(), deadline_s, {"packing": packing}, ["optimal", "static"], samples=SAMPLES,
                  seed=0, **kw)


def test_each_packing_is_the_planner_with_packing_up_to_it():
    packed = {2: 1.3, 4: 2.2}
    by_k = {s.values["packing"]: s for s in sweep(scaling_model(packed=packed), [1, 2, 4])}
    for k, profile in ((1, None), (2, {2: 1.3}), (4, packed)):
        alone = compile_plan(SHA256, scaling_model(packed=profile), cloud(), 3600.0, samples=SAMPLES, seed=0)
        assert by_k[k].costs["optimal"] == alone.predicted.mean_cost_usd
        assert by_k[k].trials_per_gpu["optimal"] == (alone.trials_per_gpu or None)
    assert by_k[1].trials_per_gpu["optimal"] is None and 4 in by_k[4].trials_per_gpu["optimal"]
    assert by_k[1].costs["optimal"] >= 1.3 * by_k[4].costs["optimal"]
    assert by_k[1].costs["optimal"] > by_k[2].costs["optimal"] > by_k[4].costs["optimal"]
    # The baselines never pack: their cost does not move.
    assert by_k[1].costs["static"] == by_k[4].costs["static"] and by_k[4].trials_per_gpu["static"] is None


def test_whatif_packs_as_compile_plan_does_without_the_axis():
    m = scaling_model(packed={2: 1.3, 4: 2.2})
    scenario = whatif(SHA256, m, cloud(), 3600.0, {"deadline_s": [3600.0]}, ["optimal"], samples=SAMPLES, seed=0)[0]
    plan = compile_plan(SHA256, m, cloud(), 3600.0, samples=SAMPLES, seed=0)
    assert scenario.costs["optimal"] == plan.predicted.mean_cost_usd
    assert scenario.trials_per_gpu["optimal"] == plan.trials_per_gpu and 4 in plan.trials_per_gpu


def test_packing_that_gives_no_throughput_is_never_chosen():
    by_k = {s.values["packing"]: s for s in sweep(scaling_model(packed={2: 2.0, 4: 4.0}, startup_s=0.0), [1, 2, 4])}
    assert by_k[1].costs["optimal"] == pytest.approx(by_k[4].costs["optimal"], rel=1e-12)
    assert by_k[4].trials_per_gpu["optimal"] is None


@pytest.mark.parametrize(("packing", "memory_gb", "pattern"), [
    ([1, 3], 3.0, r"^packing: 3 trials per GPU has no packed latency in model profile 'm' \(profiled: 1, 2, 4\)"),
    ([0, 2], 3.0, r"^packing: trials per GPU must be whole numbers of at least 1 \(1: no packing\), got 0"),
    ([True], 3.0, r"^packing: trials per GPU must be whole numbers"),
    ([2, 4], 6.0, r"^packing: 4 trials of 6 GB do not fit the 16 GB GPU of p3\.2xlarge"),
])
def test_bad_packing_values_name_the_axis(packing, memory_gb, pattern):
    with pytest.raises(SpecError, match=pattern):
        sweep(scaling_model(packed={2: 1.3, 4: 2.2}, gpu_memory_gb_per_trial=memory_gb), packing)
