"""The packed measurement's stopping rule and values, and `--max-packing` checked before any cluster starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import rubberband.cli.profile_cmd  # noqa: F401  registers `profile`
from rubberband.errors import SpecError
from rubberband.profiler import check_request
from rubberband.profiler.packing import MIN_GAIN, PackedCount, PackingResult, next_count

from ..cli.helpers import assert_one_line_error, run

ROOT = Path(__file__).resolve().parents[3]
DEMO = str(ROOT / "experiments" / "demo.yaml")


def count(k: int, seconds: float, peak: float | None = None) -> PackedCount:
    return PackedCount(k, (seconds * 0.9, seconds * 1.1), peak)


def test_it_starts_alone_and_doubles_while_throughput_rises():
    assert next_count([], 8) == (1, "")
    assert next_count([count(1, 1.0)], 8) == (2, "")
    assert next_count([count(1, 1.0), count(2, 1.2)], 8) == (4, "")          # 1.67x the throughput


def test_it_stops_when_throughput_stops_rising():
    # Two trials per GPU each twice as slow: no more iterations per GPU-second (a CPU's logical GPUs).
    k, why = next_count([count(1, 1.0), count(2, 2.0)], 8)
    assert k is None and why.startswith("throughput stopped rising: 2 per GPU gives +0% over 1")
    # Just under the threshold still stops; just over goes on.
    assert next_count([count(1, 1.0), count(2, 2 / (1 + MIN_GAIN) + 1e-6)], 8)[0] is None
    assert next_count([count(1, 1.0), count(2, 2 / (1 + MIN_GAIN) - 1e-3)], 8)[0] == 4


def test_it_stops_at_the_largest_count_asked_for_and_before_memory_runs_out():
    assert next_count([count(1, 1.0), count(2, 1.1)], 2) == (None, "reached the largest count asked for (2 per GPU)")
    k, why = next_count([count(1, 1.0, peak=9.0), count(2, 1.1, peak=9.5)], 8, gpu_memory_gb=24.0)
    assert k is None and why == "memory: 4 trials of 9.5 GB would not fit one GPU's 24 GB"
    assert next_count([count(1, 1.0, peak=5.0), count(2, 1.1, peak=5.0)], 8, gpu_memory_gb=24.0) == (4, "")
    assert next_count([count(1, 1.0), count(2, 1.1)], 8, gpu_memory_gb=24.0) == (4, "")   # no peak known: try


def test_results_say_throughput_and_peak_memory():
    one, two = count(1, 1.0, 3.0), count(2, 1.5, 3.5)
    assert two.mean_s == pytest.approx(1.5) and two.throughput == pytest.approx(2 / 1.5)
    result = PackingResult("processes", (one, two), "why", 80.0)
    assert result.gpu_memory_gb_per_trial == 3.5
    assert PackingResult("logical", (count(1, 1.0),), "why").gpu_memory_gb_per_trial is None
    data = result.to_dict()
    assert data["mode"] == "processes" and [c["k"] for c in data["counts"]] == [1, 2]
    assert data["counts"][1]["throughput_iter_per_s"] == pytest.approx(2 / 1.5)


def test_max_packing_is_checked_before_any_cluster_starts(capsys):
    had_ray = "ray" in sys.modules
    code, out, err = run(capsys, "profile", DEMO, "--max-packing", "0")
    assert code == 2 and out == ""
    assert_one_line_error(err, "--max-packing", "at least 1")
    with pytest.raises(SpecError, match="--max-packing: must be a whole number of at least 1, got 0"):
        check_request(DEMO, max_packing=0)
    assert check_request(DEMO, gpus=[1], max_packing=4).max_packing == 4
    assert check_request(DEMO, gpus=[1]).max_packing == 8
    assert had_ray or "ray" not in sys.modules
