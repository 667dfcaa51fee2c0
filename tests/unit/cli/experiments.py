"""Experiment files the CLI tests write: the paper's ResNet-101 job on a spot market."""

from __future__ import annotations

from pathlib import Path

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
