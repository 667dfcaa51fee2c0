"""The run report: per-market counts, reclaims and cost under the predicted-vs-actual table."""

from rubberband.executor.report import RunResult
from rubberband.units import format_usd


def test_the_report_shows_each_market_with_its_reclaims_and_cost():
    stage = {"index": 0, "trials": 2, "gpus_per_trial": 1,
             "predicted": {"duration_s": 60.0, "instances": 2, "cost_usd": 0.05},
             "actual": {"duration_s": 70.0, "instances": 2, "cost_usd": 0.06}}
    markets = {"on-demand": {"instances": 1, "reclaimed": 0, "price_usd_per_hour": 1.006, "cost_usd": 0.03},
               "spot": {"instances": 2, "reclaimed": 1, "price_usd_per_hour": 0.3, "cost_usd": 0.01}}
    result = RunResult("r", "/tmp/r", {}, {"jct_s": 60.0, "cost_usd": 0.05}, {"jct_s": 70.0, "cost_usd": 0.06},
                       [stage], {}, {"markets": markets})
    lines = result.table().splitlines()
    assert f"spot      2 instance(s) at {format_usd(0.3)}/h, 1 reclaimed, {format_usd(0.01)}" in lines
    assert f"on-demand 1 instance(s) at {format_usd(1.006)}/h, 0 reclaimed, {format_usd(0.03)}" in lines
