"""The profiler's output paths: measurements go under the runs directory, never into shipped files;
and the INIT of instances launched together (the local provider's contention)."""

import inspect
import math
import subprocess
from types import SimpleNamespace
from pathlib import Path

import pytest

from rubberband.config import load_experiment
from rubberband.profiler import measure
from rubberband.profiler.measure import _Measurement, contention_s, output_paths, shares_machine
from rubberband.profiles import Constant, Normal
from rubberband.providers.base import ProviderEvent

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


def test_contention_is_how_much_later_a_pair_is_ready_than_two_independent_inits():
    # Two independent INITs of N(4, 0.5) are both done after E[max] = 4 + 0.5 / sqrt(pi) ~ 4.28 s;
    # a pair measured ready 5.3 s after running initialised ~1.0 s slower each.
    assert contention_s(Normal(4.0, 0.5), [5.3, 5.3]) == pytest.approx(5.3 - (4 + 0.5 / math.pi ** 0.5), abs=0.02)
    assert contention_s(Constant(4.0), [5.0, 5.5]) == pytest.approx(1.25)
    assert contention_s(Constant(4.0), [3.5, 3.9]) == 0.0            # never negative
    assert contention_s(Constant(4.0), [9.0, 13.0]) == 4.0           # at most twice one alone: more is load from elsewhere
    assert shares_machine("local") and not shares_machine("aws") and not shares_machine("sim")


def test_cloud_samples_tell_instances_launched_together_from_those_launched_alone():
    # The profiler launches instances one at a time, then (local) two at once: each INIT
    # sample carries how many were launched together, so that init_latency_s is fitted from
    # the launches alone and init_contention_s from the pair.
    events = [{"instance": inst, "event": ev, "t": t} for inst, ev, t in [
        ("rb-instance-1", ProviderEvent.REQUEST, 1.0), ("rb-instance-1", ProviderEvent.RUNNING, 3.0),
        ("rb-instance-2", ProviderEvent.REQUEST, 21.0), ("rb-instance-2", ProviderEvent.RUNNING, 23.0),
        ("rb-instance-3", ProviderEvent.REQUEST, 41.0), ("rb-instance-4", ProviderEvent.REQUEST, 41.0),
        ("rb-instance-3", ProviderEvent.RUNNING, 43.0), ("rb-instance-4", ProviderEvent.RUNNING, 43.1)]]
    m = object.__new__(_Measurement)
    m.session = SimpleNamespace(read_events=lambda: events)
    m.asked = [0.5, 20.5, 40.5]
    m.first_trials = {}
    m.warmed, m.together = {}, {}
    for stage, (fresh, warm_at) in enumerate([(["rb-instance-1"], 7.0), (["rb-instance-2"], 27.0),
                                              (["rb-instance-3", "rb-instance-4"], 48.5)]):
        m._on_event("nodes", {"instances": fresh, "at": warm_at})
        for inst in fresh:
            m.together[inst] = len(fresh)
    out = m.cloud_samples(hot_short_s=0.1)
    assert out["together"] == [1.0, 1.0, 2.0, 2.0]
    assert out["init"] == pytest.approx([4.0, 4.0, 5.5, 5.4])
    assert out["provision"] == pytest.approx([2.5, 2.5, 2.5, 2.6])
