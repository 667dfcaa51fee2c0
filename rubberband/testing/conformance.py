"""Rehearsals against the simulator: the cases issue 21 asks to agree, and how far apart they are.

Each case is the README's ResNet-101 job (``experiments/resnet101_cifar10.yaml``, SHA(32, 1,
50, 3), 20-minute deadline) on one plan — on-demand, packed, spot at 2 and 5 reclaims per
instance-hour with notices of 0, 120 and 600 s, a zone's trace, mixed markets and an instance
type per stage — rehearsed on the ``sim`` backend (``rubberband.executor.rehearse``, the
scheduler's decisions applied by the driver, re-planning and the safety net off) over
``seeds`` seeds, and simulated by ``rubberband.simulate`` over ``samples`` samples. A zone's
trace makes JCT heavy-tailed (a job that meets a capacity gap waits hours), so its mean is
only known to a few per cent at hundreds of seeds: ``Agreement.jct_se`` says how well. The test
(``tests/unit/executor/test_conformance.py``) asserts the agreement; ``benchmarks/
bench_rehearse.py`` prints it as a table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from rubberband.plan.plan import Plan
from rubberband.profiles.cloud import Market
from rubberband.profiles.model import ModelProfile

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENT = ROOT / "experiments" / "resnet101_cifar10.yaml"
TRACES = ROOT / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json"


@dataclass(frozen=True)
class Agreement:
    """One case: the rehearsals' and the simulation's mean JCT, mean cost and P(meet the deadline)."""

    case: str
    seeds: int
    jct_s: tuple[float, float]           # (rehearsed, simulated) means
    cost_usd: tuple[float, float]
    p_meet: tuple[float, float]
    jct_se: float = 0.0                  # the rehearsals' mean JCT's standard error, relative to the simulated mean

    @property
    def jct_delta(self) -> float:
        """Rehearsed over simulated mean JCT, minus 1."""
        return self.jct_s[0] / self.jct_s[1] - 1.0

    @property
    def cost_delta(self) -> float:
        return self.cost_usd[0] / self.cost_usd[1] - 1.0

    @property
    def p_meet_points(self) -> float:
        """Rehearsed minus simulated P(meet), in percentage points."""
        return 100.0 * (self.p_meet[0] - self.p_meet[1])

    def row(self) -> str:
        return (f"{self.case:<30} {self.jct_delta:+7.2%} {self.cost_delta:+7.2%} {self.p_meet_points:+7.1f} "
                f"{self.jct_se:7.2%}"
                f"   ({self.jct_s[0]:.0f} s vs {self.jct_s[1]:.0f} s, ${self.cost_usd[0]:.3f} vs ${self.cost_usd[1]:.3f}, "
                f"{self.p_meet[0]:.1%} vs {self.p_meet[1]:.1%})")


HEADER = f"{'case':<30} {'Δ JCT':>7} {'Δ cost':>7} {'Δ P pts':>7} {'JCT s.e.':>7}   (rehearsed vs simulated)"


def _experiment():
    from rubberband import load_experiment

    return load_experiment(EXPERIMENT)


def _spot(exp, rate: float, notice: float, itype: str = "p3.8xlarge"):
    return exp.catalog.get(itype, Market.SPOT, {**exp.cloud_overrides,
                                                "spot": {"notice_s": notice, "preemption": {"rate_per_hour": rate}}})


def _exact(plan: Plan, model, samples: int) -> Plan:
    """``plan`` with its instances and prediction simulated as it now says (types, packing, markets)."""
    from rubberband.simulator import simulate

    # Instances left to the simulator: the fewest that fit what the plan now says.
    result = simulate(plan.spec, plan.allocation, model, samples=samples, seed=0,
                      **{**plan.simulation_args(), "instances": None})
    return replace(plan, instances=result.instances, predicted=result,
                   gpus_per_trial=tuple(s.gpus_per_trial for s in result.stages))


def cases(samples: int = 4000) -> dict[str, Callable[[], tuple[Plan, object]]]:
    """Each case's name and a builder of its plan (predicted by ``samples`` simulated samples) and truth model."""
    from rubberband.plan import compile_plan, plan_allocation

    exp = _experiment()
    base = (32, 20, 12, 8)

    def on(cloud, allocation=base, model=None, **changes) -> Plan:
        model = model or exp.model
        plan = plan_allocation(exp.spec, allocation, model, cloud, exp.deadline_s, samples=samples)
        return _exact(replace(plan, **changes), model, samples) if changes else plan

    def optimal():
        return compile_plan(exp.spec, exp.model, exp.cloud, exp.deadline_s, samples=samples, seed=0), exp.model

    solo = exp.model.latency(1)
    packed_model = exp.model.replace(packed_iter_latency_s={2: solo.with_moments(solo.mean * 1.4, solo.std * 1.4)})
    out: dict[str, Callable[[], tuple[Plan, object]]] = {
        "on-demand (optimal plan)": optimal,
        "packed 2/GPU 16,20,12,8": lambda: (on(exp.cloud, model=packed_model, allocation=(16, 20, 12, 8),
                                                trials_per_gpu=(2, 1, 1, 1)), packed_model),
    }
    for rate in (2.0, 5.0):
        for notice in (0.0, 120.0, 600.0):
            def spot_case(rate: float = rate, notice: float = notice) -> tuple[Plan, ModelProfile]:
                return on(_spot(exp, rate, notice)), exp.model
            out[f"spot {rate:g}/h, notice {notice:g} s"] = spot_case
    out["spot trace us-west-2b"] = lambda: (on(exp.catalog.get("p3.8xlarge", Market.SPOT, exp.cloud_overrides)
                                                 .in_zone("us-west-2b", str(TRACES))), exp.model)
    out["mixed 5/h, 120 s: spot 4,3,2,1"] = lambda: (on(_spot(exp, 5.0, 120.0), spot_instances=(4, 3, 2, 1)), exp.model)

    def typed():
        clouds = {t: exp.catalog.get(t, Market.ON_DEMAND, exp.cloud_overrides) for t in ("p3.2xlarge", "p3.8xlarge")}
        return on(clouds["p3.2xlarge"], instance_types=("p3.2xlarge", "p3.8xlarge", "p3.8xlarge", "p3.2xlarge"),
                  type_clouds=clouds), exp.model

    out["types 2x,8x,8x,2x"] = typed
    return out


def agreement(case: str, seeds: int = 800, samples: int = 4000) -> Agreement:
    """Rehearse case ``case`` over seeds ``0..seeds-1`` against its simulated prediction."""
    from rubberband.executor.rehearse import rehearse

    plan, model = cases(samples)[case]()
    runs = [rehearse(plan, model, seed=s) for s in range(seeds)]
    jct = np.array([r.actual["jct_s"] for r in runs])
    cost = np.array([r.actual["cost_usd"] for r in runs])
    pred, deadline = plan.predicted, plan.deadline_s
    return Agreement(case, seeds, (float(jct.mean()), pred.mean_jct_s), (float(cost.mean()), pred.mean_cost_usd),
                     (float(np.mean(jct <= deadline)), float(np.mean(pred.jct_s <= deadline))),
                     float(jct.std(ddof=1) / np.sqrt(seeds) / pred.mean_jct_s))
