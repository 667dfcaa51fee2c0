"""The profiler's output paths: measurements go under the runs directory, never into shipped files."""

import inspect
import subprocess
from pathlib import Path

from rubberband.config import load_experiment
from rubberband.profiler import measure
from rubberband.profiler.measure import output_paths

ROOT = Path(__file__).resolve().parents[3]


def test_default_outputs_go_under_the_runs_directory(tmp_path):
    out, cloud = output_paths("demo-digits", "local.2gpu", runs_dir=tmp_path / "runs")
    assert out == tmp_path / "runs" / "profiles" / "demo-digits_local.2gpu.yaml"
    assert cloud == tmp_path / "runs" / "profiles" / "demo-digits_local.2gpu.cloud.yaml"


def test_explicit_outputs_are_kept_and_cloud_overrides_can_be_skipped(tmp_path):
    out, cloud = output_paths("x", "t", out=tmp_path / "m.yaml", runs_dir=tmp_path / "runs")
    assert (out, cloud) == (tmp_path / "m.yaml", tmp_path / "m.cloud.yaml")
    assert output_paths("x", "t", out=tmp_path / "m.yaml", cloud_out=tmp_path / "c.yaml") == \
        (tmp_path / "m.yaml", tmp_path / "c.yaml")
    assert output_paths("x", "t", cloud_out=False, runs_dir="runs")[1] is None


def test_profiling_the_demo_writes_no_shipped_file():
    """What the demo profiles (experiments/demo.yaml, from the repository root) lands in the
    git-ignored runs/ folder, not on its model profile or region file."""
    exp = load_experiment(ROOT / "experiments" / "demo.yaml")
    written = [p for p in output_paths(exp.name, exp.instance_type, runs_dir=ROOT / "runs") if p is not None]
    tracked = {(ROOT / f).resolve() for f in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True,
                                                            text=True, check=True).stdout.split()}
    assert (ROOT / "profiles" / "demo_digits_local.yaml").resolve() in tracked   # the check below can see them
    assert Path(exp.catalog.path).resolve() in tracked
    for path in written:
        assert path.resolve().is_relative_to(ROOT / "runs") and path.resolve() not in tracked
        ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT)
        assert ignored.returncode == 0, f"{path} is not git-ignored"
    # and there is no way left to write into the experiment's region file
    assert "update_region" not in inspect.signature(measure.profile).parameters
    assert not hasattr(measure, "_update_region")
