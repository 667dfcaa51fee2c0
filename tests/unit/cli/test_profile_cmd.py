"""`rubberband profile`: bad input is one `error:` line (exit 2) found before any cluster starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

import rubberband.cli.profile_cmd  # noqa: F401  registers `profile`
from rubberband.cli.main import main
from rubberband.errors import SpecError
from rubberband.profiler import check_request
from rubberband.profiler.measure import gpu_counts
from rubberband.profiles import CloudProfile

from .helpers import assert_one_line_error, run

ROOT = Path(__file__).resolve().parents[3]
DEMO = str(ROOT / "experiments" / "demo.yaml")
CIFAR = str(ROOT / "experiments" / "resnet101_cifar10.yaml")


@pytest.fixture(autouse=True)
def _no_ray_started():
    """None of these may get as far as starting Ray (ray is imported only to start a cluster)."""
    had_ray = "ray" in sys.modules
    yield
    if not had_ray:
        assert "ray" not in sys.modules


@pytest.mark.parametrize("argv, needles", [
    (["--iters", "0"], ["--iters", "at least 1"]),
    (["--repeats", "0"], ["--repeats", "at least 1"]),
    (["--gpus", "8"], ["--gpus: 8 GPUs per trial cannot fit on local.1gpu (1 GPUs per instance)"]),
    (["--gpus", "abc"], ["--gpus", "'abc'"]),
    (["--gpus", "0"], ["--gpus", "at least 1"]),
    (["--gpus", ","], ["--gpus"]),
    (["--provider", "gcp"], ["--provider", "unknown provider 'gcp'", "local"]),
    (["--provider", "locl"], ["did you mean `local`"]),
    (["--max-seconds", "soon"], ["--max-seconds"]),
    (["--max-seconds", "-5"], ["--max-seconds"]),
    (["--max-fused", "0"], ["--max-fused: must be a whole number of trials of at least 1 (1: no fusion), got 0"]),
    (["--max-fused", "-2"], ["--max-fused", "at least 1"]),
    (["--max-fused", "eight"], ["--max-fused", "expected a whole number", "'eight'"]),
])
def test_bad_options_are_one_line_errors(capsys, argv, needles):
    code, out, err = run(capsys, "profile", DEMO, *argv)
    assert code == 2 and out == ""
    assert_one_line_error(err, *needles)


def test_an_experiment_without_a_trainer_cannot_be_profiled(capsys):
    code, _, err = run(capsys, "profile", CIFAR)
    assert code == 2
    assert_one_line_error(err, "trainer")


def test_a_missing_experiment_file_is_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "profile", str(tmp_path / "nope.yaml"))
    assert code == 2
    assert_one_line_error(err, "nope.yaml")


def test_a_trainer_that_cannot_be_imported_is_caught_before_starting(capsys, tmp_path):
    data = yaml.safe_load(Path(DEMO).read_text())
    data.update(model_profile=str(ROOT / "profiles" / "demo_digits_local.yaml"), trainer="no_such_module:Trainer")
    data["cloud"]["profile"] = str(ROOT / "cloud_profiles" / "local" / "local.yaml")
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    code, _, err = run(capsys, "profile", str(path))
    assert code == 2
    assert_one_line_error(err, "trainer", "no_such_module")


def test_profile_is_listed_with_its_options(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "--help"])
    out = capsys.readouterr().out
    for option in ("--provider", "--gpus", "--iters", "--repeats", "--max-seconds", "--out", "--cloud-out", "--json",
                   "--max-fused"):
        assert option in out


@pytest.mark.parametrize("G, requested, expected", [
    (2, None, (1, 2)), (4, None, (1, 2, 4)), (1, None, (1,)), (8, [4], (1, 2, 4)), (8, 2, (1, 2)),
    (8, [1, 2], (1, 2)), (4, [3], (1, 2, 3)), (8, [8, 1], (1, 2, 4, 8)),
])
def test_gpu_counts_are_powers_of_two_up_to_the_largest_asked(G, requested, expected):
    cloud = CloudProfile(instance_type="x", gpus_per_instance=G, price_usd_per_hour=1.0)
    assert gpu_counts(requested, cloud) == expected


def test_the_python_api_checks_the_same_way():
    with pytest.raises(SpecError, match="--iters"):
        check_request(DEMO, iters=0)
    with pytest.raises(SpecError, match="launches"):
        check_request(DEMO, launches=1)
    req = check_request(DEMO, gpus=[1], iters=2, repeats=1, max_seconds=60)
    assert req.gpu_counts == (1,) and req.cloud.instance_type == "local.1gpu" and req.max_seconds == 60.0


def test_profile_refuses_to_overwrite_an_existing_profile_without_force(capsys, tmp_path):
    # issue 21: `profile --out profiles/x.yaml` silently replaced a shipped profile with a partial one.
    shipped = tmp_path / "shipped.yaml"
    shipped.write_text("name: shipped\n")
    code, out, err = run(capsys, "profile", DEMO, "--out", str(shipped))
    assert code == 2 and out == ""
    assert_one_line_error(err, f"--out: {shipped} exists", "--force")
    assert shipped.read_text() == "name: shipped\n"
    cloud = tmp_path / "fresh.cloud.yaml"
    cloud.write_text("{}\n")
    code, _, err = run(capsys, "profile", DEMO, "--out", str(tmp_path / "fresh.yaml"))
    assert code == 2
    assert_one_line_error(err, f"--cloud-out: {cloud} exists", "--force")
    # --force lets it write: the next check (the time bound) is what stops it here.
    code, _, err = run(capsys, "profile", DEMO, "--out", str(shipped), "--force", "--max-seconds", "1s")
    assert code == 2
    assert_one_line_error(err, "--max-seconds")


def test_profile_refuses_a_time_bound_below_one_measurement(capsys, tmp_path):
    code, out, err = run(capsys, "profile", DEMO, "--out", str(tmp_path / "p.yaml"), "--max-seconds", "1s")
    assert code == 2 and out == ""
    # 2 launches of local.1gpu (2s provisioning + 11.5s initialisation each), one of two together
    # (local: the contention of instances sharing this machine) and one repeat of 1 GPU per trial.
    assert_one_line_error(err, "--max-seconds: 1s is below the", "one measurement needs",
                          "2 instance launches and one of two instances together", "give at least")
    needed = check_request(DEMO).min_seconds
    assert 27 < needed < 60
    with pytest.raises(SpecError, match="--max-seconds"):
        check_request(DEMO, max_seconds=needed * 0.9)
    assert check_request(DEMO, max_seconds=needed * 1.1).max_seconds == pytest.approx(needed * 1.1)


@pytest.mark.parametrize("argv, expected", [([], 1), (["--max-fused", "8"], 8)])
def test_max_fused_reaches_the_profiler(capsys, monkeypatch, tmp_path, argv, expected):
    import rubberband.profiler as profiler

    seen = {}

    def fake_profile(exp, **kwargs):
        seen.update(kwargs)
        raise SpecError("stop here")

    monkeypatch.setattr(profiler, "profile", fake_profile)
    code, _, err = run(capsys, "profile", DEMO, "--out", str(tmp_path / "p.yaml"), *argv)
    assert code == 2 and "stop here" in err
    assert seen["max_fused"] == expected and seen["max_packing"] == 8
