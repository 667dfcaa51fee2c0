"""One resolution of an experiment (issue 21, item 3): every command reads the experiment file
and its flags through `rubberband.request.resolve`, so they agree on the market, the confidence,
the deadline and the warnings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rubberband.cli.main import main
from rubberband.errors import SpecError
from rubberband.profiles.cloud import Market
from rubberband.request import Overrides, resolve

from .helpers import assert_one_line_error, run

ROOT = Path(__file__).resolve().parents[3]
SPOT = str(ROOT / "experiments" / "resnet101_spot.yaml")
CIFAR = str(ROOT / "experiments" / "resnet101_cifar10.yaml")
DEMO = str(ROOT / "experiments" / "demo.yaml")


def test_resolve_keeps_the_experiments_market_and_confidence_unless_a_flag_says_otherwise():
    req = resolve(SPOT)
    assert (req.market, req.confidence, req.deadline_s, req.samples) == ("auto", 0.9, 7200.0, 400)
    req = resolve(SPOT, Overrides(market="spot", confidence=0.5, deadline="1h", samples=20, seed=3))
    assert (req.market, req.confidence, req.deadline_s, req.samples, req.seed) == (Market.SPOT, 0.5, 3600.0, 20, 3)
    assert req.cloud.market is Market.SPOT


def test_a_budget_without_a_deadline_flag_plans_no_deadline_and_says_so(capsys):
    assert resolve(CIFAR, Overrides(budget_usd=20.0)).deadline_s is None
    assert resolve(CIFAR, Overrides(budget_usd=20.0, deadline="30m")).deadline_s == 1800.0
    code, _, err = run(capsys, "plan", CIFAR, "--samples", "50", "--budget", "20")
    assert code == 0, err
    assert "warning: --budget plans the shortest job within $20: the experiment's deadline 20m00s is not kept" in err


def test_a_plan_with_neither_deadline_nor_budget_is_one_line_naming_the_flag(capsys, tmp_path):
    exp = tmp_path / "no_deadline.yaml"
    exp.write_text(Path(CIFAR).read_text().replace("../", f"{ROOT}/").replace("deadline: 20m\n", ""))
    code, _, err = run(capsys, "plan", str(exp), "--samples", "20")
    assert code == 2
    assert_one_line_error(err, "deadline: the experiment has no `deadline:`; pass --deadline")


@pytest.mark.parametrize("market", ["spt", "Spot"])
def test_an_unknown_market_is_one_line_naming_the_choices(market):
    with pytest.raises(SpecError, match="--market: unknown value .* choose one of on-demand, spot, auto"):
        resolve(CIFAR, Overrides(market=market))


def test_validate_prints_the_job_as_resolved(capsys):
    code, out, err = run(capsys, "validate", SPOT)
    assert code == 0, err
    assert "market         auto (spot or on-demand per stage)" in out
    assert "spot model     replayed availability trace of zone us-west-2a (the zone goes at once: no notice)" in out
    assert "zone           us-west-2a" in out
    assert "deadline       2h00m00s (7200s), P(meet) >= 0.9" in out
    assert "market on-demand" not in out
    code, out, _ = run(capsys, "validate", SPOT, "--json")
    payload = json.loads(out)
    assert (payload["market"], payload["confidence"], payload["zone"]) == ("auto", 0.9, "us-west-2a")


def test_whatif_plans_with_the_experiments_market_and_confidence(capsys):
    # `plan` and a one-scenario `whatif` of the same job agree: both spot or on-demand per stage at P >= 0.9.
    code, out, err = run(capsys, "plan", SPOT, "--samples", "100", "--policy", "greedy", "--json")
    assert code == 0, err
    planned = json.loads(out)["predicted"]["cost_usd_mean"]
    code, out, err = run(capsys, "whatif", SPOT, "--samples", "100", "--policies", "greedy", "--init-latency", "15s",
                         "--json")
    assert code == 0, err
    (scenario,) = json.loads(out)["scenarios"]
    assert scenario["cost_usd"]["greedy"] == pytest.approx(planned, rel=1e-9)


def _never_reclaimed(tmp_path: Path) -> str:
    path = tmp_path / "spot.yaml"
    path.write_text(_cifar_on(Path(CIFAR), "spot"))
    return str(path)


def _cifar_on(path: Path, market: str) -> str:
    """CIFAR's experiment on ``market`` with absolute paths, no preemption model, 50 samples."""
    text = path.read_text().replace("../", f"{ROOT}/").replace("samples: 1000", "samples: 50")
    return text.replace("instance_type: p3.8xlarge", f"instance_type: p3.8xlarge\n  market: {market}")


NEVER = "spot instances are modelled as never reclaimed"


@pytest.mark.parametrize("argv", [
    ["validate"],
    ["plan"],
    ["simulate", "--allocation", "32,12,12,4"],
    ["whatif", "--deadline", "20m:30m:10m", "--policies", "optimal"],
    ["run", "--provider", "sim"],
])
def test_every_command_warns_of_spot_modelled_as_never_reclaimed(capsys, tmp_path, argv):
    path = _never_reclaimed(tmp_path)
    code, _, err = run(capsys, argv[0], path, *argv[1:])
    assert code == 0, err
    assert err.count(NEVER) == 1, err


@pytest.mark.parametrize("flags", [
    ["--deadline", "30m"], ["--policy", "greedy"], ["--samples", "20"], ["--allocation", "32,12,12,4"],
    ["--market", "spot"], ["--confidence", "0.9"], ["--instance-type", "p3.16xlarge"],
])
def test_run_refuses_planning_flags_beside_a_plan_file(capsys, tmp_path, flags):
    plan = tmp_path / "plan.json"
    assert main(["plan", DEMO, "--samples", "50", "--out", str(plan)]) == 0
    capsys.readouterr()
    code, out, err = run(capsys, "run", DEMO, "--plan", str(plan), "--provider", "sim", *flags)
    assert code == 2 and out == ""
    assert_one_line_error(err, f"{flags[0]}: only used when run plans the job", "drop --plan")


def test_run_prints_the_plans_warnings_as_plan_does(capsys, tmp_path):
    path = tmp_path / "spot.yaml"
    path.write_text(_cifar_on(Path(CIFAR), "auto"))
    _, _, planned = run(capsys, "plan", str(path))
    _, _, ran = run(capsys, "run", str(path), "--provider", "sim")
    warnings = [line for line in planned.splitlines() if line.startswith("warning: ")]
    assert warnings and warnings == [line for line in ran.splitlines() if line.startswith("warning: ")]


def test_baselines_are_priced_on_the_chosen_markets(capsys):
    code, out, err = run(capsys, "plan", CIFAR, "--samples", "100", "--market", "auto", "--json")
    assert code == 0, err
    plan = json.loads(out)
    chosen = plan["predicted"]["cost_usd_mean"]
    baselines = {c["policy"]: c for c in plan["considered"] if c["policy"] in ("static", "greedy", "naive-elastic")}
    assert set(baselines) == {"static", "greedy", "naive-elastic"}
    for row in baselines.values():
        assert row["market"] == "spot"
        # On-demand is about 8x spot here: a baseline priced on-demand would read several times dearer.
        assert chosen * 0.99 <= row["cost_usd_mean"] < 2.5 * chosen
