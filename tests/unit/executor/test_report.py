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


def test_a_run_on_several_instance_types_reports_each_stage_type_and_each_types_cost():
    def stage(i, instance_type):
        return {"index": i, "trials": 1, "gpus_per_trial": 1, "instance_type": instance_type,
                "predicted": {"duration_s": 60.0, "instances": 1, "cost_usd": 0.05},
                "actual": {"duration_s": 60.0, "instances": 1, "cost_usd": 0.05}}

    def typed(price, cost):
        return {"cost_usd": cost, "markets": {"on-demand": {"instances": 1, "reclaimed": 0,
                                                            "price_usd_per_hour": price, "cost_usd": cost}}}

    by_type = {"local.1gpu": typed(1.006, 0.0168), "local.2gpu": typed(2.0, 0.0333)}
    ledger = {"by_type": by_type, "markets": {f"on-demand {t}": d["markets"]["on-demand"] for t, d in by_type.items()}}
    result = RunResult("r", "/tmp/r", {}, {"jct_s": 120.0, "cost_usd": 0.1}, {"jct_s": 120.0, "cost_usd": 0.0501},
                       [stage(0, "local.1gpu"), stage(1, "local.2gpu")], {}, ledger)
    lines = result.table().splitlines()
    assert "type" in lines[1].split() and "local.2gpu" in lines[4].split()
    assert f"local.1gpu: 1 instance(s) launched, {format_usd(0.0168)}" in lines
    assert f"local.2gpu: 1 instance(s) launched, {format_usd(0.0333)}" in lines
    assert f"on-demand local.2gpu 1 instance(s) at {format_usd(2.0)}/h, 0 reclaimed, {format_usd(0.0333)}" in lines


def test_a_stage_a_re_plan_moved_to_another_type_shows_both():
    stage = {"index": 1, "trials": 1, "gpus_per_trial": 2, "instance_type": "local.1gpu",
             "predicted": {"duration_s": 60.0, "instances": 1, "cost_usd": 0.05, "instance_type": "local.2gpu"},
             "actual": {"duration_s": 50.0, "instances": 2, "cost_usd": 0.04}}
    ledger = {"by_type": {"local.1gpu": {"cost_usd": 0.04, "markets": {}}, "local.2gpu": {"cost_usd": 0.0, "markets": {}}}}
    result = RunResult("r", "/tmp/r", {}, {"jct_s": 60.0, "cost_usd": 0.05}, {"jct_s": 50.0, "cost_usd": 0.04},
                       [stage], {}, ledger)
    assert "local.2gpu→local.1gpu" in result.table().splitlines()[3].split()


def test_the_summary_names_the_instances_of_each_stage_planned_and_actual():
    def stage(i, planned, actual):
        return {"index": i, "trials": 4 >> i, "gpus_per_trial": 1,
                "predicted": {"duration_s": 10.0, "instances": planned, "cost_usd": 0.01},
                "actual": {"duration_s": 10.0, "instances": actual, "cost_usd": 0.01}}

    result = RunResult("r", "/tmp/r", {}, {"jct_s": 30.0, "cost_usd": 0.03}, {"jct_s": 30.0, "cost_usd": 0.03},
                       [stage(0, 2, 2), stage(1, 2, 1), stage(2, 1, 1)], {}, {})
    assert "instances per stage  planned 2,2,1  actual 2,1,1" in result.table().splitlines()


def test_the_summary_counts_the_iterations_redone_predicted_and_actual():
    def stage(i, trials, redone):
        return {"index": i, "trials": trials, "gpus_per_trial": 1,
                "predicted": {"duration_s": 10.0, "instances": 1, "cost_usd": 0.01, **({"redone": redone} if redone else {})},
                "actual": {"duration_s": 10.0, "instances": 1, "cost_usd": 0.01}}

    trials = {"t0": {"redone": 2}, "t1": {"redone": 3}, "t2": {}}
    result = RunResult("r", "/tmp/r", {}, {"jct_s": 20.0, "cost_usd": 0.02}, {"jct_s": 20.0, "cost_usd": 0.02},
                       [stage(0, 3, 0), stage(1, 2, 2)], trials, {})
    assert ("redone iterations  predicted 4  actual 5 (trained again on resuming from a checkpoint older than the "
            "stage's end)") in result.table().splitlines()
    plain = RunResult("r", "/tmp/r", {}, {"jct_s": 20.0, "cost_usd": 0.02}, {"jct_s": 20.0, "cost_usd": 0.02},
                      [stage(0, 3, 0)], {"t0": {}}, {})
    assert not any(line.startswith("redone") for line in plain.table().splitlines())
