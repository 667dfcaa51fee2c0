"""compile_plan: the advice of an infeasible deadline, and which instance types `auto` weighs."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import pytest

from rubberband import InfeasibleDeadlineError, ModelProfile
from rubberband import load_experiment as _load_experiment
from rubberband.plan import compile_plan

ROOT = Path(__file__).resolve().parents[3]
CIFAR = ROOT / "experiments" / "resnet101_cifar10.yaml"


@cache
def load_experiment(path: Path):
    return _load_experiment(path)


# --- infeasible deadlines ----------------------------------------------------------------------

def test_infeasible_under_confidence_names_the_deadline_that_meets_the_confidence():
    exp = load_experiment(CIFAR)
    args = dict(samples=200, seed=0, confidence=0.99)
    # The fastest plan's mean JCT (~451 s) is below 460 s, but its 99th percentile is not.
    with pytest.raises(InfeasibleDeadlineError, match=r"with probability 0\.99.*raise the deadline to at least \d+s") as info:
        compile_plan(exp.spec, exp.model, exp.cloud, 460.0, **args)
    err = info.value
    assert err.min_jct_s < 460.0 < err.needed_s
    needed = math.ceil(err.needed_s)
    assert f"at least {needed}s" in str(err)
    assert f"at least {err.min_jct_s:.0f}s" not in str(err)
    # The advice is exact for these samples: a second less is still infeasible.
    plan = compile_plan(exp.spec, exp.model, exp.cloud, float(needed), **args)
    assert plan.predicted.p_meet(needed) >= 0.99
    with pytest.raises(InfeasibleDeadlineError):
        compile_plan(exp.spec, exp.model, exp.cloud, math.floor(err.needed_s - 1e-9) - 0.5, **args)


def test_infeasible_mean_deadline_advice_is_rounded_up():
    exp = load_experiment(CIFAR)
    with pytest.raises(InfeasibleDeadlineError, match="shortest achievable JCT") as info:
        compile_plan(exp.spec, exp.model, exp.cloud, 300.0, samples=100)
    err = info.value
    assert err.needed_s == err.min_jct_s and err.confidence is None
    assert f"at least {math.ceil(err.min_jct_s)}s" in str(err)
