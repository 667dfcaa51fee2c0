"""`rubberband whatif --packing 1,2,4`: cost per packing limit, the trials per GPU chosen, the plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import assert_one_line_error, run

ROOT = Path(__file__).resolve().parents[3]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def packed_experiment(tmp_path: Path, memory_gb: float = 3.0) -> str:
    """SHA(256, 1, 64, 4) on p3.2xlarge; four packed trials take 2.2x one trial's time each."""
    (tmp_path / "m.yaml").write_text(f"""
name: packed
measured_on: {{instance_type: p3.16xlarge}}
gpu_memory_gb_per_trial: {memory_gb}
iter_latency_s:
  1: {{dist: normal, mean: 12.0, std: 1.2}}
  2: {{dist: normal, mean: 6.3, std: 0.63}}
  4: {{dist: normal, mean: 3.45, std: 0.345}}
  8: {{dist: normal, mean: 2.025, std: 0.2}}
packed_iter_latency_s:
  2: {{dist: normal, mean: 15.6, std: 1.56}}
  4: {{dist: normal, mean: 26.4, std: 2.64}}
trial_startup_s: {{dist: constant, value: 5}}
sync_s: {{dist: constant, value: 1}}
""")
    path = tmp_path / "exp.yaml"
    path.write_text(f"""
name: packed-sha256
sha: {{num_trials: 256, min_iters: 1, max_iters: 64, eta: 4}}
model_profile: m.yaml
cloud: {{profile: {ROOT / 'cloud_profiles' / 'aws' / 'us-east-1.yaml'}, instance_type: p3.2xlarge}}
deadline: 1h
samples: 60
""")
    return str(path)


def test_whatif_packing_table_json_and_plot(capsys, tmp_path):
    exp = packed_experiment(tmp_path)
    code, out, err = run(capsys, "whatif", exp, "--packing", "1,2,4", "--policies", "static,optimal")
    assert code == 0, err
    assert "packing (trials/GPU)" in out and "optimal trials/GPU" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1] in ("1", "2", "4")]
    assert [r[0] for r in rows] == ["1", "2", "4"]
    assert rows[0][-1] == "-" and rows[2][-1] == "4,4,4,4"
    png = tmp_path / "packing.png"
    code, out, err = run(capsys, "whatif", exp, "--packing", "1,4", "--policies", "optimal", "--json", "--plot", str(png))
    assert code == 0, err
    data = json.loads(out)
    one, four = data["scenarios"]
    assert one["trials_per_gpu"]["optimal"] is None and 4 in four["trials_per_gpu"]["optimal"]
    assert one["cost_usd"]["optimal"] >= 1.3 * four["cost_usd"]["optimal"]
    assert png.read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize(("argv", "memory_gb", "needle"), [
    (["--packing", "1,3"], 3.0, "packing: 3 trials per GPU has no packed latency in model profile 'packed'"),
    (["--packing", "0,2"], 3.0, "packing: trials per GPU must be whole numbers of at least 1"),
    (["--packing", "2.5"], 3.0, "--packing: expected comma-separated whole numbers of trials per GPU"),
    (["--packing", "2,4"], 6.0, "packing: 4 trials of 6 GB do not fit the 16 GB GPU of p3.2xlarge"),
])
def test_bad_packing_sweeps_are_one_line(capsys, tmp_path, argv, memory_gb, needle):
    code, _, err = run(capsys, "whatif", packed_experiment(tmp_path, memory_gb), *argv)
    assert code != 0
    assert_one_line_error(err, needle)


def test_packing_on_a_profile_without_packed_latencies_is_one_line(capsys):
    code, _, err = run(capsys, "whatif", str(ROOT / "experiments" / "resnet101_cifar10.yaml"), "--packing", "1,2")
    assert code != 0
    assert_one_line_error(err, "packing: 2 trials per GPU has no packed latency", "(profiled: 1)")
