"""`rubberband report RUN_DIR`: the table of a finished run again, its result.json as data, and its
actual timeline (`--gantt`, also on `run`) drawn from the ledger: rows, bars and reclaims checked
against the ledger, for a rehearsal (sim) and for runs recorded on local and on aws (moto)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rubberband.cli.gantt import REPLAN, run_chart, run_figure
from rubberband.executor.report import RunResult

from .helpers import ROOT, assert_one_line_error, run

SPOT_JOB = f"""
sha: {{num_trials: 32, min_iters: 1, max_iters: 50, eta: 3}}
model_profile: {ROOT / 'profiles' / 'resnet101_cifar10_p3.yaml'}
cloud:
  profile: {ROOT / 'cloud_profiles' / 'aws' / 'us-east-1.yaml'}
  instance_type: p3.8xlarge
  market: spot
  overrides: {{init_latency_s: {{dist: constant, value: 15}}, spot: {{notice_s: 120, preemption: {{rate_per_hour: 8}}}}}}
deadline: 20m
samples: 30
"""


@pytest.fixture(scope="module")
def matplotlib():
    return pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """A spot rehearsal (seed 4: 8 reclaims, no safety net) run by `run --provider sim`: its
    printed output, its run directory and its result.json."""
    import contextlib
    import io

    from rubberband.cli.main import main

    tmp = tmp_path_factory.mktemp("report")
    exp = tmp / "spot.yaml"
    exp.write_text(SPOT_JOB)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["run", str(exp), "--provider", "sim", "--seed", "4", "--no-safety-net",
                     "--runs-dir", str(tmp / "runs")])
    assert code == 0
    (run_dir,) = (tmp / "runs").iterdir()
    return out.getvalue(), run_dir, json.loads((run_dir / "result.json").read_text())


def test_a_rehearsal_writes_a_run_directory_as_a_run_does(rehearsal):
    text, run_dir, data = rehearsal
    assert {"plan.json", "result.json", "model_profile.json"} <= {p.name for p in run_dir.iterdir()}
    assert text.rstrip().endswith(f"run directory: {run_dir}")
    assert data["run_dir"] == str(run_dir) and data["run_id"] == run_dir.name and data["provider"] == "sim"
    assert data["reclaims"] > 0           # a run with spot reclaims, for the chart below


def test_report_prints_the_table_run_printed(capsys, rehearsal):
    text, run_dir, data = rehearsal
    code, out, err = run(capsys, "report", str(run_dir))
    assert code == 0 and err == ""
    table = RunResult.from_dict(data).table()
    assert out == table + f"\nrun directory: {run_dir}\n"
    # The same predicted-vs-actual lines the rehearsal printed at its end.
    first = table.splitlines()[:len(data["stages"]) + 5]
    assert "\n".join(first) in text


def test_report_json_is_the_result_json(capsys, rehearsal):
    _, run_dir, data = rehearsal
    code, out, _ = run(capsys, "report", str(run_dir), "--json")
    assert code == 0 and json.loads(out) == data


def test_the_chart_has_a_row_per_instance_and_a_bar_per_train_of_the_ledger(rehearsal):
    _, _, data = rehearsal
    chart = run_chart(data)
    ledger = data["ledger"]
    assert len(chart.timeline.instances) == len(ledger["instances"])
    assert sorted(chart.names) == sorted(r["instance_id"] for r in ledger["instances"])
    assert len(chart.timeline.trials) == len(ledger["trials"])
    assert chart.timeline.reclaims == data["reclaims"] == sum(
        r["release_reason"] == "interrupted" and r["launched_s"] is not None for r in ledger["instances"])
    # Each bar on the instances and in the stage the ledger says, at its times.
    drawn = sorted((t.stage, t.start_s, t.end_s, tuple(sorted(chart.names[i] for i in t.instances)))
                   for t in chart.timeline.trials)
    assert drawn == sorted((r["stage"], r["start_s"], r["end_s"], tuple(sorted(set(r["instances"]))))
                           for r in ledger["trials"])


def test_trains_on_one_instance_at_once_are_in_different_lanes(rehearsal):
    chart = run_chart(rehearsal[2])
    trials = chart.timeline.trials
    for a in trials:
        for b in trials:
            if a is not b and set(a.instances) & set(b.instances) and a.start_s < b.end_s - 1e-9 and b.start_s < a.end_s - 1e-9:
                assert a.lane != b.lane, (a, b)


def test_each_reclaim_is_linked_to_its_replacement(rehearsal):
    # The sim requests a replacement at the notice, 120 s before the reclaim.
    chart = run_chart(rehearsal[2], notice_s=120.0)
    spans = chart.timeline.instances
    replaced = sorted(s.replaces for s in spans if s.replaces is not None)
    reclaimed = [s.instance for s in spans if s.reclaimed_s is not None]
    assert replaced and set(replaced) <= set(reclaimed) and len(set(replaced)) == len(replaced)
    for s in spans:
        if s.replaces is not None:
            old = spans[s.replaces]
            assert s.instance_type == old.instance_type and old.launched_s <= s.requested_s <= old.reclaimed_s + 60


def drawn(ax):
    """What an axes shows: row labels, trial bars (row, start, end), reclaim markers (x) and
    the closed loop's marks (dashed purple lines)."""
    from matplotlib.colors import to_hex

    rows = [t.get_text() for t in ax.get_yticklabels()]
    bars = sorted((math.floor(p.get_y() + 0.4 + 1e-9), round(p.get_x(), 6), round(p.get_x() + p.get_width(), 6))
                  for p in ax.patches if p.get_height() < 0.79 and not p.get_hatch())
    reclaims = [line for line in ax.lines if line.get_marker() == "x"]
    marks = [line for line in ax.lines if to_hex(line.get_color()) == REPLAN]
    return rows, bars, reclaims, marks


def test_the_figure_draws_the_charts_rows_bars_and_reclaims(matplotlib, rehearsal):
    import matplotlib.pyplot as plt

    from rubberband.cli.report_cmd import predicted_timeline
    from rubberband.plan.plan import Plan
    from rubberband.profiles.model import ModelProfile

    _, run_dir, data = rehearsal
    chart = run_chart(data)
    plan = Plan.from_json((run_dir / "plan.json").read_text())
    model = ModelProfile.from_dict(json.loads((run_dir / "model_profile.json").read_text())["model_profile"])
    predicted, _ = predicted_timeline(plan, model)
    fig = run_figure(chart, predicted)
    try:
        actual_ax, predicted_ax = fig.axes[:2]
        rows, bars, reclaims, marks = drawn(actual_ax)
        assert rows == [f"{name} {s.market}" for name, s in zip(chart.names, chart.timeline.instances)]
        assert bars == sorted((i, round(t.start_s, 6), round(t.end_s, 6))
                              for t in chart.timeline.trials for i in t.instances)
        assert len(reclaims) == chart.timeline.reclaims == data["reclaims"]
        assert len(marks) == len(data["replans"])
        # Below it, the predicted median run on the same time axis.
        assert predicted_ax.get_shared_x_axes().joined(actual_ax, predicted_ax)
        p_rows, p_bars, p_reclaims, _ = drawn(predicted_ax)
        assert len(p_rows) == len(predicted.instances)
        assert len(p_bars) == sum(len(t.instances) for t in predicted.trials)
        assert len(p_reclaims) == sum(s.reclaimed_s is not None for s in predicted.instances)
    finally:
        plt.close(fig)


def test_report_gantt_writes_the_picture_and_says_what_it_drew(matplotlib, capsys, rehearsal, tmp_path):
    _, run_dir, data = rehearsal
    png = tmp_path / "actual.png"
    code, out, _ = run(capsys, "report", str(run_dir), "--gantt", str(png))
    assert code == 0 and png.stat().st_size > 10_000
    n, k = len(data["ledger"]["instances"]), len(data["ledger"]["trials"])
    assert out.rstrip().endswith(f"wrote {png}: the actual run ({n} instances, {k} TRAINs, {data['reclaims']} spot "
                                 "reclaims) above the predicted median run")


def test_run_gantt_draws_the_rehearsal_it_ran(matplotlib, capsys, tmp_path):
    exp = tmp_path / "spot.yaml"
    exp.write_text(SPOT_JOB)
    png = tmp_path / "run.png"
    code, out, _ = run(capsys, "run", str(exp), "--provider", "sim", "--seed", "4", "--no-safety-net",
                       "--runs-dir", str(tmp_path / "runs"), "--gantt", str(png), "--json")
    assert code == 0 and png.exists()
    data = json.loads(out)
    assert data["gantt"] == str(png) and Path(data["run_dir"]).parent == tmp_path / "runs"


# --- runs recorded on the real providers (trimmed to what the chart reads) ----------------------

# tests/integration/test_spot_local.py: local, one on-demand and one spot instance; the spot one
# is noticed at 11.3 s, reclaimed at 15.3 s and replaced; its trial resumes on the replacement.
LOCAL_SPOT = json.loads("""{"run_id": "spot-emulation", "run_dir": "RUN", "best": {"trial": "t001", "config": {"lr": 0.156},
 "metric": 0.029, "metric_name": "val_loss", "step": 12000},
 "predicted": {"jct_s": 53.899, "cost_usd": 0.0337}, "actual": {"jct_s": 37.604, "cost_usd": 0.0268},
 "stages": [{"index": 0, "trials": 2, "instance_type": "local.1gpu", "gpus_per_trial": 1, "promoted": [],
   "predicted": {"duration_s": 53.899, "instances": 2, "cost_usd": 0.0337, "spot_instances": 1, "instance_type": "local.1gpu"},
   "actual": {"duration_s": 37.573, "instances": 2, "cost_usd": 0.0268, "spot_instances": 1, "reclaimed": 1}}],
 "trials": {"t000": {"history": [{"stage": 0, "instances": ["rb-instance-3"], "gpu_ids": [["0"]], "trials_per_gpu": 1,
                                  "start_s": 14.012, "end_s": 37.568}]},
            "t001": {"history": [{"stage": 0, "instances": ["rb-instance-1"], "gpu_ids": [["0"]], "trials_per_gpu": 1,
                                  "start_s": 14.018, "end_s": 37.573}]}},
 "ledger": {"instances": [
   {"instance_id": "rb-instance-1", "instance_type": "local.1gpu", "requested_s": 1.02, "launched_s": 4.908, "ready_s": 8.102,
    "released_s": 39.407, "release_reason": "released", "market": "on-demand"},
   {"instance_id": "rb-instance-2", "instance_type": "local.1gpu", "requested_s": 1.021, "launched_s": 1.342, "ready_s": 4.908,
    "released_s": 15.345, "release_reason": "interrupted", "market": "spot"},
   {"instance_id": "rb-instance-3", "instance_type": "local.1gpu", "requested_s": 16.345, "launched_s": 16.731, "ready_s": 18.927,
    "released_s": 39.447, "release_reason": "released", "market": "spot"}],
  "trials": [{"trial": "t000", "stage": 0, "gpus": 1.0, "start_s": 14.012, "end_s": 37.568, "iters": 80},
             {"trial": "t001", "stage": 0, "gpus": 1.0, "start_s": 14.018, "end_s": 37.573, "iters": 80}],
  "stage_windows": [[0.0, 37.573]]},
 "replans": [], "safety_net": []}""")
LOCAL_EVENTS = [{"event": e, "instance": i, "t": 5000.0 + t} for e, i, t in [
    ("request", "rb-instance-1", 1.02), ("request", "rb-instance-2", 1.021), ("running", "rb-instance-2", 1.342),
    ("ready", "rb-instance-2", 4.908), ("notice", "rb-instance-2", 11.343), ("terminated", "rb-instance-2", 15.345),
    ("request", "rb-instance-3", 16.345), ("ready", "rb-instance-3", 18.927)]]

# tests/integration/test_closed_loop_aws.py on moto: both spot instances reclaimed at 22.8 s, the
# safety net moves the job to on-demand at 23.2 s; the spot replacements asked for go unused.
AWS_SAFETY_NET = json.loads("""{"run_id": "safety-net", "run_dir": "RUN", "best": {},
 "predicted": {"jct_s": 38.98, "cost_usd": 0.01415}, "actual": {"jct_s": 60.68, "cost_usd": 0.06184}, "stages": [],
 "trials": {"t000": {"history": [{"stage": 0, "instances": ["rb-instance-6"], "gpu_ids": [["0"]], "trials_per_gpu": 1}]},
            "t001": {"history": [{"stage": 0, "instances": ["rb-instance-5"], "gpu_ids": [["0"]], "trials_per_gpu": 1},
                                 {"stage": 1, "instances": ["rb-instance-5"], "gpu_ids": [["0"]], "trials_per_gpu": 1}]}},
 "ledger": {"instances": [
   {"instance_id": "rb-instance-1", "instance_type": "g5.xlarge", "requested_s": 1.004, "launched_s": 3.793, "ready_s": 11.291,
    "released_s": 22.793, "release_reason": "interrupted", "market": "spot"},
   {"instance_id": "rb-instance-2", "instance_type": "g5.xlarge", "requested_s": 1.004, "launched_s": 3.793, "ready_s": 8.019,
    "released_s": 22.793, "release_reason": "interrupted", "market": "spot"},
   {"instance_id": "rb-instance-3", "instance_type": "g5.xlarge", "requested_s": 23.25, "launched_s": 26.793, "ready_s": 29.502,
    "released_s": 37.793, "release_reason": "released", "market": "spot"},
   {"instance_id": "rb-instance-4", "instance_type": "g5.xlarge", "requested_s": 23.251, "launched_s": 24.793, "ready_s": 27.25,
    "released_s": 36.793, "release_reason": "lost", "market": "spot"},
   {"instance_id": "rb-instance-5", "instance_type": "g5.xlarge", "requested_s": 24.269, "launched_s": 26.793, "ready_s": 32.717,
    "released_s": 61.793, "release_reason": "released", "market": "on-demand"},
   {"instance_id": "rb-instance-6", "instance_type": "g5.xlarge", "requested_s": 24.269, "launched_s": 26.793, "ready_s": 35.925,
    "released_s": 48.793, "release_reason": "released", "market": "on-demand"}],
  "trials": [{"trial": "t001", "stage": 0, "gpus": 1.0, "start_s": 19.955, "end_s": 48.272, "iters": 16},
             {"trial": "t000", "stage": 0, "gpus": 1.0, "start_s": 19.948, "end_s": 48.289, "iters": 16},
             {"trial": "t001", "stage": 1, "gpus": 1.0, "start_s": 48.344, "end_s": 60.658, "iters": 24}],
  "stage_windows": [[0.0, 48.29], [48.327, 60.659]]},
 "replans": [], "safety_net": [{"at_s": 23.205, "line": "safety net: 8.4s slack < 20.0s needed; stages 0-1 move to on-demand"}]}""")


def test_a_local_spot_run_is_drawn_from_its_ledger_and_notices():
    chart = run_chart(LOCAL_SPOT, LOCAL_EVENTS)
    spans = {name: s for name, s in zip(chart.names, chart.timeline.instances)}
    assert list(chart.names) == ["rb-instance-1", "rb-instance-2", "rb-instance-3"]
    assert chart.timeline.reclaims == 1 and spans["rb-instance-2"].reclaimed_s == pytest.approx(15.345)
    assert spans["rb-instance-3"].replaces == spans["rb-instance-2"].instance
    assert chart.notices == {spans["rb-instance-2"].instance: pytest.approx(11.343)}     # from the provider's event
    # A run records where a TRAIN finished (from the history here): t000 moved to the replacement,
    # drawn there from when it was ready; t001 where it ran from its start.
    where = {t.trial: (chart.names[t.instances[0]], t.start_s) for t in chart.timeline.trials}
    assert where == {0: ("rb-instance-3", pytest.approx(18.927)), 1: ("rb-instance-1", pytest.approx(14.018))}
    assert chart.moved == 1


def test_an_aws_run_shows_its_reclaims_replacements_and_the_safety_net():
    chart = run_chart(AWS_SAFETY_NET)
    spans = chart.timeline.instances
    assert len(spans) == 6 and chart.timeline.reclaims == 2
    assert [s.replaces for s in spans] == [None, None, 0, 1, None, None]
    assert chart.marks == ((pytest.approx(23.205), "safety net"),)
    assert [(t.stage, chart.names[t.instances[0]]) for t in chart.timeline.trials] == [
        (0, "rb-instance-6"), (0, "rb-instance-5"), (1, "rb-instance-5")]
    assert chart.moved == 2


@pytest.mark.parametrize("data", [LOCAL_SPOT, AWS_SAFETY_NET], ids=["local", "aws"])
def test_report_of_a_recorded_run_draws_the_actual_run_alone(matplotlib, capsys, tmp_path, data):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "result.json").write_text(json.dumps(data))
    png = tmp_path / "actual.png"
    code, out, _ = run(capsys, "report", str(run_dir), "--gantt", str(png))
    assert code == 0 and png.exists()
    assert f"the predicted run is left out: {run_dir} has no plan.json" in out


# --- bad input ------------------------------------------------------------------------------------

def test_report_refuses_what_is_no_finished_run(capsys, tmp_path):
    missing = tmp_path / "runs" / "nope"
    code, _, err = run(capsys, "report", str(missing))
    assert code == 2
    assert_one_line_error(err, f"RUN_DIR: '{missing}' does not exist", "runs/<run id>")

    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "plan.json").write_text("{}")
    code, _, err = run(capsys, "report", str(killed))
    assert_one_line_error(err, f"'{killed}' has no result.json: the run has not finished", "wait for it to end, or run it again")

    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(capsys, "report", str(empty))
    assert_one_line_error(err, f"'{empty}' is not a run's directory")

    (empty / "result.json").write_text('{"run_id": ')        # cut short
    code, _, err = run(capsys, "report", str(empty))
    assert_one_line_error(err, "cannot read", "result.json", "run the job again")

    (empty / "result.json").write_text('{"run_id": "x"}')
    code, _, err = run(capsys, "report", str(empty))
    assert_one_line_error(err, "is no run's result (no predicted, actual, stages, ledger)")


def test_report_checks_the_picture_file_before_reading_the_run(capsys, tmp_path):
    code, _, err = run(capsys, "report", str(tmp_path / "nope"), "--gantt", str(tmp_path / "x.txt"))
    assert code == 2
    assert_one_line_error(err, "--gantt:", "is no image file")


def test_run_gantt_refuses_repeat(capsys, tmp_path):
    exp = tmp_path / "spot.yaml"
    exp.write_text(SPOT_JOB)
    code, _, err = run(capsys, "run", str(exp), "--provider", "sim", "--repeat", "3", "--gantt", str(tmp_path / "x.png"))
    assert code == 2
    assert_one_line_error(err, "--gantt: draws one run, and --repeat rehearses many")


def test_a_chart_needs_a_ledger():
    from rubberband.errors import SpecError

    with pytest.raises(SpecError, match="no `ledger.instances`"):
        run_chart({"actual": {"jct_s": 1.0}})



def test_notices_and_re_plans_come_from_the_drivers_timeline(rehearsal):
    data = rehearsal[2]
    chart = run_chart(data)
    notices = {e["instance"]: e["t"] for e in data["timeline"] if e["event"] == "notice"}
    assert notices and {chart.names[i]: t for i, t in chart.notices.items()} == notices
    assert [t for t, _ in chart.marks] == sorted(e["t"] for e in data["timeline"] if e["event"] in ("replan", "switch"))


# The same local test recorded with the driver's timeline (gang, notice, resume events): t000
# started on the spot instance, which was reclaimed at 14.7 s; it resumed on the replacement at 22.2 s.
LOCAL_SPOT_TIMELINE = json.loads("""{"actual": {"jct_s": 42.071, "cost_usd": 0.0268}, "ledger": {"instances": [
  {"instance_id": "rb-instance-1", "instance_type": "local.1gpu", "requested_s": 0.366, "launched_s": 0.718, "ready_s": 6.764,
   "released_s": 43.59, "release_reason": "released", "market": "on-demand"},
  {"instance_id": "rb-instance-2", "instance_type": "local.1gpu", "requested_s": 0.366, "launched_s": 0.692, "ready_s": 4.572,
   "released_s": 14.693, "release_reason": "interrupted", "market": "spot"},
  {"instance_id": "rb-instance-3", "instance_type": "local.1gpu", "requested_s": 15.129, "launched_s": 15.517, "ready_s": 17.74,
   "released_s": 43.662, "release_reason": "released", "market": "spot"}],
 "trials": [{"trial": "t001", "stage": 0, "gpus": 1.0, "start_s": 13.949, "end_s": 41.667, "instances": ["rb-instance-1"], "gpu_ids": [["0"]]},
            {"trial": "t000", "stage": 0, "gpus": 1.0, "start_s": 13.881, "end_s": 42.006, "instances": ["rb-instance-3"], "gpu_ids": [["0"]]}],
 "stage_windows": [[0.0, 42.006]]},
 "timeline": [{"t": 13.8801, "event": "gang", "trial": "t000", "instances": ["rb-instance-2"]},
              {"t": 13.9481, "event": "gang", "trial": "t001", "instances": ["rb-instance-1"]},
              {"t": 14.2359, "event": "notice", "instance": "rb-instance-2"},
              {"t": 22.1748, "event": "resume", "trial": "t000", "instances": ["rb-instance-3"]},
              {"t": 22.1755, "event": "gang", "trial": "t000", "instances": ["rb-instance-3"]}]}""")


def test_a_train_a_reclaim_moved_is_drawn_on_each_instance_it_ran_on():
    chart = run_chart(LOCAL_SPOT_TIMELINE)
    bars = sorted((t.trial, chart.names[t.instances[0]], round(t.start_s, 3), round(t.end_s, 3)) for t in chart.timeline.trials)
    assert bars == [(0, "rb-instance-2", 13.881, 14.693),      # until the reclaim
                    (0, "rb-instance-3", 22.175, 42.006),      # from its resume on the replacement
                    (1, "rb-instance-1", 13.949, 41.667)]
    assert chart.moved == 0 and chart.notices == {1: 14.2359} and chart.timeline.instances[2].replaces == 1


def test_init_runs_until_the_instances_workers_are_warm_as_the_models_does():
    # The raylet was up at 3 s but the driver had warm workers only at 5.5 s (its `nodes`
    # event): the model's INIT is running -> usable, so the actual INIT is drawn to 5.5 s, not 3.
    result = {
        "actual": {"jct_s": 9.0},
        "ledger": {"instances": [{"instance_id": "rb-instance-1", "instance_type": "local.2gpu", "requested_s": 0.2,
                                  "launched_s": 2.0, "ready_s": 3.0, "released_s": 9.0, "market": "on-demand",
                                  "release_reason": "released"}],
                   "trials": [{"trial": "t000", "stage": 0, "gpus": 1.0, "start_s": 5.6, "end_s": 8.9, "iters": 2,
                               "iter_s": [1.6, 1.6], "instance_type": "local.2gpu", "instances": ["rb-instance-1"]}]},
        "trials": {"t000": {"history": [{"stage": 0, "instances": ["rb-instance-1"], "gpu_ids": [["0"]]}]}},
        "timeline": [{"t": 0.0, "event": "stage", "index": 0}, {"t": 5.5, "event": "nodes", "instances": ["rb-instance-1"]},
                     {"t": 5.6, "event": "start", "trial": "t000", "stage": 0}],
    }
    (span,) = run_chart(result).timeline.instances
    assert (span.launched_s, span.ready_s) == (2.0, 5.5)
    without = {**result, "timeline": []}
    assert run_chart(without).timeline.instances[0].ready_s == 3.0      # no timeline: the raylet's ready


def test_the_predicted_run_of_a_fused_plan_is_drawn_fused():
    """The report's predicted panel simulates the plan as it is, fused stages included (it drew
    each member as a TRAIN of its own, a median run 40% longer than the plan's), and the titles
    say which stages fused."""
    from rubberband import ExperimentSpec
    from rubberband.cli.report_cmd import predicted_timeline
    from rubberband.plan import plan_allocation, simulate_plan
    from rubberband.simulator.trace import median_sample
    from rubberband.testing.builders import fake_cloud, model_profile

    model = model_profile({1: 4.0}, startup_s=1.0, name="fake", fused_iter_latency_s={4: 6.0})
    plan = plan_allocation(ExperimentSpec.from_stages([(8, 3), (2, 4)]), (2, 2), model, fake_cloud(2), 1e6, samples=20,
                           fused_per_gpu=(4, 1))
    timeline, title = predicted_timeline(plan, model)
    result = simulate_plan(plan, model, samples=20)
    assert timeline.jct_s == pytest.approx(float(result.jct_s[median_sample(result.jct_s.tolist())]))
    assert sorted(t.fused for t in timeline.trials if t.stage == 0) == [4, 4]
