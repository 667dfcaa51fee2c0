"""build_dag with spot markets: which instances and TRAINs are spot, and reclaims left to sampled timelines."""

import pytest

from rubberband.errors import SpecError
from rubberband.profiles.cloud import CloudProfile, Market
from rubberband.profiles.distributions import Constant, Normal
from rubberband.profiles.model import ModelProfile
from rubberband.profiles.spot import SpotMarket
from rubberband.simulator import build_dag, layout, simulate
from rubberband.simulator.dag import INIT_INSTANCE, SCALE, SYNC, TRAIN, dag_size

MODEL = ModelProfile({1: Normal(4.0, 0.4), 2: Normal(2.2, 0.2), 4: Normal(1.3, 0.1), 8: Normal(0.8, 0.08)},
                     trial_startup_s=Normal(8.0, 1.0), sync_s=Constant(1.0), name="m")
CLOUD = CloudProfile(instance_type="p3.8xlarge", gpus_per_instance=4, price_usd_per_hour=12.24,
                     spot_price_usd_per_hour=3.67, market=Market.SPOT, spot=SpotMarket(notice_s=120, rate_per_hour=2.0))


def _spec():
    from rubberband.spec import ExperimentSpec

    return ExperimentSpec.sha(num_trials=16, min_iters=2, max_iters=40, eta=2)      # 16, 8, 4, 2, 1 trials


def nodes(graph, kind, stage):
    return [data for _, data in sorted(graph.nodes(data=True), key=lambda n: str(n[0]))
            if data["type"] == kind and data["stage"] == stage]


def test_instances_and_trains_carry_their_market():
    allocation, spot = [16, 8, 8, 16, 8], [2, 1, 1, 3, 2]      # held 4, 2, 2, 4, 2
    graph = build_dag(_spec(), allocation, MODEL, CLOUD, spot_instances=spot)
    assert graph.graph["spot_instances"] == (2, 1, 1, 3, 2)
    assert graph.graph["preemption"] == {"rate_per_hour": 2.0}
    assert sorted(d["market"] for d in nodes(graph, INIT_INSTANCE, 0)) == ["on-demand"] * 2 + ["spot"] * 2
    assert nodes(graph, SCALE, 0)[0]["new_spot"] == 2
    # Stage 0: 16 one-GPU trials, four to an instance, on-demand instances first.
    assert [d["market"] for d in sorted(nodes(graph, TRAIN, 0), key=lambda d: d["trial"])] == ["on-demand"] * 8 + ["spot"] * 8
    # Stage 3: two 8-GPU trials over two instances each; 1 on-demand and 3 spot: one trial spans both markets.
    assert [d["market"] for d in sorted(nodes(graph, TRAIN, 3), key=lambda d: d["trial"])] == ["mixed", "spot"]


def test_a_market_switch_launches_what_it_switches_to_as_the_simulator_does():
    allocation, spot = [16, 8, 8, 8, 8], [4, 1, 0, 2, 0]
    graph = build_dag(_spec(), allocation, MODEL, CLOUD, spot_instances=spot)
    result = simulate(_spec(), allocation, MODEL, CLOUD, samples=5, spot_instances=spot)
    for stats in result.stages:
        scale = nodes(graph, SCALE, stats.index)
        assert (scale[0]["new_instances"] if scale else 0) == stats.new_instances
        assert len(nodes(graph, INIT_INSTANCE, stats.index)) == stats.new_instances
    shapes, held = layout(_spec(), allocation, MODEL, CLOUD)
    assert graph.number_of_nodes() == dag_size(shapes, held, spot)[0]


def test_reclaims_are_not_nodes_of_the_plan_graph():
    graph = build_dag(_spec(), [16, 8, 8, 4, 2], MODEL, CLOUD)          # every instance spot (the market's default)
    assert {d["type"] for _, d in graph.nodes(data=True)} == {SCALE, INIT_INSTANCE, TRAIN, SYNC}
    assert all(d["market"] == "spot" for _, d in graph.nodes(data=True) if d["type"] in (INIT_INSTANCE, TRAIN))
    on_demand = build_dag(_spec(), [16, 8, 8, 4, 2], MODEL, CLOUD.replace(market=Market.ON_DEMAND))
    assert on_demand.graph["spot_instances"] == (0,) * 5 and on_demand.graph["preemption"] is None


def test_bad_spot_counts_name_the_stage():
    with pytest.raises(SpecError, match=r"spot_instances\[1\]: expected a whole number of the stage's 2 instances"):
        build_dag(_spec(), [16, 8, 8, 4, 2], MODEL, CLOUD, spot_instances=[4, 3, 0, 0, 0])
