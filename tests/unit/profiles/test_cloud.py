"""CloudProfile and CloudCatalog: the DESIGN §3 shape, region files, markets, overrides, billing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rubberband import (
    Billing,
    BillingModel,
    CloudCatalog,
    CloudProfile,
    DataCost,
    Market,
    SpecError,
)
from rubberband.profiles import Constant, Normal
from rubberband.profiles.distributions import parse_distribution

ROOT = Path(__file__).resolve().parents[3]
AWS = ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml"
LOCAL = ROOT / "cloud_profiles" / "local" / "local.yaml"

DESIGN_EXAMPLE = """
provider: aws
region: us-east-1
instance_type: p3.8xlarge
gpus_per_instance: 4
price_usd_per_hour: 12.24
spot_price_usd_per_hour: 3.67          # optional
billing: {model: per_instance, granularity_s: 1, minimum_s: 60}   # or {model: per_function}
provision_latency_s: {dist: normal, mean: 30, std: 5}
init_latency_s: {dist: constant, value: 60}
data: {dataset_gb: 0.15, price_usd_per_gb: 0.0}
"""


def test_from_dict_with_the_design_example():
    cloud = CloudProfile.from_dict(yaml.safe_load(DESIGN_EXAMPLE))
    assert cloud.provider == "aws"
    assert cloud.region == "us-east-1"
    assert cloud.instance_type == "p3.8xlarge"
    assert cloud.gpus_per_instance == cloud.G == 4
    assert cloud.price_usd_per_hour == 12.24
    assert cloud.spot_price_usd_per_hour == 3.67
    assert cloud.market is Market.ON_DEMAND
    assert cloud.hourly_usd == 12.24
    assert cloud.usd_per_second == pytest.approx(12.24 / 3600, rel=1e-15)
    assert cloud.billing == Billing(BillingModel.PER_INSTANCE, 1.0, 60.0)
    assert cloud.provision_latency_s == Normal(30.0, 5.0)
    assert cloud.init_latency_s == Constant(60.0)
    assert cloud.data == DataCost(0.15, 0.0)
    assert CloudProfile.from_dict(cloud.to_dict()) == cloud


def test_from_dict_defaults():
    cloud = CloudProfile.from_dict({"gpus_per_instance": 1, "price_usd_per_hour": 3.06})
    assert cloud.billing == Billing(BillingModel.PER_INSTANCE, granularity_s=1.0, minimum_s=60.0)
    assert cloud.data.usd_per_launch == 0.0


def test_aws_catalog_loads():
    catalog = CloudCatalog.load(AWS)
    assert (catalog.provider, catalog.region) == ("aws", "us-east-1")
    assert "p3.8xlarge" in catalog.instance_types
    assert len(catalog.instance_types) >= 10
    for name in catalog.instance_types:
        cloud = catalog.get(name)
        assert cloud.instance_type == name
        assert cloud.gpus_per_instance >= 1
        assert cloud.price_usd_per_hour > 0
        assert cloud.spot_price_usd_per_hour is not None
        assert cloud.prices_as_of == catalog.prices_as_of


def test_local_catalog_loads():
    catalog = CloudCatalog.load(LOCAL)
    assert catalog.provider == "local"
    assert catalog.instance_types == ["local.1gpu", "local.2gpu", "local.4gpu"]
    assert [catalog.get(t).G for t in catalog.instance_types] == [1, 2, 4]
    two = catalog.get("local.2gpu")
    defaults = yaml.safe_load(LOCAL.read_text())["defaults"]   # init latency is re-measured by scripts/demo
    assert two.init_latency_s == parse_distribution(defaults["init_latency_s"], "init")
    assert two.provision_latency_s == Normal(2.0, 0.3)


def test_load_one_instance_type():
    cloud = CloudProfile.load(AWS, "p3.8xlarge")
    assert cloud.price_usd_per_hour == 12.24
    assert cloud.G == 4
    assert cloud.gpu_model == "V100"
    assert cloud.market is Market.ON_DEMAND
    # The region file's defaults fill in what the entry leaves out.
    assert cloud.billing == Billing(BillingModel.PER_INSTANCE, 1.0, 60.0)
    assert cloud.init_latency_s == Normal(90.0, 15.0)


def test_unknown_instance_type_suggests_the_closest():
    with pytest.raises(SpecError, match=r"instance_type: 'p3\.8xlarg' is not in .*did you mean `p3\.8xlarge`"):
        CloudProfile.load(AWS, "p3.8xlarg")


def test_spot_market_uses_the_spot_price():
    spot = CloudProfile.load(AWS, "p3.8xlarge", market="spot")
    assert spot.market is Market.SPOT
    assert spot.hourly_usd == spot.spot_price_usd_per_hour == 1.4129
    assert spot.usd_per_second == pytest.approx(1.4129 / 3600, rel=1e-15)
    assert CloudProfile.load(AWS, "p3.8xlarge", market=Market.SPOT) == spot


def test_spot_without_a_spot_price_is_rejected():
    with pytest.raises(SpecError, match="market: spot chosen but local.1gpu has no spot_price_usd_per_hour"):
        CloudProfile.load(LOCAL, "local.1gpu", market="spot")


def test_unknown_market():
    with pytest.raises(SpecError, match=r"market: unknown value 'spt' \(did you mean `spot`\?\)"):
        CloudProfile.load(AWS, "p3.8xlarge", market="spt")


@pytest.fixture
def catalog() -> CloudCatalog:
    return CloudCatalog.from_dict({
        "provider": "aws",
        "region": "test-1",
        "defaults": {
            "data": {"dataset_gb": 1.0, "price_usd_per_gb": 0.09},
            "init_latency_s": {"dist": "constant", "value": 60},
        },
        "instance_types": {"big": {"gpus_per_instance": 8, "price_usd_per_hour": 24.0}},
    })


def test_overrides_merge_data_key_by_key(catalog):
    cloud = catalog.get("big", overrides={"data": {"dataset_gb": 150}})
    assert cloud.data == DataCost(150.0, 0.09)
    assert cloud.data.usd_per_launch == pytest.approx(13.5, rel=1e-12)
    assert catalog.get("big").data == DataCost(1.0, 0.09)       # the catalog is untouched


def test_overrides_replace_other_fields(catalog):
    cloud = catalog.get("big", overrides={
        "init_latency_s": {"dist": "constant", "value": 15},
        "price_usd_per_hour": 20.0,
        "billing": {"model": "per_function"},
    })
    assert cloud.init_latency_s == Constant(15.0)
    assert cloud.price_usd_per_hour == 20.0
    assert cloud.billing.model is BillingModel.PER_FUNCTION


def test_init_contention_is_optional_zero_by_default_and_an_override(catalog):
    # DESIGN §3/§4: seconds each INIT grows per other instance launched with it (instances
    # sharing one machine, the local provider); absent, the model is today's.
    assert catalog.get("big").init_contention_s == 0.0
    assert "init_contention_s" not in catalog.get("big").to_dict()
    cloud = catalog.get("big", overrides={"init_contention_s": 1.25})
    assert cloud.init_contention_s == 1.25
    assert CloudProfile.from_dict(cloud.to_dict()) == cloud
    with pytest.raises(SpecError, match=r"^cloud\.overrides\.init_contention_s: .*-1"):
        catalog.get("big", overrides={"init_contention_s": -1})


def test_unknown_override_key_is_rejected(catalog):
    with pytest.raises(SpecError, match=r"cloud\.overrides\.init_latncy_s: unknown key \(did you mean `init_latency_s`\?\)"):
        catalog.get("big", overrides={"init_latncy_s": 3})


def test_market_is_not_an_override(catalog):
    with pytest.raises(SpecError, match=r"cloud\.overrides\.market: unknown key"):
        catalog.get("big", overrides={"market": "spot"})


def test_bad_billing_model():
    with pytest.raises(SpecError, match=r"^billing\.model: unknown value 'per_hour'.*per_instance, per_function"):
        Billing.from_dict({"model": "per_hour"})


def test_bad_billing_model_in_a_profile():
    data = yaml.safe_load(DESIGN_EXAMPLE)
    data["billing"] = {"model": "per-instance"}
    with pytest.raises(SpecError, match=r"cloud_profile\.billing\.model: unknown value 'per-instance' \(did you mean `per_instance`\?\)"):
        CloudProfile.from_dict(data)


def test_per_function_billing_parses():
    billing = Billing.from_dict({"model": "per_function"})
    assert billing.model is BillingModel.PER_FUNCTION
    assert billing.to_dict() == {"model": "per_function"}
    data = yaml.safe_load(DESIGN_EXAMPLE)
    data["billing"] = {"model": "per_function"}
    assert CloudProfile.from_dict(data).billing.model is BillingModel.PER_FUNCTION


def test_per_instance_billing_rounding_fields():
    billing = Billing.from_dict({"model": "per_instance", "granularity_s": 60, "minimum_s": 0})
    assert (billing.granularity_s, billing.minimum_s) == (60.0, 0.0)


@pytest.mark.parametrize(
    ("billing", "pattern"),
    [
        ({"model": "per_instance", "granularity_s": 0}, r"billing\.granularity_s: must be greater than 0"),
        ({"model": "per_instance", "minimum_s": -1}, r"billing\.minimum_s: must be at least 0"),
        ({"granularity_s": 1}, r"billing\.model: missing required field"),
        ({"model": "per_instance", "granularity": 1}, r"billing\.granularity: unknown key \(did you mean `granularity_s`\?\)"),
    ],
)
def test_billing_errors(billing, pattern):
    with pytest.raises(SpecError, match=pattern):
        Billing.from_dict(billing)


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"gpus_per_instance": 0}, r"cloud_profile\.gpus_per_instance: must be at least 1"),
        ({"gpus_per_instance": 2.5}, r"cloud_profile\.gpus_per_instance: expected an integer"),
        ({"price_usd_per_hour": -1}, r"cloud_profile\.price_usd_per_hour: must be greater than 0, got -1"),
        ({"price_usd_per_hour": 0}, r"cloud_profile\.price_usd_per_hour: must be greater than 0, got 0"),
        ({"spot_price_usd_per_hour": 0}, r"cloud_profile\.spot_price_usd_per_hour: must be greater than 0, got 0"),
        ({"price_usd_per_hour": None}, r"cloud_profile\.price_usd_per_hour: missing required field"),
        ({"data": {"dataset_gb": -1}}, r"cloud_profile\.data\.dataset_gb: must be at least 0"),
        ({"data": {"dataset_gbs": 1}}, r"cloud_profile\.data\.dataset_gbs: unknown key"),
        ({"init_latency_s": {"dist": "normal", "mean": 1}}, r"cloud_profile\.init_latency_s\.std: missing"),
        ({"gpu": 4}, r"cloud_profile\.gpu: unknown key"),
    ],
)
def test_from_dict_errors_name_the_field(change, pattern):
    data = {**yaml.safe_load(DESIGN_EXAMPLE), **change}
    with pytest.raises(SpecError, match=pattern):
        CloudProfile.from_dict(data)


def test_catalog_rejects_a_bad_entry_at_load():
    with pytest.raises(SpecError, match=r"cloud_profile\.instance_types\.bad\.gpus_per_instance: missing required field"):
        CloudCatalog.from_dict({"provider": "aws", "region": "x", "instance_types": {"bad": {"price_usd_per_hour": 1}}})


def test_replace_is_a_copy():
    cloud = CloudProfile.load(AWS, "p3.8xlarge")
    cheaper = cloud.replace(price_usd_per_hour=1.0)
    assert cheaper.price_usd_per_hour == 1.0
    assert cloud.price_usd_per_hour == 12.24


def test_a_free_instance_type_in_a_region_file_is_refused_at_load():
    entry = {"gpus_per_instance": 1, "price_usd_per_hour": 1.0, "spot_price_usd_per_hour": 0.0}
    with pytest.raises(SpecError, match=r"^r\.yaml\.instance_types\.t\.spot_price_usd_per_hour: must be greater than 0, got 0\.0$"):
        CloudCatalog.from_dict({"provider": "aws", "region": "x", "instance_types": {"t": entry}}, where="r.yaml")


@pytest.mark.parametrize(
    ("overrides", "market", "pattern"),
    [
        ({"price_usd_per_hour": 0}, "on-demand", r"^cloud\.overrides\.price_usd_per_hour: must be greater than 0, got 0$"),
        ({"price_usd_per_hour": -3.5}, "on-demand", r"^cloud\.overrides\.price_usd_per_hour: must be greater than 0, got -3\.5$"),
        ({"spot_price_usd_per_hour": 0}, "spot", r"^cloud\.overrides\.spot_price_usd_per_hour: must be greater than 0, got 0$"),
        ({"billing": {"granularity_s": 0}}, "on-demand", r"^cloud\.overrides\.billing\.granularity_s: must be greater than 0, got 0$"),
        ({"billing": {"minimum_s": -1}}, "on-demand", r"^cloud\.overrides\.billing\.minimum_s: must be at least 0, got -1$"),
        ({"billing": {"model": "per_hour"}}, "on-demand", r"^cloud\.overrides\.billing\.model: unknown value 'per_hour'"),
        ({"billing": 60}, "on-demand", r"^cloud\.overrides\.billing: expected a mapping"),
        ({"data": {"dataset_gb": -1}}, "on-demand", r"^cloud\.overrides\.data\.dataset_gb: must be at least 0"),
        ({"init_latency_s": {"dist": "normal", "mean": 1}}, "on-demand", r"^cloud\.overrides\.init_latency_s\.std: missing"),
    ],
)
def test_override_errors_name_the_override_not_the_region_file(overrides, market, pattern):
    with pytest.raises(SpecError, match=pattern):
        CloudCatalog.load(AWS).get("p3.8xlarge", market, overrides)


def test_a_partial_billing_override_keeps_the_rest_of_the_profiles_billing():
    catalog = CloudCatalog.from_dict({
        "provider": "aws", "region": "x",
        "defaults": {"billing": {"model": "per_instance", "granularity_s": 60, "minimum_s": 600}},
        "instance_types": {"t": {"gpus_per_instance": 1, "price_usd_per_hour": 1.0}},
    })
    assert catalog.get("t", overrides={"billing": {"minimum_s": 0}}).billing == Billing(BillingModel.PER_INSTANCE, 60.0, 0.0)
    assert catalog.get("t", overrides={"billing": {"granularity_s": 1}}).billing == Billing(BillingModel.PER_INSTANCE, 1.0, 600.0)
    assert catalog.get("t", overrides={"billing": {"model": "per_function"}}).billing.model is BillingModel.PER_FUNCTION
    assert catalog.with_overrides({"billing": {"minimum_s": 5}}).get("t").billing == Billing(BillingModel.PER_INSTANCE, 60.0, 5.0)


def test_an_override_may_give_the_spot_price_a_spot_market_needs():
    catalog = CloudCatalog.from_dict({"provider": "aws", "region": "x",
                                      "instance_types": {"t": {"gpus_per_instance": 1, "price_usd_per_hour": 1.0}}})
    assert catalog.get("t", "spot", {"spot_price_usd_per_hour": 0.3}).hourly_usd == 0.3
    with pytest.raises(SpecError, match=r"^market: spot chosen but t has no spot_price_usd_per_hour"):
        catalog.get("t", "spot")


def test_replace_refuses_a_free_price():
    with pytest.raises(SpecError, match=r"^price_usd_per_hour: must be greater than 0, got 0"):
        CloudProfile.load(AWS, "p3.8xlarge").replace(price_usd_per_hour=0)


# --- spot prices per Availability Zone --------------------------------------------------------
TRACES = ROOT / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json"


def _zoned_catalog(tmp_path, zones=None, **type_fields):
    data = yaml.safe_load(AWS.read_text())
    if zones is not None:
        data["zones"] = zones
    data["instance_types"]["p3.2xlarge"].update(type_fields)
    path = tmp_path / "us-east-1.yaml"
    path.write_text(yaml.safe_dump(data))
    return CloudCatalog.load(path)


def test_shipped_per_az_prices_price_no_zone_name_without_the_accounts_mapping():
    # The shipped per-AZ prices are keyed by AZ ID; which ID us-east-1a is depends on the account.
    profile = CloudCatalog.load(AWS).get("p3.2xlarge")
    assert yaml.safe_load(AWS.read_text())["instance_types"]["p3.2xlarge"]["spot_price_usd_per_hour_by_az"]["use1-az1"] == 1.2345
    assert profile.spot_price_usd_per_hour_by_zone == ()
    assert profile.zone_spot_price("us-east-1a") is None


def test_zone_names_are_priced_through_the_catalogs_zone_ids(tmp_path):
    catalog = _zoned_catalog(tmp_path, zones={"us-east-1a": "use1-az6", "us-east-1c": "use1-az1", "us-east-1z": "use1-az9"})
    profile = catalog.get("p3.2xlarge")
    assert dict(profile.spot_price_usd_per_hour_by_zone) == {"us-east-1a": 1.2774, "us-east-1c": 1.2345}
    assert profile.zone_spot_price("us-east-1c") == 1.2345
    assert CloudProfile.from_dict(profile.to_dict()) == profile     # round trip, prices by zone name


def test_a_trace_zone_with_a_known_price_prices_the_spot_market(tmp_path):
    catalog = _zoned_catalog(tmp_path, zones={"us-east-1a": "use1-az6", "us-east-1c": "use1-az1"})
    trace = {"notice_s": 120, "preemption": {"trace": {"file": str(TRACES), "zone": "us-east-1c"}}}
    assert catalog.get("p3.2xlarge", "spot", {"spot": trace}).hourly_usd == 1.2345
    # A price the experiment sets wins; a zone with no known price keeps the type's.
    assert catalog.get("p3.2xlarge", "spot", {"spot": trace, "spot_price_usd_per_hour": 0.5}).hourly_usd == 0.5
    other = {"preemption": {"trace": {"file": str(TRACES), "zone": "us-east-1d"}}}
    assert catalog.get("p3.2xlarge", "spot", {"spot": other}).hourly_usd == 0.3707


def test_in_zone_swaps_the_trace_and_the_price(tmp_path):
    catalog = _zoned_catalog(tmp_path, zones={"us-east-1a": "use1-az6"})
    base = catalog.get("p3.2xlarge", "spot", {"spot": {"notice_s": 120, "preemption": {
        "trace": {"file": str(TRACES), "zone": "us-east-1c"}}}})
    moved = base.in_zone("us-east-1a")
    assert (moved.spot.trace.zone, moved.spot.notice_s, moved.hourly_usd) == ("us-east-1a", 120, 1.2774)
    assert base.in_zone("us-east-1f").hourly_usd == 0.3707        # no known price there
    with pytest.raises(SpecError, match=r"zone: 'us-east-1q' has no 1-instance trace .* choose one of"):
        base.in_zone("us-east-1q")
    with pytest.raises(SpecError, match=r"^zone: no trace file to replay the zone from; set cloud.overrides.spot"):
        catalog.get("p3.2xlarge").in_zone("us-east-1a")


def test_an_experiment_may_give_prices_by_zone_name(tmp_path):
    profile = CloudCatalog.load(AWS).get("p3.2xlarge", "spot", {"spot_price_usd_per_hour_by_zone": {"us-east-1f": 0.9}})
    assert profile.zone_spot_price("us-east-1f") == 0.9


@pytest.mark.parametrize("zones, type_fields, match", [
    ({"us-east-1a": 4}, {}, r"\.zones: expected a mapping of zone name to AZ ID"),
    (None, {"spot_price_usd_per_hour_by_az": [1.0]}, r"p3\.2xlarge\.spot_price_usd_per_hour_by_az: expected a mapping of AZ IDs"),
    (None, {"spot_price_usd_per_hour_by_az": {"use1-az1": -1}}, r"spot_price_usd_per_hour_by_az\.use1-az1: "),
    (None, {"spot_price_usd_per_hour_by_zone": {"us-east-1a": 0}}, r"spot_price_usd_per_hour_by_zone\.us-east-1a: "),
])
def test_bad_zone_prices_are_one_line_errors(tmp_path, zones, type_fields, match):
    with pytest.raises(SpecError, match=match):
        _zoned_catalog(tmp_path, zones=zones, **type_fields)


def test_price_by_market_whatever_the_profiles_own_market():
    p3 = CloudCatalog.load(AWS).get("p3.8xlarge")
    assert (p3.price("on-demand"), p3.price(Market.SPOT), p3.hourly_usd) == (12.24, 1.4129, 12.24)
    assert p3.replace(market=Market.SPOT).hourly_usd == 1.4129
    with pytest.raises(SpecError, match=r"^market: spot asked of p3\.8xlarge, which has no spot_price_usd_per_hour"):
        p3.replace(spot_price_usd_per_hour=None).price("spot")
