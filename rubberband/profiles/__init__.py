"""Model and cloud profiles and the latency distributions they are made of."""

from rubberband.profiles.cloud import (
    Billing,
    BillingModel,
    CloudCatalog,
    CloudProfile,
    DataCost,
    Market,
)
from rubberband.profiles.distributions import (
    Constant,
    Distribution,
    Empirical,
    LogNormal,
    Normal,
    parse_distribution,
)
from rubberband.profiles.model import ModelProfile

__all__ = [
    "Billing", "BillingModel", "CloudCatalog", "CloudProfile", "Constant", "DataCost", "Distribution",
    "Empirical", "LogNormal", "Market", "ModelProfile", "Normal", "parse_distribution",
]
