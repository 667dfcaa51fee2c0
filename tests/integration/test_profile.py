"""The profiler on the local provider: it writes profiles that load and plan (both GPU counts,
packed and fused latencies too), and a failing trainer is one clear error with no cluster left
behind. A profiled run meeting its prediction is tested in test_cli_run.py."""

import os
import shutil
import statistics

import pytest
import yaml

import rubberband as rb
import rubberband.cli.profile_cmd  # noqa: F401  registers `profile`
from rubberband.cli.main import main
from rubberband.profiler import check_request, profile

from .conftest import ROOT, trainer

pytestmark = pytest.mark.integration


def _experiment(tmp_path, trainer_ref, region=None, **changes):
    """experiments/demo.yaml with absolute paths (and another trainer, region file, ...)."""
    data = yaml.safe_load((ROOT / "experiments" / "demo.yaml").read_text())
    data["model_profile"] = str(ROOT / "profiles" / "demo_digits_local.yaml")
    data["cloud"]["profile"] = str(region or ROOT / "cloud_profiles" / "local" / "local.yaml")
    data["cloud"]["instance_type"] = "local.2gpu"      # 2 GPUs per trial are profiled too
    data["trainer"] = trainer_ref
    data.update(changes)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_profile_writes_a_model_profile_and_cloud_overrides_that_load(tmp_path):
    region = tmp_path / "local.yaml"
    shutil.copy(ROOT / "cloud_profiles" / "local" / "local.yaml", region)
    exp = _experiment(tmp_path, trainer("Tiny"), region=region)
    out = tmp_path / "profiles" / "tiny.yaml"
    # The least budget it accepts (issue 21: less is refused): one repeat of the first GPU count,
    # and the two launches, are all it does.
    # The region expects a 0.5 s INIT, far below a real Ray node's start: the least budget then
    # ends inside the first repeat however fast this machine is, so stopping early is certain.
    text = region.read_text()
    init = yaml.safe_load(text)["defaults"]["init_latency_s"]
    assert f"mean: {init['mean']}" in text
    region.write_text(text.replace(f"mean: {init['mean']}", "mean: 0.5", 1))
    shipped = region.read_text()
    least = check_request(exp, gpus=[1, 2], iters=2, repeats=3).min_seconds
    result = profile(exp, gpus=[1, 2], iters=2, repeats=3, max_seconds=least, out=out, runs_dir=tmp_path / "runs")

    assert result.stopped_early and result.gpu_counts == (1,) and result.skipped_gpus == (2,)
    assert "stopped early" in result.notes[0] and "2 not measured" in result.notes[0]
    assert result.packing is None and "packing not measured" in result.notes[0]
    model = rb.ModelProfile.load(out)
    assert model.gpu_counts == (1,) and model.packed_iter_latency_s == {}
    assert model.measured_on["provider"] == "local" and model.measured_on["instance_type"] == "local.2gpu"
    assert model.measured_on["gpu_model"] == "logical"
    prof = model.extra["profiling"]
    assert prof["stopped_early"] is True and prof["repeats_done"] == {1: 1}
    assert prof["cost_usd"] > 0 and prof["seconds"] > 0
    assert len(prof["samples"]["iter_latency_s"][1]) == 4            # 1 repeat x 2G queued trials
    assert len(prof["samples"]["cloud"]["init_latency_s"]) == 2         # the launches of one alone
    assert len(prof["samples"]["cloud"]["init_two_together_s"]) == 2    # local: then two launched together
    assert model.extra["rubberband_version"] == rb.__version__ and model.extra["global_batch_size"] == 32

    overrides = yaml.safe_load((tmp_path / "profiles" / "tiny.cloud.yaml").read_text())
    assert set(overrides) == {"provision_latency_s", "init_latency_s", "init_contention_s"}
    assert overrides["init_contention_s"] >= 0
    cloud = rb.CloudCatalog.load(ROOT / "cloud_profiles" / "local" / "local.yaml").with_overrides(overrides).get("local.2gpu")
    assert cloud.init_latency_s.mean == pytest.approx(result.init_latency_s.mean)
    assert 1.0 < cloud.provision_latency_s.mean < 4.0                 # the provider emulates N(2, 0.3)
    assert region.read_text() == shipped                             # the experiment's own files stay as they were

    assert result.cost_usd == pytest.approx(prof["cost_usd"], abs=1e-6)
    assert result.cost_usd >= 4 * 60 * 2.0 / 3600 - 1e-9             # four instances, each billed >= 60 s at $2/h
    text = result.table()
    assert "profiling took" in text and "and cost $" in text and "GPUs/trial" in text


def test_profile_measures_both_gpu_counts_packing_and_fusion_into_a_profile_that_plans(tmp_path):
    """The demo job profiled at 1 and 2 GPUs per trial, packed and fused: every measurement is in
    the profile it writes, which loads and plans. That a run of such a plan meets its prediction
    is `test_cli_run.py::test_profiled_run_meets_its_prediction_and_reports_the_best_trial`'s to
    show (profiled as scripts/demo profiles, then run through the CLI)."""
    exp_path = _experiment(tmp_path, "rubberband.examples.digits:DigitsMLP")
    lines: list[str] = []
    result = profile(exp_path, iters=4, repeats=2, out=tmp_path / "demo.yaml", runs_dir=tmp_path / "runs",
                     max_packing=2, max_fused=4, on_progress=lines.append)
    exp = rb.load_experiment(exp_path)
    model = rb.ModelProfile.load(result.out)
    assert model.gpu_counts == (1, 2) and model.extra["profiling"]["repeats_done"] == {1: 2, 2: 2}
    check_packed_latencies(model, result)
    check_fused_latencies(model, lines)
    overrides = yaml.safe_load(open(result.cloud_out))
    cloud = exp.catalog.with_overrides(overrides).get(exp.instance_type)
    plan = rb.compile_plan(exp.spec, model, cloud, 3600, samples=100, seed=exp.seed)
    assert plan.predicted.mean_jct_s > 0 and len(plan.allocation) == exp.spec.num_stages()


def check_packed_latencies(model, result):
    """k = 1 and 2 trials on each of the 2 logical GPUs, all at once: 2 and 4 samples; the
    written latency is the k = 2 one. The GPUs are the host's CPUs and each worker trains on
    one thread: on 2 cores, 4 workers cannot beat 2 by much."""
    packing = model.extra["profiling"]["packing"]
    assert packing["mode"] == "logical" and result.packing.mode == "logical"
    assert [c.k for c in result.packing.counts] == [1, 2]
    samples = model.extra["profiling"]["samples"]["packed_iter_latency_s"]
    assert len(samples[1]) == 2 and len(samples[2]) == 4
    assert model.packing_counts == (1, 2) and model.gpu_memory_gb_per_trial is None
    # Scaled so that the packed measurement's k = 1 is the solo latency the profile writes: the
    # planner compares the two, and only the measured throughput ratio may make it pack.
    scale = statistics.fmean(model.extra["profiling"]["samples"]["iter_latency_s"][1]) / result.packing.counts[0].mean_s
    assert packing["scaled_by"] == pytest.approx(scale, rel=1e-3)
    assert model.packed_latency(2).mean == pytest.approx(result.packing.counts[1].mean_s * scale, rel=1e-3)
    assert model.packed_latency(2).mean / model.latency(1).mean == pytest.approx(
        result.packing.counts[1].mean_s / result.packing.counts[0].mean_s, rel=0.05)
    gain = packing["throughput_vs_alone"][2]
    print(f"\npacking on {os.cpu_count()} cores: 2 per logical GPU gives {gain:.2f}x the throughput of 1 "
          f"({result.packing.counts[0].mean_s:.4f}s -> {result.packing.counts[1].mean_s:.4f}s per iteration); "
          f"stopped: {result.packing.stopped}")
    if (os.cpu_count() or 1) <= 2:
        assert gain < 1.3
    assert "packed 1-GPU trials (logical" in result.table()


def check_fused_latencies(model, lines):
    """Fused groups of F = 1, 2, 4 at most, each measured over the profile's 4 group iterations,
    scaled as the packed latencies are; the profile it writes loads with them."""
    fusion = model.extra["profiling"]["fusion"]
    sizes = sorted(fusion["samples"])
    assert sizes[0] == 1 and set(model.fused_iter_latency_s) == set(sizes) and max(sizes) <= 4
    assert all(len(fusion["samples"][F]) == 4 for F in sizes)
    assert fusion["forward"] == "batched" and fusion["optimizer"] == "FusedSGD" and fusion["stopped"]
    assert fusion["scaled_by"] > 0 and set(fusion["throughput_vs_alone"]) == set(sizes)
    if len(sizes) >= 2:
        assert set(model.fused_memory_gb) == set(sizes) and "memory_fit" in fusion
    assert any(line.startswith("fusion 1 trial(s) in one program") for line in lines)
    assert any(line.startswith("fusion stopped:") for line in lines)
    print("\n" + "\n".join(line for line in lines if line.startswith("fusion")))


def test_a_failing_trainer_is_one_clear_error_and_the_cluster_is_stopped(tmp_path, capsys):
    exp = _experiment(tmp_path, trainer("Failing"))
    code = main(["profile", str(exp), "--gpus", "1", "--iters", "1", "--repeats", "1",
                 "--out", str(tmp_path / "p.yaml"), "--runs-dir", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2
    last = err.strip().splitlines()[-1]      # progress lines come first
    assert last.startswith("error: ") and "Failing" in last and "boom: this trainer cannot build its model" in last
    assert "Traceback" not in err
    assert not (tmp_path / "p.yaml").exists()
    # conftest checks that no cluster is left running
