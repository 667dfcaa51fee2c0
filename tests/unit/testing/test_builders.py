"""The test builders (rubberband.testing.builders) build what a profile file with the same
values loads to, fill in only what they are told, and stay pure."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from rubberband import CloudProfile, ModelProfile
from rubberband.profiles import Constant, Normal
from rubberband.profiles.cloud import Billing, BillingModel, DataCost, Market
from rubberband.profiles.spot import SpotMarket
from rubberband.testing.builders import (
    cloud_profile,
    fake_cloud,
    latency,
    model_profile,
    scaling_model,
    spot_cloud,
    spot_market,
    write_profile,
)


def test_a_cloud_profile_is_what_its_yaml_loads_to():
    built = cloud_profile("x.8gpu", 8, 24.48, spot_price_usd_per_hour=7.3, market="spot",
                          spot=spot_market(rate_per_hour=2.0, notice_s=120), granularity_s=60, minimum_s=120,
                          provision_s=Normal(30.0, 5.0), init_s=45, dataset_gb=20, usd_per_gb=0.02, gpu_memory_gb=16.0,
                          vcpus=32)
    loaded = CloudProfile.from_dict({
        "instance_type": "x.8gpu", "gpus_per_instance": 8, "price_usd_per_hour": 24.48, "spot_price_usd_per_hour": 7.3,
        "market": "spot", "spot": {"notice_s": 120, "preemption": {"rate_per_hour": 2.0}},
        "billing": {"model": "per_instance", "granularity_s": 60, "minimum_s": 120},
        "provision_latency_s": {"dist": "normal", "mean": 30.0, "std": 5.0}, "init_latency_s": 45,
        "data": {"dataset_gb": 20, "price_usd_per_gb": 0.02}, "gpu_memory_gb": 16.0, "vcpus": 32})
    assert built == loaded and built.to_dict() == loaded.to_dict()


def test_what_a_cloud_builder_is_not_told_stays_at_the_profiles_default():
    plain = cloud_profile()
    default = CloudProfile("test.type", 4, 12.24)
    assert plain == default
    assert cloud_profile(per_function=True).billing == Billing(BillingModel.PER_FUNCTION)
    assert cloud_profile(provision_s=10).provision_latency_s == Constant(10.0)
    assert cloud_profile(provision_s=10).init_latency_s == default.init_latency_s


def test_the_named_clouds_hold_the_figures_their_docstrings_give():
    spot = spot_cloud()
    assert (spot.instance_type, spot.G, spot.price_usd_per_hour, spot.spot_price_usd_per_hour) == ("p3.8xlarge", 4, 12.24, 3.67)
    assert spot.market is Market.SPOT and spot.spot == SpotMarket()
    assert (spot.provision_latency_s, spot.init_latency_s) == (Normal(30.0, 5.0), Normal(60.0, 10.0))
    assert spot.data == DataCost(0.15, 0.09) and spot.billing == Billing(BillingModel.PER_INSTANCE, 1.0, 60.0)
    on_demand = spot_cloud(market=Market.ON_DEMAND, price_usd_per_hour=3.67, spot_price_usd_per_hour=None)
    assert on_demand.hourly_usd == 3.67 and on_demand.spot_price_usd_per_hour is None
    fake = fake_cloud(2)
    assert (fake.instance_type, fake.G, fake.usd_per_second) == ("fake.gpu", 2, pytest.approx(0.001))
    assert (fake.provision_latency_s, fake.init_latency_s) == (Constant(10.0), Constant(5.0))


def test_a_model_profile_is_what_its_yaml_loads_to():
    built = model_profile({1: 4.0, 2: Normal(2.2, 0.2)}, startup_s=Normal(8.0, 1.0), sync_s=1, name="m",
                          packed_iter_latency_s={2: 6.4}, gpu_memory_gb_per_trial=3.0, measured_on="p3.8xlarge")
    loaded = ModelProfile.from_dict({
        "name": "m", "iter_latency_s": {1: 4.0, 2: {"dist": "normal", "mean": 2.2, "std": 0.2}},
        "trial_startup_s": {"dist": "normal", "mean": 8.0, "std": 1.0}, "sync_s": 1,
        "packed_iter_latency_s": {2: 6.4}, "gpu_memory_gb_per_trial": 3.0,
        "measured_on": {"instance_type": "p3.8xlarge"}})
    assert built == loaded and built.to_dict() == loaded.to_dict()
    assert model_profile({1: 1.0}) == ModelProfile.from_dict({"iter_latency_s": {1: 1.0}})
    assert latency(3) == Constant(3.0) and latency(Normal(1.0, 0.1)) == Normal(1.0, 0.1)


def test_the_scaling_model_follows_the_figure_12_curve():
    model = scaling_model(packed={2: 1.3})
    assert model.latency(1) == Normal(12.0, 1.2)
    # 8 GPUs: 12 s x (0.05 + 0.95 / 8) = 12 s x 0.16875.
    assert (model.latency(8).mean, model.latency(8).std) == (pytest.approx(2.025), pytest.approx(0.2025))
    assert model.packed_latency(2).mean == pytest.approx(15.6) and model.packing_counts == (1, 2)
    assert model.gpu_counts == (1, 2, 4, 8) and model.measured_on == {"instance_type": "p3.16xlarge"}
    assert scaling_model(gpus=(1,)).gpu_counts == (1,) and scaling_model().packed_iter_latency_s == {}


@pytest.mark.parametrize("profile", [scaling_model(packed={2: 1.3, 4: 2.2}), spot_cloud(spot=spot_market(3.0, 120))])
def test_a_written_profile_loads_back_the_same(tmp_path, profile):
    path = write_profile(tmp_path / "p.yaml", profile)
    if isinstance(profile, ModelProfile):
        assert ModelProfile.load(path) == profile
    else:
        assert CloudProfile.from_dict(yaml.safe_load(path.read_text())) == profile


def test_the_builders_import_no_ray_boto3_or_torch():
    code = ("import sys, rubberband.testing.builders; "
            "print(sorted(m for m in ('ray', 'boto3', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
