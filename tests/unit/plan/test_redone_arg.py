"""``compile_plan(..., redone=)``: a re-plan's remaining stages count the job's redone iterations
(DESIGN §4), on every table the planner searches; the plan stays its own simulation."""

from __future__ import annotations

import pytest

from rubberband import SpecError
from rubberband.plan import compile_plan
from rubberband.simulator import simulate
from rubberband.testing.builders import scaling_model

from .test_fusion import PAYS
from .test_variants import SHA256, p3_catalog


@pytest.mark.parametrize("market", [None, "auto"])
def test_the_packed_and_fused_variants_count_the_redone_iterations_given(market):
    model = scaling_model(packed={2: 1.3, 4: 2.2}, fused=PAYS)
    cloud = p3_catalog().get("p3.2xlarge")
    if market == "auto":
        cloud = cloud.replace(spot_price_usd_per_hour=cloud.price_usd_per_hour / 3)
    redone = tuple(3 * (i % 2) for i in range(SHA256.num_stages()))
    plan = compile_plan(SHA256, model, cloud, 3600.0, samples=30, redone=redone, market=market)
    assert tuple(s.redone for s in plan.predicted.stages) == redone
    again = simulate(SHA256, plan.allocation, model, samples=30, seed=plan.seed, redone=redone,
                     **plan.simulation_args())
    assert again.mean_cost_usd == pytest.approx(plan.predicted.mean_cost_usd, rel=1e-9)
    assert again.mean_jct_s == pytest.approx(plan.predicted.mean_jct_s, rel=1e-9)
    # Without it, the spec's own (a function that checkpoints every iteration redoes nothing).
    assert all(s.redone == 0 for s in compile_plan(SHA256, model, cloud, 3600.0, samples=30).predicted.stages)


def test_bad_redone_is_one_line_naming_it():
    model, cloud = scaling_model(), p3_catalog().get("p3.2xlarge")
    with pytest.raises(SpecError, match=r"^redone: expected whole numbers of iterations, at least 0, got \(-1,"):
        compile_plan(SHA256, model, cloud, 3600.0, samples=5, redone=(-1,) * SHA256.num_stages())
