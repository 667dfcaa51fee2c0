"""Tests for scripts/fetch_aws_prices.py (stubbed AWS clients, no network) and the shipped AWS region files."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import sys
from pathlib import Path

import botocore.session
import pytest
import yaml
from botocore.stub import Stubber

from rubberband.profiles import CloudCatalog, CloudProfile

REPO = Path(__file__).resolve().parents[3]
NOW = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)
TODAY = dt.date(2026, 11, 25)


def _load_script():
    spec = importlib.util.spec_from_file_location("fetch_aws_prices", REPO / "scripts" / "fetch_aws_prices.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fetch_aws_prices"] = module
    spec.loader.exec_module(module)
    return module


fap = _load_script()


# --- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch, tmp_path):
    """Fake credentials and empty config so nothing can reach a real AWS account."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def clients():
    """Real botocore clients with Stubbers attached: (pricing, pricing_stub, ec2, ec2_stub)."""
    session = botocore.session.get_session()
    pricing = session.create_client("pricing", region_name="us-east-1")
    ec2 = session.create_client("ec2", region_name="us-east-1")
    with Stubber(pricing) as pricing_stub, Stubber(ec2) as ec2_stub:
        yield pricing, pricing_stub, ec2, ec2_stub
        pricing_stub.assert_no_pending_responses()
        ec2_stub.assert_no_pending_responses()


def price_item(instance_type, usd, *, vcpu, memory, gpu, gpu_memory="NA", operation="RunInstances",
               marketoption="OnDemand", sku="ABCDEFGH12345678"):
    """A PriceList entry shaped like the real Pricing API answer (a JSON string)."""
    return json.dumps({
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {
                "enhancedNetworkingSupported": "Yes", "memory": memory, "vcpu": vcpu, "gpu": gpu,
                "gpuMemory": gpu_memory, "capacitystatus": "Used", "locationType": "AWS Region",
                "instanceFamily": "GPU instance", "operatingSystem": "Linux", "regionCode": "us-east-1",
                "location": "US East (N. Virginia)", "servicename": "Amazon Elastic Compute Cloud",
                "instanceType": instance_type, "tenancy": "Shared", "usagetype": f"BoxUsage:{instance_type}",
                "servicecode": "AmazonEC2", "licenseModel": "No License required", "currentGeneration": "Yes",
                "preInstalledSw": "NA", "processorArchitecture": "64-bit", "marketoption": marketoption,
                "operation": operation, "availabilityzone": "NA",
            },
            "sku": sku,
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                f"{sku}.JRTCKXETXF": {
                    "priceDimensions": {
                        f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                            "unit": "Hrs", "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                            "description": f"${usd} per On Demand Linux {instance_type} Instance Hour",
                            "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7",
                            "pricePerUnit": {"USD": f"{usd:.10f}"},
                        }
                    },
                    "sku": sku, "effectiveDate": "2025-06-01T00:00:00Z", "offerTermCode": "JRTCKXETXF",
                    "termAttributes": {},
                }
            }
        },
        "version": "20251120000000",
        "publicationDate": "2025-11-20T00:00:00Z",
    })


def products_params(instance_type, token=None):
    params = {
        "ServiceCode": "AmazonEC2",
        "Filters": fap.pricing_filters("us-east-1", instance_type),
        "FormatVersion": "aws_v1",
        "MaxResults": 100,
    }
    if token:
        params["NextToken"] = token
    return params


def spot_record(instance_type, zone, price, minutes_ago=0):
    return {
        "AvailabilityZone": zone, "InstanceType": instance_type, "ProductDescription": "Linux/UNIX",
        "SpotPrice": f"{price:.6f}", "Timestamp": NOW - dt.timedelta(minutes=minutes_ago),
    }


def spot_params(types, token=None):
    params = {"InstanceTypes": list(types), "ProductDescriptions": ["Linux/UNIX"], "StartTime": NOW}
    if token:
        params["NextToken"] = token
    return params


P3 = dict(vcpu="32", memory="244 GiB", gpu="4", gpu_memory="64 GiB")
G5 = dict(vcpu="48", memory="192 GiB", gpu="4", gpu_memory="96 GiB")


def stub_happy_path(pricing_stub, ec2_stub):
    """p3.8xlarge over two get_products pages, g5.12xlarge on one; spot over two pages and four AZs."""
    pricing_stub.add_response(
        "get_products",
        {"FormatVersion": "aws_v1", "NextToken": "page-2",
         # a Capacity Block product on page 1 must not be taken for the on-demand price
         "PriceList": [price_item("p3.8xlarge", 31.464, **P3, marketoption="CapacityBlock", sku="CBCBCBCBCBCBCBCB")]},
        products_params("p3.8xlarge"),
    )
    pricing_stub.add_response(
        "get_products",
        {"FormatVersion": "aws_v1", "PriceList": [price_item("p3.8xlarge", 12.24, **P3)]},
        products_params("p3.8xlarge", token="page-2"),
    )
    pricing_stub.add_response(
        "get_products",
        {"FormatVersion": "aws_v1", "PriceList": [price_item("g5.12xlarge", 5.672, **G5, sku="G5G5G5G5G5G5G5G5")]},
        products_params("g5.12xlarge"),
    )
    types = ["p3.8xlarge", "g5.12xlarge"]
    ec2_stub.add_response(
        "describe_spot_price_history",
        {"NextToken": "spot-2", "SpotPriceHistory": [
            spot_record("p3.8xlarge", "us-east-1a", 3.6720),
            spot_record("p3.8xlarge", "us-east-1b", 1.9000),
            spot_record("p3.8xlarge", "us-east-1-atl-2a", 0.5000),  # Local Zone: ignored
            spot_record("g5.12xlarge", "us-east-1a", 2.0796),
        ]},
        spot_params(types),
    )
    ec2_stub.add_response(
        "describe_spot_price_history",
        {"NextToken": "", "SpotPriceHistory": [
            spot_record("p3.8xlarge", "us-east-1c", 1.1000, minutes_ago=90),  # superseded below
            spot_record("p3.8xlarge", "us-east-1c", 2.5000, minutes_ago=5),
            spot_record("g5.12xlarge", "us-east-1d", 2.2000),
        ]},
        spot_params(types, token="spot-2"),
    )
    ec2_stub.add_response(
        "describe_availability_zones",
        {"AvailabilityZones": [
            {"ZoneName": "us-east-1b", "ZoneId": "use1-az2"},   # names are this account's: not in order of ID
            {"ZoneName": "us-east-1a", "ZoneId": "use1-az6"},
            {"ZoneName": "us-east-1c", "ZoneId": "use1-az1"},
            {"ZoneName": "us-east-1d", "ZoneId": "use1-az4"},
        ]},
        {"Filters": [{"Name": "zone-type", "Values": ["availability-zone"]}]},
    )
    return types


EXISTING = {
    "provider": "aws",
    "region": "us-east-1",
    "prices_as_of": "2024-01-01",
    "defaults": {
        "billing": {"model": "per_instance", "granularity_s": 1, "minimum_s": 60},
        "provision_latency_s": {"dist": "normal", "mean": 25, "std": 5},
        "init_latency_s": {"dist": "constant", "value": 75},
        "data": {"dataset_gb": 0.15, "price_usd_per_gb": 0.0},
    },
    "instance_types": {
        "p3.8xlarge": {"family": "p3", "gpus_per_instance": 4, "gpu_model": "V100", "gpu_memory_gb": 16,
                       "price_usd_per_hour": 9.99, "spot_price_usd_per_hour": 3.0,
                       "init_latency_s": {"dist": "constant", "value": 120}},
    },
}


# --- the core function -------------------------------------------------------------------------
def test_fetch_region_parses_both_apis_and_keeps_existing_fields(clients):
    pricing, pricing_stub, ec2, ec2_stub = clients
    types = stub_happy_path(pricing_stub, ec2_stub)

    data = fap.fetch_region("us-east-1", types, pricing_client=pricing, ec2_client=ec2,
                            existing=EXISTING, today=TODAY, now=NOW)

    assert data["provider"] == "aws" and data["region"] == "us-east-1"
    assert data["prices_as_of"] == "2026-11-25"
    assert data["defaults"] == EXISTING["defaults"]
    assert list(data["instance_types"]) == types
    p3 = data["instance_types"]["p3.8xlarge"]
    assert p3["price_usd_per_hour"] == 12.24  # not the Capacity Block product, not the stale 9.99
    assert p3["spot_price_usd_per_hour"] == 1.9  # cheapest current AZ price; 0.5 (Local Zone) and 1.1 (old) ignored
    assert (p3["gpus_per_instance"], p3["vcpus"], p3["memory_gb"]) == (4, 32, 244)
    assert (p3["family"], p3["gpu_model"], p3["gpu_memory_gb"]) == ("p3", "V100", 16)
    assert p3["init_latency_s"] == {"dist": "constant", "value": 120}  # per-type override kept
    g5 = data["instance_types"]["g5.12xlarge"]  # new type: hardware fields from the API and the family table
    assert g5 == {"family": "g5", "gpus_per_instance": 4, "gpu_model": "A10G", "gpu_memory_gb": 24,
                  "vcpus": 48, "memory_gb": 192, "price_usd_per_hour": 5.672, "spot_price_usd_per_hour": 2.0796,
                  "spot_price_usd_per_hour_by_az": {"use1-az4": 2.2, "use1-az6": 2.0796}}
    # Every AZ's current price is kept by AZ ID (the Local Zone's is not), with the account's names -> IDs.
    assert p3["spot_price_usd_per_hour_by_az"] == {"use1-az1": 2.5, "use1-az2": 1.9, "use1-az6": 3.672}
    assert data["zones"] == {"us-east-1a": "use1-az6", "us-east-1b": "use1-az2", "us-east-1c": "use1-az1",
                             "us-east-1d": "use1-az4"}


def test_written_file_loads_with_cloud_catalog(clients, tmp_path):
    pricing, pricing_stub, ec2, ec2_stub = clients
    types = stub_happy_path(pricing_stub, ec2_stub)
    data = fap.fetch_region("us-east-1", types, pricing_client=pricing, ec2_client=ec2,
                            existing=EXISTING, today=TODAY, now=NOW)

    path = fap.write_region_file(data, tmp_path / "aws" / "us-east-1.yaml")

    catalog = CloudCatalog.load(path)
    assert catalog.instance_types == types and catalog.prices_as_of == "2026-11-25"
    profile = CloudProfile.load(path, "p3.8xlarge")
    assert profile.G == 4 and profile.price_usd_per_hour == 12.24 and profile.spot_price_usd_per_hour == 1.9
    assert profile.init_latency_s.to_dict() == {"dist": "constant", "value": 120.0}
    assert profile.data.dataset_gb == 0.15
    assert CloudProfile.load(path, "p3.8xlarge", market="spot").hourly_usd == 1.9
    assert CloudProfile.load(path, "g5.12xlarge").price_usd_per_hour == 5.672
    # Zone names are priced through the file's own names -> AZ IDs mapping.
    assert CloudProfile.load(path, "p3.8xlarge").zone_spot_price("us-east-1a") == 3.672
    assert CloudProfile.load(path, "p3.8xlarge").zone_spot_price("us-east-1d") is None


def test_new_region_file_gets_default_defaults(clients):
    pricing, pricing_stub, ec2, ec2_stub = clients
    types = stub_happy_path(pricing_stub, ec2_stub)
    data = fap.fetch_region("us-east-1", types, pricing_client=pricing, ec2_client=ec2, today=TODAY, now=NOW)
    assert data["defaults"] == fap.DEFAULT_DEFAULTS
    fap.validate(data, "new-file")


def test_main_dry_run_prints_yaml_and_writes_nothing(clients, monkeypatch, tmp_path, capsys):
    pricing, pricing_stub, ec2, ec2_stub = clients
    types = stub_happy_path(pricing_stub, ec2_stub)
    monkeypatch.setattr(fap, "make_clients", lambda region: (pricing, ec2))
    real_fetch_spot = fap.fetch_spot_by_zone
    monkeypatch.setattr(fap, "fetch_spot_by_zone", lambda *a, **k: real_fetch_spot(*a, **{**k, "now": NOW}))
    out = tmp_path / "us-east-1.yaml"

    assert fap.main(["--region", "us-east-1", "--types", ",".join(types), "--out", str(out), "--dry-run"]) == 0

    assert not out.exists()
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["instance_types"]["p3.8xlarge"]["price_usd_per_hour"] == 12.24
    CloudCatalog.from_dict(printed)


# --- errors ------------------------------------------------------------------------------------
def test_type_missing_from_pricing_api_is_named(clients):
    pricing, pricing_stub, ec2, _ = clients
    pricing_stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": []},
                              products_params("p3.9xlarge"))
    with pytest.raises(fap.PriceFetchError, match=r"'p3\.9xlarge' was not returned by the AWS Pricing API for us-east-1") as err:
        fap.fetch_region("us-east-1", ["p3.9xlarge"], pricing_client=pricing, ec2_client=ec2, now=NOW)
    assert "\n" not in str(err.value)


def test_pricing_client_error_is_one_line(clients):
    pricing, pricing_stub, ec2, _ = clients
    pricing_stub.add_client_error(
        "get_products", service_error_code="AccessDeniedException",
        service_message="User: arn:aws:iam::123456789012:user/x is not authorized\nto perform: pricing:GetProducts",
        http_status_code=400, expected_params=products_params("p3.8xlarge"),
    )
    with pytest.raises(fap.PriceFetchError) as err:
        fap.fetch_region("us-east-1", ["p3.8xlarge"], pricing_client=pricing, ec2_client=ec2, now=NOW)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("pricing.get_products failed (AccessDeniedException: User:")
    assert "check AWS credentials" in message


def test_spot_client_error_is_one_line(clients):
    pricing, pricing_stub, ec2, ec2_stub = clients
    pricing_stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [price_item("p3.8xlarge", 12.24, **P3)]},
                              products_params("p3.8xlarge"))
    ec2_stub.add_client_error("describe_spot_price_history", service_error_code="UnauthorizedOperation",
                              service_message="You are not authorized to perform this operation.",
                              expected_params=spot_params(["p3.8xlarge"]))
    with pytest.raises(fap.PriceFetchError, match=r"^ec2\.describe_spot_price_history failed \(UnauthorizedOperation"):
        fap.fetch_region("us-east-1", ["p3.8xlarge"], pricing_client=pricing, ec2_client=ec2, now=NOW)


def test_zone_ids_client_error_is_one_line(clients):
    pricing, pricing_stub, ec2, ec2_stub = clients
    pricing_stub.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [price_item("p3.8xlarge", 12.24, **P3)]},
                              products_params("p3.8xlarge"))
    ec2_stub.add_response("describe_spot_price_history", {"SpotPriceHistory": []}, spot_params(["p3.8xlarge"]))
    ec2_stub.add_client_error("describe_availability_zones", service_error_code="UnauthorizedOperation",
                              service_message="You are not\nauthorized.")
    with pytest.raises(fap.PriceFetchError, match=r"^ec2\.describe_availability_zones failed \(UnauthorizedOperation: You are not authorized\.\);"):
        fap.fetch_region("us-east-1", ["p3.8xlarge"], pricing_client=pricing, ec2_client=ec2, now=NOW)


def test_main_reports_errors_on_one_line(clients, monkeypatch, tmp_path, capsys):
    pricing, pricing_stub, ec2, _ = clients
    pricing_stub.add_client_error("get_products", service_error_code="ThrottlingException", service_message="Rate exceeded")
    monkeypatch.setattr(fap, "make_clients", lambda region: (pricing, ec2))

    status = fap.main(["--region", "us-east-1", "--types", "p3.8xlarge", "--out", str(tmp_path / "x.yaml")])

    assert status == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: pricing.get_products failed (ThrottlingException: Rate exceeded)")
    assert "\n" not in err


def test_no_types_and_no_file_is_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fap, "make_clients", lambda region: (object(), object()))
    assert fap.main(["--region", "us-east-1", "--out", str(tmp_path / "missing.yaml")]) == 1
    assert "--types: no instance types given" in capsys.readouterr().err


def test_missing_boto3_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # makes `import boto3` raise ImportError
    with pytest.raises(fap.PriceFetchError, match=r"pip install 'rubberband\[aws\]'"):
        fap.make_clients("us-east-1")


def test_existing_file_for_other_region_is_refused():
    with pytest.raises(fap.PriceFetchError, match="existing file is for 'us-east-1', not 'us-west-2'"):
        fap.build_region_file("us-west-2", {}, {}, existing=EXISTING)


# --- helpers -----------------------------------------------------------------------------------
def test_parse_price_item_attributes():
    item = fap.parse_price_item(price_item("p4d.24xlarge", 21.957642, vcpu="96", memory="1,152 GiB", gpu="8",
                                           gpu_memory="320 GB"))
    assert item["instance_type"] == "p4d.24xlarge"
    assert item["price_usd_per_hour"] == pytest.approx(21.957642)
    assert (item["vcpus"], item["memory_gb"], item["gpus"], item["gpu_memory_gb"]) == (96, 1152.0, 8, 320.0)
    assert fap.parse_price_item(price_item("m5.large", 0.096, vcpu="2", memory="8 GiB", gpu="NA"))["gpus"] is None


@pytest.mark.parametrize(("zone", "regional"), [
    ("us-east-1a", True), ("us-west-2d", True), ("us-east-1-atl-2a", False),
    ("us-west-2-lax-1b", False), ("us-east-1-wl1-bos-wlz-1", False), ("us-east-2a", False),
])
def test_is_regional_az(zone, regional):
    region = "us-west-2" if zone.startswith("us-west-2") else "us-east-1"
    assert fap.is_regional_az(zone, region) is regional


# --- the shipped region files ------------------------------------------------------------------
REQUIRED = {
    "us-east-1": [
        "p3.2xlarge", "p3.8xlarge", "p3.16xlarge", "p3dn.24xlarge",
        *(f"g4dn.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "metal")),
        *(f"g5.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")),
        *(f"g6.{s}" for s in ("xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge")),
        "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge",
    ],
}
REQUIRED_FAMILIES = {"p3", "p3dn", "g4dn", "g5", "g6", "p4d", "p5"}
PUBLISHED_ON_DEMAND_US_EAST_1 = {
    "p3.2xlarge": 3.06, "p3.8xlarge": 12.24, "p3.16xlarge": 24.48, "p3dn.24xlarge": 31.212,
    "g5.12xlarge": 5.672, "g4dn.12xlarge": 3.912,
}


@pytest.mark.parametrize("region", ["us-east-1", "us-west-2"])
def test_shipped_region_file(region):
    path = REPO / "cloud_profiles" / "aws" / f"{region}.yaml"
    catalog = CloudCatalog.load(path)
    assert (catalog.provider, catalog.region) == ("aws", region)
    dt.date.fromisoformat(catalog.prices_as_of)
    raw = yaml.safe_load(path.read_text())
    assert raw["source"] and raw["notes"]
    families = set()
    for name in catalog.instance_types:
        profile = catalog.get(name)
        families.add(catalog.types[name]["family"])
        assert name.split(".")[0] == catalog.types[name]["family"]
        assert profile.gpus_per_instance > 0, name
        assert profile.price_usd_per_hour > 0, name
        assert profile.spot_price_usd_per_hour is not None, name
        assert 0 < profile.spot_price_usd_per_hour < profile.price_usd_per_hour, name
        assert profile.gpu_model and profile.gpu_memory_gb and profile.vcpus and profile.memory_gb, name
    assert REQUIRED_FAMILIES <= families
    for name in REQUIRED.get(region, []):
        assert name in catalog.types, f"{name} missing from {path.name}"


def test_shipped_us_east_1_matches_published_on_demand_prices():
    catalog = CloudCatalog.load(REPO / "cloud_profiles" / "aws" / "us-east-1.yaml")
    for name, price in PUBLISHED_ON_DEMAND_US_EAST_1.items():
        assert catalog.get(name).price_usd_per_hour == price, name


def test_a_region_file_with_a_key_given_twice_is_refused(tmp_path):
    # Rewriting it would otherwise drop the first value silently.
    path = tmp_path / "us-east-1.yaml"
    path.write_text("provider: aws\nregion: us-east-1\nregion: us-west-2\n")
    with pytest.raises(fap.PriceFetchError, match=r"not valid YAML .*duplicate key `region` \(first given at line 2\)"):
        fap.load_region_file(path)
