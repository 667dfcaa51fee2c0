"""Regenerate a ``cloud_profiles/aws/<region>.yaml`` region file from the AWS Pricing API and EC2 spot prices.

On-demand prices and instance attributes come from ``pricing.get_products`` (Linux, shared
tenancy, no pre-installed software, capacity status ``Used``); spot prices come from
``ec2.describe_spot_price_history`` (``Linux/UNIX``, the price in force now, the cheapest over the
region's Availability Zones). The existing file's ``defaults`` and the per-type fields the APIs do
not give (``family``, ``gpu_model``, ``gpu_memory_gb``, per-type overrides) are kept.

Usage::

    python scripts/fetch_aws_prices.py --region us-east-1 --types p3.8xlarge,g5.12xlarge --dry-run
    python scripts/fetch_aws_prices.py --region us-west-2          # refresh every type in the file

The spot price of each type in each AZ is kept too, by AZ ID, with this account's mapping of
zone names to AZ IDs (``zones:``, from ``ec2.describe_availability_zones``), so a zone name can be
priced (``CloudCatalog``, and the planner's zone choice).

Needs AWS credentials that may call ``pricing:GetProducts``, ``ec2:DescribeSpotPriceHistory``,
``ec2:DescribeAvailabilityZones``
and ``boto3`` (``pip install 'rubberband[aws]'``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from rubberband.schema import UniqueKeyLoader

REPO_ROOT = Path(__file__).resolve().parent.parent
PRICING_ENDPOINT_REGION = "us-east-1"  # the Pricing API is served from a few regions only
INSTALL_HINT = "pip install 'rubberband[aws]'"

# Defaults for a region file that does not exist yet (DESIGN.md §3).
DEFAULT_DEFAULTS: dict[str, Any] = {
    "billing": {"model": "per_instance", "granularity_s": 1, "minimum_s": 60},
    "provision_latency_s": {"dist": "normal", "mean": 30, "std": 8},
    "init_latency_s": {"dist": "normal", "mean": 90, "std": 15},
    "data": {"dataset_gb": 0.0, "price_usd_per_gb": 0.0},
}

# GPU model and per-GPU memory (GB) by family, for types the existing file does not list yet.
KNOWN_GPUS: dict[str, tuple[str, float]] = {
    "p3": ("V100", 16), "p3dn": ("V100", 32), "g4dn": ("T4", 16), "g5": ("A10G", 24),
    "g6": ("L4", 24), "g6e": ("L40S", 48), "p4d": ("A100", 40), "p4de": ("A100", 80),
    "p5": ("H100", 80), "p5e": ("H200", 141), "p5en": ("H200", 141),
}

SOURCE = (
    "AWS Pricing API get_products (AmazonEC2, Linux, Shared tenancy, no pre-installed software, "
    "capacitystatus Used); spot: ec2 describe_spot_price_history (Linux/UNIX) snapshot"
)

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


class PriceFetchError(RuntimeError):
    """A price could not be fetched or understood; the message is one line naming the cause and fix."""


# --- AWS plumbing ------------------------------------------------------------------------------
def _aws_errors() -> tuple[type[BaseException], ...]:
    """botocore's exception base classes, or ``()`` when botocore is not installed."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - botocore ships with boto3
        return ()
    return (BotoCoreError, ClientError)


def _describe_aws_error(call: str, exc: BaseException) -> PriceFetchError:
    """Turn a botocore error into a one-line ``PriceFetchError``."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping) and "Error" in response:
        code = response["Error"].get("Code", "Error")
        message = " ".join(str(response["Error"].get("Message", "")).split())
        detail = f"{code}: {message}" if message else code
    else:
        detail = " ".join(str(exc).split()) or type(exc).__name__
    return PriceFetchError(
        f"{call} failed ({detail}); check AWS credentials (aws configure / AWS_PROFILE), "
        "that they allow pricing:GetProducts, ec2:DescribeSpotPriceHistory and ec2:DescribeAvailabilityZones, "
        "and the region name"
    )


def make_clients(region: str) -> tuple[Any, Any]:
    """Create the ``(pricing, ec2)`` boto3 clients; the Pricing API is always called in us-east-1."""
    try:
        import boto3
    except ImportError:
        raise PriceFetchError(f"boto3 is not installed; install it with: {INSTALL_HINT}") from None
    return (
        boto3.client("pricing", region_name=PRICING_ENDPOINT_REGION),
        boto3.client("ec2", region_name=region),
    )


# --- On-demand prices (Pricing API) ------------------------------------------------------------
def pricing_filters(region: str, instance_type: str) -> list[dict[str, str]]:
    """The ``get_products`` filters that select one Linux on-demand instance type in ``region``."""
    fields = {
        "regionCode": region,
        "instanceType": instance_type,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in fields.items()]


def _first_number(text: Any) -> float | None:
    """The first number in an attribute such as ``"244 GiB"`` or ``"1,152 GiB"``; None for ``"NA"``."""
    if text is None:
        return None
    match = _NUMBER.search(str(text).replace(",", ""))
    return float(match.group()) if match else None


def parse_price_item(item: str | Mapping[str, Any]) -> dict[str, Any]:
    """Parse one ``PriceList`` entry into instance type, hourly USD price and attributes.

    Returns ``{"instance_type", "price_usd_per_hour", "vcpus", "memory_gb", "gpus", "gpu_memory_gb",
    "operation", "marketoption"}``; a missing or ``NA`` attribute gives ``None``.
    """
    try:
        data = json.loads(item) if isinstance(item, str) else dict(item)
        attributes = data["product"]["attributes"]
        instance_type = attributes["instanceType"]
    except (ValueError, KeyError, TypeError) as exc:
        raise PriceFetchError(f"PriceList entry is not an EC2 product ({exc!r}); the Pricing API format may have changed") from None
    prices = []
    for offer in (data.get("terms", {}).get("OnDemand") or {}).values():
        for dimension in (offer.get("priceDimensions") or {}).values():
            usd = dimension.get("pricePerUnit", {}).get("USD")
            if usd is not None and float(usd) > 0:
                prices.append(float(usd))
    gpus = _first_number(attributes.get("gpu"))
    return {
        "instance_type": instance_type,
        "price_usd_per_hour": min(prices) if prices else None,
        "vcpus": int(v) if (v := _first_number(attributes.get("vcpu"))) is not None else None,
        "memory_gb": _first_number(attributes.get("memory")),
        "gpus": int(gpus) if gpus is not None else None,
        "gpu_memory_gb": _first_number(attributes.get("gpuMemory")),  # instance total, where present
        "operation": attributes.get("operation"),
        "marketoption": attributes.get("marketoption"),
    }


def _choose_product(instance_type: str, region: str, products: list[dict[str, Any]]) -> dict[str, Any]:
    """Pick the plain on-demand Linux product (operation RunInstances) among the returned ones."""
    priced = [p for p in products if p["instance_type"] == instance_type and p["price_usd_per_hour"] is not None]
    plain = [p for p in priced if p["operation"] in (None, "RunInstances") and p["marketoption"] in (None, "OnDemand")]
    candidates = plain or priced
    if not candidates:
        raise PriceFetchError(
            f"instance type {instance_type!r} was not returned by the AWS Pricing API for {region}; "
            "check the name (e.g. p3.8xlarge) and that it is offered in that region"
        )
    distinct = sorted({p["price_usd_per_hour"] for p in candidates})
    if len(distinct) > 1:
        raise PriceFetchError(
            f"{instance_type}: the Pricing API returned several Linux on-demand prices in {region} "
            f"({', '.join(f'{x:g}' for x in distinct)}); narrow the filters in pricing_filters()"
        )
    return candidates[0]


def fetch_on_demand(pricing_client: Any, region: str, instance_types: Iterable[str]) -> dict[str, dict[str, Any]]:
    """On-demand price and attributes of each instance type in ``region``, via ``get_products``.

    Follows ``NextToken`` pages; raises ``PriceFetchError`` naming a type the API does not return.
    """
    errors = _aws_errors()
    result: dict[str, dict[str, Any]] = {}
    for instance_type in instance_types:
        products: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "ServiceCode": "AmazonEC2",
            "Filters": pricing_filters(region, instance_type),
            "FormatVersion": "aws_v1",
            "MaxResults": 100,
        }
        while True:
            try:
                page = pricing_client.get_products(**kwargs)
            except errors as exc:
                raise _describe_aws_error("pricing.get_products", exc) from None
            products.extend(parse_price_item(item) for item in page.get("PriceList", []))
            token = page.get("NextToken")
            if not token:
                break
            kwargs["NextToken"] = token
        result[instance_type] = _choose_product(instance_type, region, products)
    return result


# --- Spot prices (EC2) -------------------------------------------------------------------------
def is_regional_az(zone: str, region: str) -> bool:
    """True for a region's own Availability Zones (``us-east-1a``), False for Local/Wavelength Zones."""
    return re.fullmatch(re.escape(region) + r"[a-z]", zone) is not None


def fetch_spot_by_zone(
    ec2_client: Any,
    region: str,
    instance_types: Sequence[str],
    now: dt.datetime | None = None,
    include_local_zones: bool = False,
) -> dict[str, dict[str, float]]:
    """The current ``Linux/UNIX`` spot price of each instance type in each of the region's AZs
    (by zone name): ``{type: {zone: price}}``.

    Uses the latest record per (type, AZ) from ``describe_spot_price_history`` with ``StartTime=now``
    and follows ``NextToken`` pages. Types without any spot offer are absent from the result.
    """
    errors = _aws_errors()
    now = now or dt.datetime.now(dt.UTC)
    latest: dict[tuple[str, str], tuple[Any, float]] = {}
    kwargs: dict[str, Any] = {
        "InstanceTypes": list(instance_types),
        "ProductDescriptions": ["Linux/UNIX"],
        "StartTime": now,
    }
    while True:
        try:
            page = ec2_client.describe_spot_price_history(**kwargs)
        except errors as exc:
            raise _describe_aws_error("ec2.describe_spot_price_history", exc) from None
        for record in page.get("SpotPriceHistory", []):
            zone = record.get("AvailabilityZone", "")
            if not include_local_zones and not is_regional_az(zone, region):
                continue
            key = (record["InstanceType"], zone)
            stamp = record.get("Timestamp") or now
            if key not in latest or stamp >= latest[key][0]:
                latest[key] = (stamp, float(record["SpotPrice"]))
        token = page.get("NextToken")
        if not token:
            break
        kwargs["NextToken"] = token
    by_zone: dict[str, dict[str, float]] = {}
    for (instance_type, zone), (_stamp, price) in sorted(latest.items()):
        if price > 0:
            by_zone.setdefault(instance_type, {})[zone] = price
    return by_zone


def fetch_spot(ec2_client: Any, region: str, instance_types: Sequence[str], now: dt.datetime | None = None,
               include_local_zones: bool = False) -> dict[str, float]:
    """The cheapest current spot price of each instance type over the region's AZs."""
    by_zone = fetch_spot_by_zone(ec2_client, region, instance_types, now=now, include_local_zones=include_local_zones)
    return {name: min(prices.values()) for name, prices in by_zone.items()}


def fetch_zone_ids(ec2_client: Any, region: str) -> dict[str, str]:
    """This account's mapping of the region's Availability Zone names to AZ IDs
    (``us-east-1a`` -> ``use1-az4``): names are shuffled per account, IDs are not."""
    try:
        zones = ec2_client.describe_availability_zones(
            Filters=[{"Name": "zone-type", "Values": ["availability-zone"]}])["AvailabilityZones"]
    except _aws_errors() as exc:
        raise _describe_aws_error("ec2.describe_availability_zones", exc) from None
    return {z["ZoneName"]: z["ZoneId"] for z in sorted(zones, key=lambda z: z["ZoneName"])
            if is_regional_az(z["ZoneName"], region) and z.get("ZoneId")}


# --- Region file -------------------------------------------------------------------------------
def load_region_file(path: str | Path) -> dict[str, Any] | None:
    """The existing region file as a mapping, or None when it does not exist."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = yaml.load(path.read_text(), Loader=UniqueKeyLoader)  # noqa: S506 - a safe loader that refuses duplicate keys
    except yaml.YAMLError as exc:
        raise PriceFetchError(f"{path}: not valid YAML ({' '.join(str(exc).split())}); fix or delete the file") from None
    if not isinstance(data, dict):
        raise PriceFetchError(f"{path}: expected a region file mapping (provider, region, instance_types); fix or delete it")
    return data


def _round(value: float) -> float | int:
    """Drop float noise (``12.240000000`` -> ``12.24``) and write whole numbers as ints."""
    value = round(float(value), 6)
    return int(value) if value.is_integer() else value


def build_entry(
    instance_type: str, on_demand: Mapping[str, Any], spot: float | None, old: Mapping[str, Any] | None,
    spot_by_az: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """One ``instance_types`` entry: API figures over the old entry, keeping fields the APIs lack."""
    old = dict(old or {})
    family = old.get("family") or instance_type.split(".")[0]
    known_model, known_memory = KNOWN_GPUS.get(family, (None, None))
    gpus = on_demand.get("gpus") or old.get("gpus_per_instance")
    if not gpus:
        raise PriceFetchError(
            f"{instance_type}: the Pricing API reports no GPUs and the region file has no gpus_per_instance; "
            "region files list GPU instance types only, so drop it from --types"
        )
    gpu_memory = old.get("gpu_memory_gb", known_memory)
    if gpu_memory is None and on_demand.get("gpu_memory_gb"):
        gpu_memory = on_demand["gpu_memory_gb"] / gpus  # taken as the instance total
    entry: dict[str, Any] = {
        "family": family,
        "gpus_per_instance": int(gpus),
        "gpu_model": old.get("gpu_model") or known_model,
        "gpu_memory_gb": _round(gpu_memory) if gpu_memory is not None else None,
        "vcpus": on_demand.get("vcpus") or old.get("vcpus"),
        "memory_gb": _round(m) if (m := on_demand.get("memory_gb") or old.get("memory_gb")) is not None else None,
        "price_usd_per_hour": _round(on_demand["price_usd_per_hour"]),
        "spot_price_usd_per_hour": _round(spot) if spot is not None else None,
        "spot_price_usd_per_hour_by_az": {az: _round(p) for az, p in sorted(spot_by_az.items())} if spot_by_az else None,
    }
    entry = {k: v for k, v in entry.items() if v is not None}
    for key, value in old.items():  # per-type overrides (billing, latencies, data, ...) survive
        if key not in entry and key not in ("spot_price_usd_per_hour", "spot_price_usd_per_hour_by_az", "prices_as_of"):
            entry[key] = value
    return entry


def build_region_file(
    region: str,
    on_demand: Mapping[str, Mapping[str, Any]],
    spot: Mapping[str, float],
    existing: Mapping[str, Any] | None = None,
    today: dt.date | None = None,
    spot_by_zone: Mapping[str, Mapping[str, float]] | None = None,
    zones: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The region-file mapping (``CloudCatalog.from_dict`` shape) for ``on_demand``'s types, in order.

    ``spot_by_zone`` (``{type: {zone name: price}}``) is written per AZ ID through ``zones``
    (this account's zone name -> AZ ID), which the file keeps too (``zones:``).
    """
    existing = dict(existing or {})
    if existing.get("region") not in (None, region):
        raise PriceFetchError(
            f"region: the existing file is for {existing['region']!r}, not {region!r}; pass --out for a {region} file"
        )
    old_types = existing.get("instance_types") or {}
    today = today or dt.date.today()
    return {
        "provider": "aws",
        "region": region,
        "prices_as_of": today.isoformat(),
        "source": SOURCE,
        "notes": (
            f"Generated by scripts/fetch_aws_prices.py on {today.isoformat()}. spot_price_usd_per_hour is "
            "the cheapest current Linux/UNIX spot price over the region's Availability Zones (Local Zones "
            "excluded); it varies by AZ and by hour. spot_price_usd_per_hour_by_az is each AZ's, by AZ ID; "
            "zones maps this account's zone names to AZ IDs."
        ),
        **({"zones": dict(zones)} if zones else {}),
        "defaults": existing.get("defaults") or DEFAULT_DEFAULTS,
        "instance_types": {
            name: build_entry(name, on_demand[name], spot.get(name), old_types.get(name),
                              _by_az((spot_by_zone or {}).get(name), zones or {})) for name in on_demand
        },
    }


def _by_az(prices: Mapping[str, float] | None, zones: Mapping[str, str]) -> dict[str, float]:
    """Per-zone-name prices keyed by AZ ID instead (zones without an ID are left out)."""
    return {zones[zone]: price for zone, price in (prices or {}).items() if zone in zones}


def fetch_region(
    region: str,
    instance_types: Sequence[str],
    *,
    pricing_client: Any,
    ec2_client: Any,
    existing: Mapping[str, Any] | None = None,
    today: dt.date | None = None,
    now: dt.datetime | None = None,
    include_local_zones: bool = False,
) -> dict[str, Any]:
    """Fetch on-demand and spot prices for ``instance_types`` and return the region-file mapping.

    The clients are passed in (boto3 clients, or stubbed ones in tests); ``existing`` is the current
    region file, whose ``defaults`` and per-type hardware fields are kept.
    """
    if not instance_types:
        raise PriceFetchError("--types: no instance types given; pass --types p3.8xlarge,... or point --out at an existing region file")
    on_demand = fetch_on_demand(pricing_client, region, instance_types)
    spot_by_zone = fetch_spot_by_zone(ec2_client, region, instance_types, now=now, include_local_zones=include_local_zones)
    spot = {name: min(prices.values()) for name, prices in spot_by_zone.items()}
    zones = fetch_zone_ids(ec2_client, region)
    return build_region_file(region, on_demand, spot, existing=existing, today=today, spot_by_zone=spot_by_zone,
                             zones=zones)


def validate(data: Mapping[str, Any], where: str) -> None:
    """Check the mapping loads with ``rubberband.profiles.CloudCatalog`` (one-line error otherwise)."""
    try:
        from rubberband.profiles import CloudCatalog
    except ImportError:
        raise PriceFetchError("rubberband is not importable; run from the project's environment (pip install -e .)") from None
    CloudCatalog.from_dict(dict(data), where=where)


def dump_region_file(data: Mapping[str, Any]) -> str:
    """YAML text of a region file: top-level keys in order, one flow-style line per instance type."""
    header = (
        f"# AWS {data['region']} GPU instance types for rubberband (DESIGN.md §3).\n"
        f"# Regenerate with: python scripts/fetch_aws_prices.py --region {data['region']}\n"
    )
    return header + yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=None, width=1000)


def write_region_file(data: Mapping[str, Any], path: str | Path) -> Path:
    """Validate ``data`` and write it to ``path`` (parent folders are created)."""
    path = Path(path)
    validate(data, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_region_file(data))
    return path


# --- CLI ---------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--region", required=True, help="AWS region, e.g. us-east-1")
    parser.add_argument("--types", default="", help="comma-separated instance types (default: those in --out)")
    parser.add_argument("--out", help="region file to update (default: cloud_profiles/aws/<region>.yaml)")
    parser.add_argument("--dry-run", action="store_true", help="print the YAML instead of writing it")
    parser.add_argument("--include-local-zones", action="store_true", help="also take spot prices from Local Zones")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the exit status (0 ok, 1 on a fetch or validation error)."""
    args = parse_args(argv)
    out = Path(args.out) if args.out else REPO_ROOT / "cloud_profiles" / "aws" / f"{args.region}.yaml"
    try:
        existing = load_region_file(out)
        types = [t.strip() for t in args.types.split(",") if t.strip()]
        if not types and existing:
            types = list(existing.get("instance_types") or {})
        pricing_client, ec2_client = make_clients(args.region)
        data = fetch_region(
            args.region, types, pricing_client=pricing_client, ec2_client=ec2_client,
            existing=existing, include_local_zones=args.include_local_zones,
        )
        missing_spot = [name for name, entry in data["instance_types"].items() if "spot_price_usd_per_hour" not in entry]
        if missing_spot:
            print(f"warning: no spot price in {args.region} for {', '.join(missing_spot)}", file=sys.stderr)
        if args.dry_run:
            validate(data, str(out))
            sys.stdout.write(dump_region_file(data))
        else:
            write_region_file(data, out)
            print(f"wrote {out} ({len(data['instance_types'])} instance types, prices as of {data['prices_as_of']})")
    except (PriceFetchError, ValueError) as exc:  # rubberband's SpecError is a ValueError
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
