"""Warnings that one command printed and another did not (issue 21, item 8): each is found when
the experiment is resolved (`rubberband.request`), so every command that reads it says it once."""

from __future__ import annotations

from pathlib import Path

import pytest

from .helpers import ROOT, run

CIFAR = ROOT / "experiments" / "resnet101_cifar10.yaml"
DEMO = ROOT / "experiments" / "demo.yaml"


def _cifar(tmp_path: Path, cloud: str, region: str = "us-east-1", deadline: str = "20m") -> str:
    """CIFAR's job (50 samples) with this ``cloud:`` block under ``instance_type: p3.8xlarge``."""
    path = tmp_path / "exp.yaml"
    path.write_text(f"""
sha: {{num_trials: 32, min_iters: 1, max_iters: 50, eta: 3}}
model_profile: {ROOT / 'profiles' / 'resnet101_cifar10_p3.yaml'}
cloud:
  profile: {ROOT / 'cloud_profiles' / 'aws' / f'{region}.yaml'}
  instance_type: p3.8xlarge
{cloud}
deadline: {deadline}
samples: 50
""")
    return str(path)


COMMANDS = {
    "validate": ["validate"],
    "plan": ["plan"],
    "simulate": ["simulate", "--allocation", "32,12,12,4"],
    "run": ["run", "--provider", "sim"],
}


def _warned(capsys, argv: list[str], path: str, needle: str) -> None:
    code, _, err = run(capsys, argv[0], path, *argv[1:])
    assert code == 0, err
    lines = [line for line in err.splitlines() if needle in line]
    assert len(lines) == 1 and lines[0].startswith("warning: "), err


@pytest.mark.parametrize("command", ["plan", "run"])     # the experiment's own `market: spot`: test_request
def test_spot_asked_for_on_the_command_line_without_a_preemption_model(capsys, command):
    _warned(capsys, [*COMMANDS[command], "--market", "spot"], str(CIFAR), "spot instances are modelled as never reclaimed")


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_notice_longer_than_the_mean_lifetime(capsys, tmp_path, command):
    path = _cifar(tmp_path, "  market: spot\n  overrides: {spot: {notice_s: 900, preemption: {rate_per_hour: 6}}}",
                  deadline="2h")
    _warned(capsys, COMMANDS[command], path, "a 900s notice is longer than a spot instance's mean lifetime (600s")


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_trace_zone_of_another_region_priced_at_this_ones(capsys, tmp_path, command):
    trace = ROOT / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json"
    path = _cifar(tmp_path, f"  market: spot\n  overrides: {{spot: {{preemption: {{trace: {{file: {trace}, "
                            f"zone: us-west-2a}}}}}}}}")
    _warned(capsys, COMMANDS[command], path, "zone us-west-2a is in us-west-2, not us-east-1")


def test_plan_zone_of_another_region_warns(capsys, tmp_path):
    trace = ROOT / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json"
    path = _cifar(tmp_path, f"  market: spot\n  overrides: {{spot: {{preemption: {{trace: {{file: {trace}, "
                            f"zone: us-east-1a}}}}}}}}")
    _warned(capsys, ["plan", "--zone", "us-east-1a,us-west-2b", "--deadline", "1h"], path,
            "zone us-west-2b is in us-west-2, not us-east-1")


def test_instances_held_idle(capsys):
    # SHA(32) on p3.8xlarge (4 GPUs): 8, 3, 1, 1 instances carry 32,12,4,4 GPUs; the 20 of the last stage idle.
    _warned(capsys, ["simulate", "--allocation", "32,12,4,4", "--instances", "8,5,3,20"], str(CIFAR),
            "--instances: stage 1 holds 5 instances but uses 3")


def test_spot_emulation_max_0_is_a_no_op(capsys, tmp_path, no_execution):
    spot = _demo_spot(tmp_path)
    code, _, err = run(capsys, "run", spot, "--provider", "local", "--spot-emulation", "max=0")
    assert "stopped before execution" in err
    assert err.count("warning: --spot-emulation: max=0 reclaims nothing") == 1, err


def _demo_spot(tmp_path: Path) -> str:
    path = tmp_path / "demo_spot.yaml"
    text = DEMO.read_text().replace("../", f"{ROOT}/").replace(
        "instance_type: local.2gpu", "instance_type: local.2gpu\n  market: spot\n"
        "  overrides: {spot_price_usd_per_hour: 0.6, spot: {notice_s: 5, preemption: {rate_per_hour: 2}}}")
    path.write_text(text)
    return str(path)
