"""rubberband: cheapest elastic plan for a hyperparameter tuning job that must meet a deadline."""

from rubberband.errors import InfeasibleDeadlineError, ProviderError, RubberbandError, SpecError
from rubberband.profiles import (
    Billing,
    BillingModel,
    CloudCatalog,
    CloudProfile,
    DataCost,
    Market,
    ModelProfile,
)
from rubberband.config import Experiment, load_experiment
from rubberband.spec import ExperimentSpec, Stage

__version__ = "0.1.0"

__all__ = [
    "Billing", "BillingModel", "CloudCatalog", "CloudProfile", "DataCost", "ExperimentSpec",
    "InfeasibleDeadlineError", "Market", "ModelProfile", "ProviderError", "RubberbandError",
    "SpecError", "Stage", "__version__", "Experiment", "load_experiment",
]
