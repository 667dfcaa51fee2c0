"""A job that starts holding instances (``simulate(..., held_at_start=...)``, docs/model.md):
exact answers on deterministic profiles, nothing held is the model bit for bit, held spot
instances, and bad input."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from rubberband import (
    CloudProfile,
    ExperimentSpec,
    Market,
    ModelProfile,
    SpecError,
)
from rubberband.profiles import Constant, Normal
from rubberband.simulator import HeldInstances, simulate
from rubberband.testing.builders import cloud_profile, spot_market

# 8 one-GPU trials of 2 iterations on 4-GPU instances: stage 0 needs 2 instances for 8 GPUs.
SPEC = ExperimentSpec.from_stages([(8, 2), (4, 4)])
MODEL = ModelProfile({1: Constant(40.0), 2: Constant(25.0)}, Constant(2.0), Constant(1.0), name="const")
TRAIN0 = 2.0 + 2 * 40.0 + 1.0           # stage 0 on 8 GPUs: TRAIN + SYNC
TRAIN1 = 2.0 + 4 * 25.0 + 1.0           # stage 1 on 8 GPUs (2 per trial)
SCALE, INIT = 10.0, 30.0
USD_PER_S = 1.0                          # per instance-second: costs read as instance-seconds


# One 4-GPU type, SCALE and INIT constant, 1 GB of data a launch, no billing minimum unless asked.
cloud = partial(cloud_profile, "t.4gpu", 4, USD_PER_S * 3600, minimum_s=0.0, provision_s=SCALE, init_s=INIT,
                dataset_gb=1.0)


def one(result) -> tuple[float, float]:
    """The one value of a deterministic simulation's JCT and cost."""
    assert np.ptp(result.jct_s) == 0 and np.ptp(result.cost_usd) == 0
    return float(result.jct_s[0]), float(result.cost_usd[0])


def test_a_stage_that_fits_on_the_held_instances_waits_for_nothing():
    jct, cost = one(simulate(SPEC, [8, 8], MODEL, cloud(), samples=3, held_at_start=2))
    assert jct == TRAIN0 + TRAIN1
    assert cost == pytest.approx(2 * (TRAIN0 + TRAIN1))


def test_only_the_instances_beyond_the_held_ones_are_launched_and_billed_from_their_scale():
    result = simulate(SPEC, [8, 8], MODEL, cloud(usd_per_gb=0.5), samples=3, held_at_start=1)
    jct, cost = one(result)
    assert jct == SCALE + INIT + TRAIN0 + TRAIN1
    # The held one from t = 0, the new one from its SCALE end; one launch's data.
    assert cost == pytest.approx(jct + (jct - SCALE) + 0.5)
    assert [s.new_instances for s in result.stages] == [1, 0]


def test_held_instances_a_stage_does_not_need_are_released_at_once_for_nothing():
    two = one(simulate(SPEC, [8, 8], MODEL, cloud(minimum_s=60.0), samples=3, held_at_start=2))
    assert one(simulate(SPEC, [8, 8], MODEL, cloud(minimum_s=60.0), samples=3, held_at_start=5)) == two
    # Stage 0 on one instance (4 GPUs, two rounds): the other is released at t = 0, unbilled.
    jct, cost = one(simulate(SPEC, [4, 4], MODEL, cloud(minimum_s=60.0), samples=3, held_at_start=2))
    assert jct == 2 * (2.0 + 2 * 40.0) + 1.0 + (2.0 + 4 * 40.0 + 1.0)
    assert cost == pytest.approx(jct)


def test_a_held_instance_is_not_billed_its_minimum_again():
    short = ExperimentSpec.from_stages([(4, 1)])
    fresh = one(simulate(short, [4], MODEL, cloud(minimum_s=600.0), samples=3))
    held = one(simulate(short, [4], MODEL, cloud(minimum_s=600.0), samples=3, held_at_start=1))
    assert fresh == (SCALE + INIT + 43.0, 600.0)
    assert held == (43.0, 43.0)


@pytest.mark.parametrize("held", [HeldInstances(2, instance_type="other.type"), HeldInstances(2, spot=2)])
def test_instances_held_of_another_type_or_market_do_not_help(held):
    """Stage 0 is on-demand ``t.4gpu``: held instances of another type, or spot ones, are
    released at t = 0, and the job runs as if it held nothing."""
    spot_priced = cloud(spot_price_usd_per_hour=1800.0)
    nothing = simulate(SPEC, [8, 8], MODEL, spot_priced, samples=3)
    other = simulate(SPEC, [8, 8], MODEL, spot_priced, samples=3, held_at_start=held)
    assert np.array_equal(other.jct_s, nothing.jct_s) and np.array_equal(other.cost_usd, nothing.cost_usd)


RANDOM_MODEL = ModelProfile({1: Normal(40.0, 8.0), 2: Normal(25.0, 5.0)}, Normal(2.0, 0.5), Constant(1.0), name="r")


random_cloud = partial(cloud_profile, "t.4gpu", 4, 12.24, provision_s=Normal(20.0, 5.0), init_s=Normal(60.0, 15.0),
                       dataset_gb=1.0, usd_per_gb=0.05)


@pytest.mark.parametrize("kind", ["on-demand", "spot", "types"])
def test_nothing_held_is_the_model_bit_for_bit(kind):
    spot = {"spot_price_usd_per_hour": 3.0, "market": Market.SPOT,
            "spot": spot_market(rate_per_hour=2.0, notice_s=120)} if kind == "spot" else {}
    base = random_cloud(**spot)
    kwargs = {"cloud": base}
    if kind == "types":
        wide = CloudProfile.from_dict({**base.to_dict(), "instance_type": "t.8gpu", "gpus_per_instance": 8})
        kwargs = {"cloud": {"t.4gpu": base, "t.8gpu": wide}, "instance_types": ["t.8gpu", "t.4gpu"]}
    plain = simulate(SPEC, [8, 8], RANDOM_MODEL, samples=200, seed=3, **kwargs)
    for none in (None, 0, HeldInstances(0), HeldInstances(3, instance_type="t.other")):
        held = simulate(SPEC, [8, 8], RANDOM_MODEL, samples=200, seed=3, held_at_start=none, **kwargs)
        assert np.array_equal(held.jct_s, plain.jct_s) and np.array_equal(held.cost_usd, plain.cost_usd)


def test_held_spot_instances_start_at_once_and_are_reclaimed_as_any_spot_instance():
    spot = cloud(market=Market.SPOT, spot_price_usd_per_hour=1800.0, spot=spot_market(rate_per_hour=3.0, notice_s=0))
    result = simulate(SPEC, [8, 8], MODEL, spot, samples=400, seed=1, held_at_start=HeldInstances(2, spot=2))
    fresh = simulate(SPEC, [8, 8], MODEL, spot, samples=400, seed=1)
    # Unreclaimed samples wait for nothing; reclaims cost replacements and lost work.
    assert result.jct_s.min() == TRAIN0 + TRAIN1
    assert result.stages[0].mean_reclaims > 0 and result.jct_s.max() > TRAIN0 + TRAIN1
    assert result.stages[0].new_instances == 0 and fresh.stages[0].new_instances == 2
    assert result.mean_jct_s < fresh.mean_jct_s


@pytest.mark.parametrize("held,pattern", [
    (-1, r"held_at_start\.count: expected a whole number of instances >= 0, got -1"),
    ("2", r"held_at_start\.count: .* got '2'"),
    (HeldInstances(2, spot=3), r"held_at_start\.spot: 3 spot instances of 2 held; at most 2"),
    (HeldInstances(2, instance_type=4), r"held_at_start\.instance_type: expected an instance type name, got 4"),
])
def test_bad_held_instances_are_one_error_naming_the_field(held, pattern):
    with pytest.raises(SpecError, match=pattern):
        simulate(SPEC, [8, 8], MODEL, cloud(), samples=3, held_at_start=held)


def test_a_held_type_the_catalog_does_not_know_is_refused_not_ignored():
    """A typo in the held type would plan and simulate as if nothing were held."""
    from rubberband import load_experiment
    from rubberband.plan import compile_plan

    exp = load_experiment("experiments/resnet101_cifar10.yaml")
    held = HeldInstances(4, 0, "p3.8xlarg")
    with pytest.raises(SpecError, match=r"^held_at_start.instance_type: 'p3.8xlarg' is not a type of the cloud.*p3\.8xlarge"):
        compile_plan(exp.spec, exp.model, exp.catalog, exp.deadline_s, instance_type="auto", samples=20,
                     held_at_start=held)
    with pytest.raises(SpecError, match=r"^held_at_start.instance_type: 'p3.8xlarg' is not a type of the cloud"):
        simulate(exp.spec, [32, 20, 12, 8], exp.model, exp.catalog, samples=5, held_at_start=held,
                 instance_types=["p3.8xlarge"] * 4)
