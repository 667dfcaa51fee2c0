"""rubberband: cheapest elastic plan for a hyperparameter tuning job that must meet a deadline."""

from rubberband.config import Experiment, load_experiment
from rubberband.errors import InfeasibleDeadlineError, ProviderError, RubberbandError, SpecError
from rubberband.plan import Plan, compile_plan, whatif
from rubberband.profiles import (
    Billing,
    BillingModel,
    CloudCatalog,
    CloudProfile,
    DataCost,
    Market,
    ModelProfile,
)
from rubberband.simulate import SimResult, build_dag, simulate
from rubberband.spec import ExperimentSpec, Stage

__version__ = "0.1.0"

__all__ = [
    "Billing", "BillingModel", "CloudCatalog", "CloudProfile", "DataCost", "Experiment", "ExperimentSpec",
    "InfeasibleDeadlineError", "Market", "ModelProfile", "Plan", "ProviderError", "RubberbandError",
    "SimResult", "SpecError", "Stage", "__version__", "build_dag", "compile_plan", "load_experiment",
    "simulate", "whatif",
]
