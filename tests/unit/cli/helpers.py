"""What the CLI tests share: running a command, the one-line error check, experiment files they write."""

from __future__ import annotations

from pathlib import Path

from rubberband.cli.main import main

ROOT = Path(__file__).resolve().parents[3]


def spot_experiment(tmp_path: Path, market: str = "spot", rate_per_hour: float = 0.5, region: Path | None = None) -> str:
    """SHA(32, 1, 50, 3) on p3.8xlarge whose spot instances are reclaimed at ``rate_per_hour``."""
    path = tmp_path / "spot.yaml"
    path.write_text(f"""
sha: {{num_trials: 32, min_iters: 1, max_iters: 50, eta: 3}}
model_profile: {ROOT / 'profiles' / 'resnet101_cifar10_p3.yaml'}
cloud:
  profile: {region or ROOT / 'cloud_profiles' / 'aws' / 'us-east-1.yaml'}
  instance_type: p3.8xlarge
  market: {market}
  overrides: {{init_latency_s: {{dist: constant, value: 15}}, spot: {{notice_s: 120, preemption: {{rate_per_hour: {rate_per_hour}}}}}}}
deadline: 20m
samples: 100
""")
    return str(path)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``rubberband ARGV`` in process: exit code, stdout, stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *needles: str) -> None:
    """``err`` is one ``error: ...`` line, no traceback, containing every needle."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
