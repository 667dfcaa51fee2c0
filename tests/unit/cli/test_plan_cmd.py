"""`rubberband plan` and `rubberband whatif`: tables, JSON, plan files, plots and one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rubberband.plan import POLICIES, Plan

from .helpers import assert_one_line_error, run, spot_experiment

ROOT = Path(__file__).resolve().parents[3]
CIFAR = str(ROOT / "experiments" / "resnet101_cifar10.yaml")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# --- plan ------------------------------------------------------------------------------------------

def test_plan_prints_the_plan_summary_and_considered_plans(capsys):
    code, out, err = run(capsys, "plan", CIFAR)
    assert code == 0, err
    assert "plan (optimal) on p3.8xlarge" in out and "deadline 20m00s" in out
    for header in ("stage", "trials", "iters", "GPUs/trial", "instances", "mean time", "stage cost"):
        assert header in out
    assert "JCT  mean" in out and "cost mean" in out and "P(JCT <= 20m00s)" in out
    assert "considered plans (* chosen)" in out
    considered = out.split("considered plans (* chosen)")[1]
    rows = [line.split()[0] for line in considered.strip().splitlines()[2:]]
    assert sorted(rows) == sorted(POLICIES)
    assert "1.00x *" in considered


def test_plan_json(capsys):
    code, out, _ = run(capsys, "plan", CIFAR, "--json", "--samples", "200")
    assert code == 0
    data = json.loads(out)
    assert data["experiment"] == "resnet101-cifar10" and data["policy"] == "optimal"
    for key in ("allocation", "instances", "gpus_per_trial", "predicted", "considered", "cloud", "stages"):
        assert key in data
    assert len(data["allocation"]) == len(data["instances"]) == len(data["stages"]) == 4
    assert data["predicted"]["jct_s_mean"] <= data["deadline_s"] == 1200.0
    assert "jct_s" not in data["predicted"]              # per-sample arrays stay out of the CLI output
    assert sorted(c["policy"] for c in data["considered"]) == sorted(POLICIES)
    assert min(c["cost_usd_mean"] for c in data["considered"]) == pytest.approx(data["predicted"]["cost_usd_mean"])


def test_plan_out_writes_a_plan_file(capsys, tmp_path):
    path = tmp_path / "plan.json"
    code, out, _ = run(capsys, "plan", CIFAR, "--samples", "200", "--out", str(path))
    assert code == 0 and f"wrote {path}" in out
    plan = Plan.from_json(path.read_text())
    assert plan.policy == "optimal" and plan.deadline_s == 1200.0 and plan.samples == 200
    assert plan.instance_type == "p3.8xlarge" and len(plan.allocation) == 4
    assert plan.predicted.samples == 200 and plan.predicted.mean_jct_s <= 1200.0


NOTE = re.compile(r"^note: this plan meets the (\S+) deadline in only (\d+)% of samples; (.*)$", re.M)


def test_plan_says_when_the_mean_constrained_plan_often_misses_and_what_confidence_0_9_costs(capsys):
    code, out, _ = run(capsys, "plan", CIFAR, "--samples", "200")
    assert code == 0
    (note,) = NOTE.findall(out)
    deadline, p_meet, advice = note
    assert deadline == "20m00s" and int(p_meet) < 80
    _, surer, _ = run(capsys, "plan", CIFAR, "--samples", "200", "--confidence", "0.9", "--json")
    surer = json.loads(surer)["predicted"]
    cost = f"${surer['cost_usd_mean']:.2f}"
    assert re.fullmatch(rf"--confidence 0\.9 would cost {re.escape(cost)} mean \(\+\d+%\), "
                        rf"P\(meet\) {surer['p_meet']:.0%}", advice), advice
    code, out, _ = run(capsys, "plan", CIFAR, "--samples", "200", "--json")
    assert NOTE.fullmatch(json.loads(out)["note"])


def test_plan_says_when_no_plan_reaches_confidence_0_9(capsys):
    code, out, _ = run(capsys, "plan", CIFAR, "--samples", "200", "--deadline", "455s")
    assert code == 0
    assert NOTE.findall(out)[0][2] == "no plan meets it with --confidence 0.9"


@pytest.mark.parametrize("extra", [["--confidence", "0.6"], ["--deadline", "30m"]])
def test_no_note_with_a_confidence_or_when_the_plan_usually_meets_its_deadline(capsys, extra):
    code, out, _ = run(capsys, "plan", CIFAR, "--samples", "200", *extra)
    assert code == 0 and "P(JCT" in out and not NOTE.findall(out)


def test_stage_cost_footnote_says_where_billing_top_ups_land(capsys):
    code, out, _ = run(capsys, "plan", CIFAR, "--samples", "100")
    lines = out.splitlines()
    last_stage = max(i for i, line in enumerate(lines) if line.strip().startswith("3 "))
    assert lines[last_stage + 1] == ("stage cost: billing round-ups and minimum-billing top-ups land on the last "
                                     "stage an instance serves")


def test_plan_infeasible_deadline_is_one_error_line(capsys):
    code, out, err = run(capsys, "plan", CIFAR, "--deadline", "1m", "--samples", "100")
    assert code == 2 and out == ""
    assert_one_line_error(err, "no plan meets the deadline of 60s", "shortest achievable JCT is ")


def test_plan_unknown_policy_is_one_error_line_with_did_you_mean(capsys):
    code, out, err = run(capsys, "plan", CIFAR, "--policy", "gredy")
    assert code == 2 and out == ""
    assert_one_line_error(err, "unknown policy 'gredy'", "did you mean `greedy`")


def test_plan_with_a_policy_and_deadline(capsys):
    code, out, _ = run(capsys, "plan", CIFAR, "--policy", "static", "--deadline", "25m", "--samples", "100", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["policy"] == "static" and data["deadline_s"] == 1500.0
    assert len(set(data["instances"])) == 1              # a static cluster holds the same count


def test_plan_confidence(capsys):
    code, out, _ = run(capsys, "plan", CIFAR, "--confidence", "0.9", "--samples", "200")
    assert code == 0
    assert "P(meet) >= 0.9" in out
    code, out, _ = run(capsys, "plan", CIFAR, "--confidence", "0.9", "--samples", "200", "--json")
    data = json.loads(out)
    assert data["confidence"] == 0.9 and data["predicted"]["p_meet"] >= 0.9


def test_plan_bad_confidence_is_one_error_line(capsys):
    code, _, err = run(capsys, "plan", CIFAR, "--confidence", "1.5")
    assert code == 2
    assert_one_line_error(err, "confidence")


def test_plan_instance_type_auto(capsys):
    code, out, _ = run(capsys, "plan", CIFAR, "--instance-type", "auto", "--samples", "200", "--json")
    assert code == 0
    data = json.loads(out)
    types = {c["instance_type"] for c in data["considered"]}
    # V100 types only; p3.2xlarge too (trials of one GPU fit on it), other GPU models never.
    assert {"p3.2xlarge", "p3.8xlarge", "p3.16xlarge", "p3dn.24xlarge"} <= types
    assert not types & {"g4dn.12xlarge", "p4d.24xlarge"}
    same_policy = [c for c in data["considered"] if c["policy"] == "optimal" and "infeasible" not in c]
    assert data["predicted"]["cost_usd_mean"] == pytest.approx(min(c["cost_usd_mean"] for c in same_policy))
    code, out, _ = run(capsys, "plan", CIFAR, "--instance-type", "auto", "--samples", "200")
    assert code == 0 and "p3.16xlarge" in out and "p3dn.24xlarge" in out


def test_plan_unknown_instance_type_is_one_error_line(capsys):
    code, _, err = run(capsys, "plan", CIFAR, "--instance-type", "p3.8xlarg")
    assert code == 2
    assert_one_line_error(err, "did you mean `p3.8xlarge`")


# --- whatif ----------------------------------------------------------------------------------------

def test_whatif_deadline_sweep_with_plot(capsys, tmp_path):
    png = tmp_path / "x.png"
    code, out, err = run(capsys, "whatif", CIFAR, "--deadline", "18m:24m:2m", "--plot", str(png), "--samples", "100")
    assert code == 0, err
    for label in ("18m00s", "20m00s", "22m00s", "24m00s"):
        assert label in out
    assert "static/optimal" in out and f"wrote {png}" in out
    assert png.read_bytes()[:8] == PNG_SIGNATURE


def test_whatif_init_latency(capsys):
    code, out, _ = run(capsys, "whatif", CIFAR, "--init-latency", "1s,100s", "--samples", "100", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["axes"] == ["init_latency_s"]
    assert [s["init_latency_s"] for s in data["scenarios"]] == [1.0, 100.0]
    cheap, dear = (s["cost_usd"]["optimal"] for s in data["scenarios"])
    assert cheap < dear


def test_whatif_billing(capsys):
    code, out, _ = run(capsys, "whatif", CIFAR, "--billing", "per_instance,per_function", "--samples", "100")
    assert code == 0
    assert "per_instance" in out and "per_function" in out
    code, out, _ = run(capsys, "whatif", CIFAR, "--billing", "per_instance,per_function", "--samples", "100", "--json")
    by_billing = {s["billing"]: s["cost_usd"] for s in json.loads(out)["scenarios"]}
    for policy in POLICIES:
        # Per-function billing charges only the GPU-seconds of TRAIN: no SCALE/INIT/SYNC, idle GPUs or rounding.
        assert by_billing["per_function"][policy] < by_billing["per_instance"][policy], policy


def test_whatif_headers_say_their_unit_and_init_latency_has_one_format(capsys):
    code, out, _ = run(capsys, "whatif", CIFAR, "--init-latency", "1s,100s", "--data-price", "0,0.16",
                       "--policies", "optimal", "--samples", "50")
    assert code == 0
    lines = out.splitlines()
    header = re.split(r"\s{2,}", lines[1])
    assert header == ["init latency", "data price (USD/GB)", "optimal cost (USD)", "static/optimal cost"]
    assert [re.split(r"\s{2,}", line.strip())[:2] for line in lines[3:7]] == [
        ["1s", "0"], ["1s", "0.16"], ["100s", "0"], ["100s", "0.16"]]


def test_whatif_hour_scale_deadlines_keep_their_seconds(capsys):
    code, out, _ = run(capsys, "whatif", CIFAR, "--deadline", "90m:91m:1s", "--policies", "optimal", "--samples", "50")
    assert code == 0
    deadlines = [line.split()[0] for line in out.splitlines()[3:]]
    assert len(deadlines) == len(set(deadlines)) == 61
    assert deadlines[:2] == ["1h30m00s", "1h30m01s"] and deadlines[-1] == "1h31m00s"


def test_a_two_axis_whatif_plot_draws_one_line_per_value_of_the_second_axis():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from rubberband import load_experiment
    from rubberband.cli.whatif_cmd import whatif_figure
    from rubberband.plan import whatif

    exp = load_experiment(CIFAR)
    vary = {"deadline_s": [5400.0, 6000.0, 6600.0, 7200.0], "init_latency_s": [1.0, 100.0]}
    scenarios = whatif(exp.spec, exp.model, exp.cloud, 1200.0, vary, ["static", "optimal"], samples=50)
    fig = whatif_figure(scenarios, list(vary), ["static", "optimal"])
    lines = fig.axes[0].get_lines()
    plt.close(fig)
    assert sorted(line.get_label() for line in lines) == [
        "optimal, init latency 100s", "optimal, init latency 1s", "static, init latency 100s", "static, init latency 1s"]
    for line in lines:
        assert list(line.get_xdata()) == [90, 100, 110, 120]       # minutes, each once: no zig-zag
        policy, latency = line.get_label().split(", init latency ")
        assert list(line.get_ydata()) == [s.costs[policy] for s in scenarios
                                          if s.values["init_latency_s"] == float(latency[:-1])]


def test_whatif_trials_json(capsys):
    code, out, _ = run(capsys, "whatif", CIFAR, "--trials", "16,32", "--samples", "100", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["policies"] == list(POLICIES)
    assert [s["num_trials"] for s in data["scenarios"]] == [16, 32]
    for s in data["scenarios"]:
        assert set(s["cost_usd"]) == set(POLICIES)
        assert s["cost_usd"]["optimal"] <= min(v for v in s["cost_usd"].values() if v is not None) + 1e-9


def test_whatif_without_a_sweep_is_one_error_line(capsys):
    code, out, err = run(capsys, "whatif", CIFAR)
    assert code == 2 and out == ""
    assert_one_line_error(err, "nothing to sweep")


def test_whatif_unknown_billing_is_one_error_line(capsys):
    code, _, err = run(capsys, "whatif", CIFAR, "--billing", "per_second")
    assert code == 2
    assert_one_line_error(err, "per_second")


def test_plan_market_auto_shows_the_market_and_reclaims_per_stage_and_the_markets_weighed(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", spot_experiment(tmp_path, market="auto", rate_per_hour=0.3), "--confidence", "0.9")
    assert code == 0
    assert re.search(r"instances\s+market\s+reclaims\s+mean time", out)
    assert re.search(r"^\s+0\s+32\s+1\s+1\s+32\s+8\s+spot\s+\d\.\d\d\s", out, re.MULTILINE)
    for label in ("all on-demand", "all spot", "chosen: spot"):
        assert label in out
    code, out, _ = run(capsys, "plan", spot_experiment(tmp_path, market="on-demand", rate_per_hour=0.3), "--market", "auto", "--json")
    data = json.loads(out)
    assert code == 0 and data["spot_instances"] == data["instances"]


def test_market_auto_without_a_spot_price_is_one_error_line(capsys, tmp_path):
    region = tmp_path / "region.yaml"
    region.write_text("provider: aws\nregion: us-east-1\ninstance_types:\n"
                      "  p3.8xlarge: {gpus_per_instance: 4, gpu_model: V100, price_usd_per_hour: 12.24}\n")
    path = spot_experiment(tmp_path, market="auto", region=region)
    code, _, err = run(capsys, "plan", path)
    assert code == 2
    assert_one_line_error(err, "cloud.market: auto weighs spot against on-demand but p3.8xlarge has no spot price")


def test_whatif_sweeps_the_spot_market(capsys, tmp_path):
    code, out, _ = run(capsys, "whatif", spot_experiment(tmp_path), "--market", "on-demand,spot", "--preemption-rate",
                       "0,2", "--notice", "0,2m", "--policies", "optimal", "--samples", "30")
    assert code == 0
    assert re.search(r"market\s+reclaims/instance-h\s+notice\s+optimal cost \(USD\)", out)
    assert len(re.findall(r"^(on-demand|spot)\s", out, re.MULTILINE)) == 8
    code, _, err = run(capsys, "whatif", spot_experiment(tmp_path), "--zone", "us-east-1b", "--samples", "20")
    assert code == 2
    assert_one_line_error(err, "zone: 'us-east-1b' is not in", "did you mean `us-east-2b`")


@pytest.mark.parametrize("zone", [",", " , "])
def test_a_zone_list_with_no_zone_is_refused_not_read_as_every_zone(capsys, zone):
    code, _, err = run(capsys, "plan", str(ROOT / "experiments" / "resnet101_spot.yaml"), "--zone", zone)
    assert code == 2
    assert_one_line_error(err, f"--zone: {zone!r} names no zone; give auto for every zone")
