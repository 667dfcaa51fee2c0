"""`rubberband simulate`: the table and summaries, --json, --gantt, and bad allocations."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rubberband import load_experiment
from rubberband.cli.main import main
from rubberband.simulator import simulate
from rubberband.simulator.trace import sample_timeline

from .helpers import spot_experiment

ROOT = Path(__file__).resolve().parents[3]
PAPER_JOB = str(ROOT / "experiments" / "resnet101_cifar10.yaml")
ARGS = ["simulate", PAPER_JOB, "--allocation", "32,20,12,8", "--samples", "200"]


def test_prints_the_stage_table_and_summaries(capsys):
    assert main(ARGS) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[0].startswith("resnet101-cifar10 on p3.8xlarge (on-demand, per_instance billing), 200 samples, seed 0")
    assert lines[1].split() == ["stage", "trials", "iters", "GPUs", "GPUs/trial", "instances", "new",
                                "mean", "time", "mean", "cost"]
    rows = [line.split() for line in lines[3:7]]
    assert [row[:7] for row in rows] == [
        ["0", "32", "1", "32", "1", "8", "8"],
        ["1", "10", "3", "20", "2", "5", "0"],
        ["2", "3", "9", "12", "4", "3", "0"],
        ["3", "1", "37", "8", "8", "2", "0"],
    ]
    assert any(line.startswith("JCT  mean ") and " p50 " in line and " p90 " in line for line in lines)
    assert any(line.startswith("cost mean $") for line in lines)
    # The experiment's 20-minute deadline is reported.
    assert any(line.startswith("P(JCT <= 20m00s) = ") for line in lines)


def test_json_output(capsys):
    assert main([*ARGS, "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    payload = json.loads(out)
    assert payload["experiment"] == "resnet101-cifar10"
    assert payload["instance_type"] == "p3.8xlarge"
    assert payload["allocation"] == [32, 20, 12, 8]
    assert payload["instances"] == [8, 5, 3, 2]
    assert payload["samples"] == 200
    assert [s["gpus_per_trial"] for s in payload["stages"]] == [1, 2, 4, 8]
    assert 0 <= payload["p_meet"] <= 1
    assert payload["deadline_s"] == 1200
    # The CLI reports what the Python API computes for the same experiment and seed.
    exp = load_experiment(PAPER_JOB)
    expected = simulate(exp.spec, [32, 20, 12, 8], exp.model, exp.cloud, samples=200, seed=exp.seed)
    assert payload["jct_s_mean"] == pytest.approx(expected.mean_jct_s, rel=1e-12)
    assert payload["cost_usd_mean"] == pytest.approx(expected.mean_cost_usd, rel=1e-12)
    assert sum(s["mean_cost_usd"] for s in payload["stages"]) == pytest.approx(payload["cost_usd_mean"], rel=1e-9)


def test_seed_and_deadline_options(capsys):
    assert main([*ARGS, "--json", "--seed", "3", "--deadline", "1h"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["seed"] == 3
    assert payload["deadline_s"] == 3600
    assert payload["p_meet"] == 1.0


@pytest.fixture(scope="module")
def matplotlib():
    """--gantt needs the optional `plot` extra; importing it once here keeps the test itself short."""
    import io

    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()                 # loads the fonts once
    ax.set_title("warm-up")
    fig.savefig(io.BytesIO(), format="png")
    plt.close(fig)
    return mpl


def test_gantt_writes_a_png(tmp_path, capsys, matplotlib):
    png = tmp_path / "tmp.png"
    assert main([*ARGS, "--samples", "20", "--gantt", str(png)]) == 0
    out, _ = capsys.readouterr()
    assert f"wrote {png}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gantt_draws_the_median_run_not_sample_zero(tmp_path, capsys, matplotlib):
    png = tmp_path / "run.png"
    assert main([*ARGS, "--gantt", str(png), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    exp = load_experiment(PAPER_JOB)
    jct = simulate(exp.spec, [32, 20, 12, 8], exp.model, exp.cloud, samples=200, seed=exp.seed).jct_s
    assert sorted(jct).index(jct[payload["gantt_sample"]]) == 99          # the lower middle of 200
    assert payload["gantt_sample"] != 0


@pytest.mark.parametrize(("run", "rank"), [("p90", 179), ("worst", 199)])
def test_gantt_run_draws_the_run_at_that_quantile_of_jct(tmp_path, capsys, matplotlib, run, rank):
    png = tmp_path / "run.png"
    assert main([*ARGS, "--gantt", str(png), "--gantt-run", run, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    exp = load_experiment(PAPER_JOB)
    jct = simulate(exp.spec, [32, 20, 12, 8], exp.model, exp.cloud, samples=200, seed=exp.seed).jct_s
    assert sorted(jct).index(jct[payload["gantt_sample"]]) == rank and payload["gantt_run"] == run
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        (["--allocation", "1,2"], r"^error: allocation: has 2 entries but the experiment has 4 stages"),
        (["--allocation", "32,a,12,8"], r"^error: --allocation: expected comma-separated whole numbers"),
        (["--allocation", "32,20,12,64"], r"^error: allocation\[3\]: 64 GPUs for 1 trials is outside the valid range 1\.\.32"),
        (["--allocation", "32,20,12,8", "--instances", "8,5,3,1"], r"^error: instances\[3\]: 1 cannot hold stage 3"),
        (["--allocation", "32,20,12,8", "--samples", "0"], r"^error: --samples: expected a positive integer, got 0$"),
        (["--allocation", "32,20,12,8", "--deadline", "soon"], r"^error: --deadline: expected a duration"),
        (["--allocation", "32,20,12,8", "--gantt-run", "p90"], r"^error: --gantt-run: it picks the run --gantt draws; add --gantt PNG$"),
        (["--allocation", "32,20,12,8", "--instance-type", "p3.8xlarg"], r"^error: instance_type: 'p3\.8xlarg'.*did you mean `p3\.8xlarge`"),
    ],
)
def test_bad_options_give_one_error_line(capsys, extra, pattern):
    code = main(["simulate", PAPER_JOB, *extra])
    out, err = capsys.readouterr()
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in out + err


def test_a_spot_market_shows_spot_instances_and_reclaims_per_stage(tmp_path, capsys):
    exp = spot_experiment(tmp_path)
    assert main(["simulate", exp, "--allocation", "32,20,12,8", "--samples", "200", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["spot_instances"] == [8, 5, 3, 2]
    assert all(s["mean_reclaims"] > 0 for s in data["stages"])
    assert main(["simulate", exp, "--allocation", "32,20,12,8", "--samples", "200", "--spot-instances", "8,0,0,0"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"instances\s+new\s+spot\s+reclaims", out)
    # stage 1 moves from spot to on-demand: all 5 instances are new, none spot
    assert re.search(r"^\s+1\s+10\s+3\s+20\s+2\s+5\s+5\s+0\s+0\.00\s", out, re.MULTILINE)


@pytest.mark.parametrize(("extra", "pattern"), [
    (["--spot-instances", "8,0,0,9"], r"^error: spot_instances\[3\]: expected a whole number of the stage's 2 instances"),
    (["--spot-instances", "8,x"], r"^error: --spot-instances: expected comma-separated whole numbers"),
])
def test_bad_spot_options_give_one_error_line(tmp_path, capsys, extra, pattern):
    assert main(["simulate", spot_experiment(tmp_path), "--allocation", "32,20,12,8", "--samples", "20", *extra]) == 2
    err = capsys.readouterr().err
    assert re.search(pattern, err) and err.count("\n") == 1


def test_gantt_draws_a_spot_run_with_its_reclaims(tmp_path, capsys, matplotlib):
    png = tmp_path / "spot.png"
    exp = spot_experiment(tmp_path, rate_per_hour=2.0)
    assert main(["simulate", exp, "--allocation", "32,20,12,8", "--samples", "200", "--gantt", str(png), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = load_experiment(exp)
    timeline = sample_timeline(loaded.spec, [32, 20, 12, 8], loaded.model, loaded.cloud, seed=loaded.seed,
                               samples=200, sample=payload["gantt_sample"])
    assert payload["gantt_reclaims"] == timeline.reclaims > 0
