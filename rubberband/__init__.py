"""rubberband: cheapest elastic plan for a hyperparameter tuning job that must meet a deadline.

Names are imported on first use, so ``import rubberband`` stays cheap for the CLI and for
the executor's worker processes (which only need the trainer and the worker code).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Experiment": "rubberband.config", "load_experiment": "rubberband.config",
    "InfeasibleDeadlineError": "rubberband.errors", "ProviderError": "rubberband.errors",
    "RubberbandError": "rubberband.errors", "SpecError": "rubberband.errors",
    "Plan": "rubberband.plan", "compile_plan": "rubberband.plan", "simulate_plan": "rubberband.plan", "whatif": "rubberband.plan",
    "plan_zones": "rubberband.plan", "plan_for_budget": "rubberband.plan",
    "Billing": "rubberband.profiles", "BillingModel": "rubberband.profiles", "CloudCatalog": "rubberband.profiles",
    "CloudProfile": "rubberband.profiles", "DataCost": "rubberband.profiles", "Market": "rubberband.profiles",
    "ModelProfile": "rubberband.profiles",
    "SimResult": "rubberband.simulator", "build_dag": "rubberband.simulator", "simulate": "rubberband.simulator",
    "ExperimentSpec": "rubberband.spec", "Stage": "rubberband.spec", "EagerTransfer": "rubberband.spec",
    "Placement": "rubberband.placement", "place": "rubberband.placement",
    "Trainer": "rubberband.executor", "execute": "rubberband.executor", "profile": "rubberband.profiler",
    # Function trainables, in Ray Tune's signatures (rubberband/function_api.py)
    "report": "rubberband.function_api", "get_checkpoint": "rubberband.function_api",
    "get_context": "rubberband.function_api", "Checkpoint": "rubberband.function_api",
    "prepare_model": "rubberband.function_api", "prepare_data_loader": "rubberband.function_api",
    "get_device": "rubberband.function_api",
    # Search spaces with Ray Tune's names, and the Python entry in Ray Tune's habits (rubberband/tuner.py)
    **dict.fromkeys(["uniform", "quniform", "loguniform", "qloguniform", "randint", "qrandint", "lograndint", "randn",
                     "choice", "grid_search"], "rubberband.executor.search_space"),
    **dict.fromkeys(["Tuner", "TuneConfig", "Cloud", "Result", "ResultGrid"], "rubberband.tuner"),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rubberband' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
