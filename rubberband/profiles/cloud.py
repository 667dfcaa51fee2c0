"""Cloud profile: one instance type's GPUs, price, billing rules, latencies and data cost.

Region files (``cloud_profiles/<provider>/<region>.yaml``) hold shared ``defaults`` and one
entry per instance type; ``CloudProfile.load`` picks one type out of such a file, and
``CloudCatalog`` lists them all (for ``instance_type="auto"``).

Spot prices differ by Availability Zone. A region file may keep them per AZ *ID*
(``spot_price_usd_per_hour_by_az: {use1-az1: 1.23}``): IDs name the same physical zone in
every AWS account, while zone *names* (``us-east-1a``) are shuffled per account. A region file
fetched with your own account also carries its ``zones:`` mapping from names to IDs
(``scripts/fetch_aws_prices.py`` writes it from ``ec2.describe_availability_zones``); only then
can a zone name (a trace zone, a subnet) be priced, and ``CloudCatalog.get`` hands the type's
per-zone prices to its ``CloudProfile`` as ``spot_price_usd_per_hour_by_zone``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rubberband.errors import SpecError
from rubberband.profiles.distributions import Constant, Distribution, Normal, parse_distribution
from rubberband.profiles.spot import SpotMarket, resolve_trace_file
from rubberband.schema import check_mapping, choice, did_you_mean, integer, load_yaml, number


class BillingModel(enum.Enum):
    """How compute is charged (paper §4.1)."""

    PER_INSTANCE = "per_instance"
    PER_FUNCTION = "per_function"


class Market(enum.Enum):
    """EC2 purchasing option."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"


@dataclass(frozen=True)
class Billing:
    """Billing rules: per-instance time rounded up to ``granularity_s``, at least ``minimum_s``."""

    model: BillingModel = BillingModel.PER_INSTANCE
    granularity_s: float = 1.0
    minimum_s: float = 60.0

    def __post_init__(self) -> None:
        number(self.granularity_s, "billing.granularity_s", positive=True)
        number(self.minimum_s, "billing.minimum_s", minimum=0)

    @classmethod
    def from_dict(cls, data: Any, where: str = "billing") -> Billing:
        data = check_mapping(data, where, required=["model"], optional=["granularity_s", "minimum_s"])
        model = BillingModel(choice(data["model"], f"{where}.model", [m.value for m in BillingModel]))
        return cls(
            model=model,
            granularity_s=number(data.get("granularity_s", 1.0), f"{where}.granularity_s", positive=True),
            minimum_s=number(data.get("minimum_s", 60.0), f"{where}.minimum_s", minimum=0),
        )

    def to_dict(self) -> dict[str, Any]:
        if self.model is BillingModel.PER_FUNCTION:
            return {"model": self.model.value}
        return {"model": self.model.value, "granularity_s": self.granularity_s, "minimum_s": self.minimum_s}


@dataclass(frozen=True)
class DataCost:
    """Dataset size and the price paid per GB each time an instance downloads it."""

    dataset_gb: float = 0.0
    price_usd_per_gb: float = 0.0

    def __post_init__(self) -> None:
        number(self.dataset_gb, "data.dataset_gb", minimum=0)
        number(self.price_usd_per_gb, "data.price_usd_per_gb", minimum=0)

    @property
    def usd_per_launch(self) -> float:
        return self.dataset_gb * self.price_usd_per_gb

    @classmethod
    def from_dict(cls, data: Any, where: str = "data") -> DataCost:
        data = check_mapping(data, where, optional=["dataset_gb", "price_usd_per_gb"])
        return cls(
            number(data.get("dataset_gb", 0.0), f"{where}.dataset_gb", minimum=0),
            number(data.get("price_usd_per_gb", 0.0), f"{where}.price_usd_per_gb", minimum=0),
        )

    def to_dict(self) -> dict[str, float]:
        return {"dataset_gb": self.dataset_gb, "price_usd_per_gb": self.price_usd_per_gb}


_TYPE_REQUIRED = ["gpus_per_instance", "price_usd_per_hour"]
_TYPE_OPTIONAL = [
    "spot_price_usd_per_hour", "gpu_model", "gpu_memory_gb", "vcpus", "memory_gb",
    "billing", "provision_latency_s", "init_latency_s", "data", "prices_as_of", "family", "spot",
    "spot_price_usd_per_hour_by_zone", "init_contention_s",
]
_CATALOG_TYPE_OPTIONAL = [*_TYPE_OPTIONAL, "spot_price_usd_per_hour_by_az"]
_SINGLE_OPTIONAL = ["provider", "region", "instance_type", "market", *_TYPE_OPTIONAL]
_DEFAULT_KEYS = ["billing", "provision_latency_s", "init_latency_s", "init_contention_s", "data", "spot"]
OVERRIDABLE = [*_DEFAULT_KEYS, "price_usd_per_hour", "spot_price_usd_per_hour", "spot_price_usd_per_hour_by_zone"]


def _price(value: Any, where: str) -> float:
    # A free instance is not a cloud anyone plans for, and the planner divides by the price.
    return number(value, where, positive=True)


def _prices_by(value: Any, where: str, key: str) -> dict[str, float]:
    """A ``{zone: price}`` mapping (``key`` says what names the zones, for the error)."""
    if not isinstance(value, dict) or not value:
        raise SpecError(f"{where}: expected a mapping of {key} to spot price, e.g. {{us-east-1a: 1.23}}")
    return {str(zone): _price(price, f"{where}.{zone}") for zone, price in value.items()}


# How each field an experiment may override is read (also when the profile itself gives it).
_PARSE: dict[str, Any] = {
    "price_usd_per_hour": _price,
    "spot_price_usd_per_hour": _price,
    "billing": lambda value, where: Billing.from_dict(value, where),
    "data": lambda value, where: DataCost.from_dict(value, where),
    "provision_latency_s": parse_distribution,
    "init_latency_s": parse_distribution,
    "init_contention_s": lambda value, where: number(value, where, minimum=0),
    "spot": lambda value, where: SpotMarket.from_dict(value, where),
    "spot_price_usd_per_hour_by_zone": lambda value, where: tuple(sorted(_prices_by(value, where, "zone names").items())),
}


@dataclass(frozen=True)
class CloudProfile:
    """One instance type of one region, as the simulator and planner see it (DESIGN §3)."""

    instance_type: str
    gpus_per_instance: int
    price_usd_per_hour: float
    provider: str = "aws"
    region: str = "us-east-1"
    spot_price_usd_per_hour: float | None = None
    market: Market = Market.ON_DEMAND
    billing: Billing = field(default_factory=Billing)
    provision_latency_s: Distribution = field(default_factory=lambda: Normal(30.0, 5.0))
    init_latency_s: Distribution = field(default_factory=lambda: Constant(60.0))
    # Optional (DESIGN §3): seconds each new instance's INIT grows per other instance launched
    # with it, where instances share one machine's CPUs (the local provider); 0 on a cloud.
    init_contention_s: float = 0.0
    data: DataCost = field(default_factory=DataCost)
    spot: SpotMarket = field(default_factory=SpotMarket)
    gpu_model: str | None = None
    gpu_memory_gb: float | None = None
    vcpus: int | None = None
    memory_gb: float | None = None
    prices_as_of: str | None = None
    spot_price_usd_per_hour_by_zone: tuple[tuple[str, float], ...] = ()   # (zone name, price), sorted

    def __post_init__(self) -> None:
        integer(self.gpus_per_instance, "gpus_per_instance")
        _price(self.price_usd_per_hour, "price_usd_per_hour")
        if self.spot_price_usd_per_hour is not None:
            _price(self.spot_price_usd_per_hour, "spot_price_usd_per_hour")
        if self.market is Market.SPOT and self.spot_price_usd_per_hour is None:
            raise SpecError(f"market: spot chosen but {self.instance_type} has no spot_price_usd_per_hour; add one or use on-demand")

    @property
    def G(self) -> int:  # noqa: N802 - the paper's symbol
        """GPUs per instance."""
        return self.gpus_per_instance

    @property
    def hourly_usd(self) -> float:
        """The hourly price of the chosen market."""
        return self.price(self.market)

    def price(self, market: Market | str) -> float:
        """The hourly price of one instance on ``market`` (whatever the profile's own market).

        Raises:
            SpecError: spot asked of a type with no spot price.
        """
        if Market(market) is Market.SPOT:
            if self.spot_price_usd_per_hour is None:
                raise SpecError(f"market: spot asked of {self.instance_type}, which has no spot_price_usd_per_hour; "
                                "add one or use on-demand")
            return float(self.spot_price_usd_per_hour)
        return float(self.price_usd_per_hour)

    @property
    def usd_per_second(self) -> float:
        return self.hourly_usd / 3600.0

    def zone_spot_price(self, zone: str) -> float | None:
        """The spot price in one zone (by name), where the profile knows it."""
        return dict(self.spot_price_usd_per_hour_by_zone).get(zone)

    def in_zone(self, zone: str, trace_file: str | None = None) -> CloudProfile:
        """This type's spot market in another zone of a trace file: the zone's availability
        trace replaces the preemption model (notice kept), and its spot price the type's
        where the profile knows it (see the module docstring)."""
        from rubberband.profiles.spot import load_trace

        trace_file = trace_file or self.spot.trace_file
        if trace_file is None:
            raise SpecError("zone: no trace file to replay the zone from; set cloud.overrides.spot.preemption.trace.file")
        nodes = self.spot.trace.nodes if self.spot.trace is not None else 1
        spot = SpotMarket(notice_s=self.spot.notice_s, trace=load_trace(trace_file, zone, nodes),
                          trace_file=str(trace_file), explicit=True)
        price = self.zone_spot_price(zone)
        return self.replace(spot=spot, **({"spot_price_usd_per_hour": price} if price is not None else {}))

    def replace(self, **changes: Any) -> CloudProfile:
        """A copy with some fields changed (what-if analysis)."""
        return replace(self, **changes)

    # --- I/O ------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "cloud_profile") -> CloudProfile:
        """Build from the single-instance-type shape of DESIGN §3."""
        data = check_mapping(data, where, required=_TYPE_REQUIRED, optional=_SINGLE_OPTIONAL)
        kwargs: dict[str, Any] = {
            "instance_type": str(data.get("instance_type", "custom")),
            "gpus_per_instance": integer(data["gpus_per_instance"], f"{where}.gpus_per_instance"),
            "provider": str(data.get("provider", "aws")),
            "region": str(data.get("region", "us-east-1")),
        }
        for key, parse in _PARSE.items():
            # A null spot price means the type has no spot market; any other null is an error.
            if key in data and not (key == "spot_price_usd_per_hour" and data[key] is None):
                kwargs[key] = parse(data[key], f"{where}.{key}")
        if "market" in data:
            kwargs["market"] = Market(choice(data["market"], f"{where}.market", [m.value for m in Market]))
        for key in ("gpu_model", "prices_as_of"):
            if data.get(key) is not None:
                kwargs[key] = str(data[key])
        for key in ("gpu_memory_gb", "memory_gb"):
            if data.get(key) is not None:
                kwargs[key] = number(data[key], f"{where}.{key}", minimum=0)
        if data.get("vcpus") is not None:
            kwargs["vcpus"] = integer(data["vcpus"], f"{where}.vcpus")
        return cls(**kwargs)

    @classmethod
    def load(cls, path: str | Path, instance_type: str, market: str | Market = Market.ON_DEMAND) -> CloudProfile:
        """Load one instance type from a region file (``cloud_profiles/aws/us-east-1.yaml``)."""
        return CloudCatalog.load(path).get(instance_type, market=market)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "provider": self.provider,
            "region": self.region,
            "instance_type": self.instance_type,
            "gpus_per_instance": self.gpus_per_instance,
            "price_usd_per_hour": self.price_usd_per_hour,
        }
        if self.spot_price_usd_per_hour is not None:
            out["spot_price_usd_per_hour"] = self.spot_price_usd_per_hour
        out["market"] = self.market.value
        out["billing"] = self.billing.to_dict()
        out["provision_latency_s"] = self.provision_latency_s.to_dict()
        out["init_latency_s"] = self.init_latency_s.to_dict()
        if self.init_contention_s:
            out["init_contention_s"] = self.init_contention_s
        out["data"] = self.data.to_dict()
        if self.spot != SpotMarket():
            out["spot"] = self.spot.to_dict()
        for key in ("gpu_model", "gpu_memory_gb", "vcpus", "memory_gb", "prices_as_of"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.spot_price_usd_per_hour_by_zone:
            out["spot_price_usd_per_hour_by_zone"] = dict(self.spot_price_usd_per_hour_by_zone)
        return out


@dataclass(frozen=True)
class CloudCatalog:
    """Every instance type of one region file."""

    provider: str
    region: str
    types: dict[str, dict[str, Any]]
    defaults: dict[str, Any]
    prices_as_of: str | None = None
    path: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    zones: dict[str, str] = field(default_factory=dict)    # zone name -> AZ ID, for the account that fetched it

    def with_overrides(self, overrides: dict[str, Any]) -> CloudCatalog:
        """A catalog whose every type gets ``overrides`` (an experiment's latencies, data size)."""
        return replace(self, overrides={**self.overrides, **overrides})

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "cloud_profile") -> CloudCatalog:
        data = check_mapping(
            data, where, required=["provider", "region", "instance_types"],
            optional=["defaults", "prices_as_of", "source", "notes", "zones"],
        )
        defaults = check_mapping(data.get("defaults") or {}, f"{where}.defaults", optional=_DEFAULT_KEYS)
        types = data["instance_types"]
        if not isinstance(types, dict) or not types:
            raise SpecError(f"{where}.instance_types: expected a mapping of instance type name to its entry")
        for name, entry in types.items():
            check_mapping(entry, f"{where}.instance_types.{name}", required=_TYPE_REQUIRED, optional=_CATALOG_TYPE_OPTIONAL)
        zones = data.get("zones") or {}
        if not isinstance(zones, dict) or not all(isinstance(v, str) and v for v in zones.values()):
            raise SpecError(f"{where}.zones: expected a mapping of zone name to AZ ID, e.g. {{us-east-1a: use1-az4}} "
                            "(scripts/fetch_aws_prices.py writes your account's)")
        catalog = cls(str(data["provider"]), str(data["region"]), dict(types), defaults,
                      str(data["prices_as_of"]) if data.get("prices_as_of") else None, where,
                      zones={str(k): str(v) for k, v in zones.items()})
        for name in types:  # validate every entry up front, so a bad file fails at load
            catalog.get(name)
        return catalog

    @classmethod
    def load(cls, path: str | Path) -> CloudCatalog:
        return cls.from_dict(load_yaml(path, "cloud_profile"), where=str(path))

    @property
    def instance_types(self) -> list[str]:
        return list(self.types)

    def get(
        self, instance_type: str, market: str | Market = Market.ON_DEMAND, overrides: dict[str, Any] | None = None
    ) -> CloudProfile:
        """The ``CloudProfile`` of one instance type; unknown names get a did-you-mean hint.

        ``overrides`` replaces fields of the entry (an experiment's dataset size, a measured
        initialisation latency, another billing model); ``billing`` and ``data`` are merged
        key by key. Errors in an override name ``cloud.overrides.<key>``, not the region file.
        """
        if instance_type not in self.types:
            raise SpecError(
                f"instance_type: {instance_type!r} is not in {self.path or self.region}"
                f"{did_you_mean(instance_type, self.types)}; known types: {', '.join(self.types)}"
            )
        if isinstance(market, str):
            market = Market(choice(market, "market", [m.value for m in Market]))
        entry = {**self.defaults, **self.types[instance_type]}
        entry.update(provider=self.provider, region=self.region, instance_type=instance_type)
        by_az = entry.pop("spot_price_usd_per_hour_by_az", None)
        if by_az is not None:
            by_az = _prices_by(by_az, f"{self.path}.instance_types.{instance_type}.spot_price_usd_per_hour_by_az", "AZ IDs")
            named = {name: by_az[az] for name, az in self.zones.items() if az in by_az}
            if named:
                entry["spot_price_usd_per_hour_by_zone"] = {**named, **(entry.get("spot_price_usd_per_hour_by_zone") or {})}
        entry.setdefault("prices_as_of", self.prices_as_of)
        if entry["prices_as_of"] is None:
            entry.pop("prices_as_of")
        if self.path and Path(self.path).is_file():   # a trace file named in a region file sits beside it
            entry["spot"] = resolve_trace_file(entry.get("spot"), Path(self.path).parent)
            if entry["spot"] is None:
                entry.pop("spot")
        profile = CloudProfile.from_dict(entry, where=f"{self.path}.instance_types.{instance_type}")
        changes: dict[str, Any] = {}
        for key, value in {**self.overrides, **(overrides or {})}.items():
            where = f"cloud.overrides.{key}"
            if key not in OVERRIDABLE:
                raise SpecError(f"{where}: unknown key{did_you_mean(key, OVERRIDABLE)}; allowed keys: {', '.join(OVERRIDABLE)}")
            if key in ("billing", "data", "spot") and isinstance(value, dict):
                value = {**getattr(profile, key).to_dict(), **value}
            changes[key] = _PARSE[key](value, where)
        profile = profile.replace(**changes)
        # A trace zone whose price is known prices the market, unless the experiment set the price.
        if profile.spot.trace is not None and "spot_price_usd_per_hour" not in changes:
            price = profile.zone_spot_price(profile.spot.trace.zone)
            if price is not None:
                profile = profile.replace(spot_price_usd_per_hour=price)
        # The market last: an override may be what gives the type its spot price.
        return profile.replace(market=market)
