"""The fused profiler: its stopping rule and memory line (pure), and a real measurement on a
worker in this process."""

from __future__ import annotations

import pytest

from rubberband.profiler.fusion import (
    FusedResult,
    FusedSize,
    f_max,
    fit_memory,
    fused_entries,
    local_call,
    measure_fused,
    next_size,
)


def size(F, s, gb=None):
    return FusedSize(F, (s, s), gb)


def test_sizes_double_until_throughput_stops_rising():
    assert next_size([], 16) == (1, "")
    assert next_size([size(1, 1.0)], 16) == (2, "")
    assert next_size([size(1, 1.0), size(2, 1.2)], 16) == (4, "")
    F, why = next_size([size(1, 1.0), size(2, 1.2), size(4, 2.35)], 16)     # 1.67 -> 1.70 /s: +2%
    assert F is None and why.startswith("throughput stopped rising: 4 fused gives +2% over 2")


def test_sizes_stop_at_max_f_and_before_memory_runs_out():
    F, why = next_size([size(1, 1.0), size(2, 1.0)], 2)
    assert F is None and "largest group asked for (2)" in why
    # m(F) = 1 + (F-1) x 2 GB: F = 4 needs 7 GB, over 6
    F, why = next_size([size(1, 1.0, 1.0), size(2, 1.0, 3.0)], 16, device_memory_gb=6.0)
    assert F is None and why.startswith("memory: 4 fused would need 7 GB")
    assert next_size([size(1, 1.0, 1.0), size(2, 1.0, 3.0)], 16, device_memory_gb=7.0) == (4, "")


def test_the_memory_line_and_f_max_follow_hydro():
    m1, delta = fit_memory({1: 2.0, 2: 2.5, 4: 3.5})
    assert m1 == pytest.approx(2.0) and delta == pytest.approx(0.5)
    assert f_max(m1, delta, 80.0) == 1 + int(78.0 // 0.5) == 157
    assert f_max(2.0, 0.0, 80.0) is None          # memory does not grow: no limit from memory
    assert f_max(90.0, 0.5, 80.0) == 0


def test_entries_scale_to_the_solo_latency_and_name_the_fit():
    result = FusedResult((size(1, 2.0, 1.0), size(2, 2.5, 1.5), size(4, 3.0, 2.5)), "reached", solo_iter_s=1.0,
                         forward="batched", optimizer="FusedSGD", device_memory_gb=10.0)
    out = fused_entries(result, solo_s=0.5)
    assert set(out) == {"fused_iter_latency_s", "fused_memory_gb", "profiling"}
    assert out["fused_iter_latency_s"][4]["dist"] in ("normal", "lognormal", "constant")
    assert out["fused_memory_gb"] == {1: 1.0, 2: 1.5, 4: 2.5}
    prof = out["profiling"]
    assert prof["scaled_by"] == 0.5 and prof["samples"][2] == [1.25, 1.25]
    assert prof["throughput_vs_alone"] == {1: 0.5, 2: 0.8, 4: round(4 / 3, 4)}
    assert prof["memory_fit"]["f_max"] == 1 + int((10.0 - 1.0) // 0.5)


def test_a_real_measurement_on_a_local_worker():
    torch = pytest.importorskip("torch")
    from rubberband.executor.worker import DDPWorker
    from tests.unit.fusion.toys import Toy

    threads = torch.get_num_threads()
    try:
        worker = DDPWorker(Toy(), seed=0)
        worker.warmup()
        seen = []
        result = measure_fused(local_call(worker), lambda n: [{"lr": 0.01 * (i + 1)} for i in range(n)], iters=2,
                               max_f=4, on_size=seen.append)
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
    assert [s.F for s in result.sizes] == [s.F for s in seen] and result.sizes[0].F == 1
    assert all(len(s.iter_samples) == 2 and s.memory_gb and s.memory_gb > 0 for s in result.sizes)
    assert result.forward == "batched" and result.optimizer == "FusedSGD" and result.solo_iter_s > 0
    assert result.stopped
    assert worker.group is None


def test_a_search_space_of_several_shapes_is_not_measured_fused_and_says_why():
    from rubberband.profiler.fusion import not_measured

    assert not_measured([[0, 1, 2]], None) is None
    assert not_measured([[0, 1, 2]], "trainer: a function trainable cannot be fused") == \
        "trainer: a function trainable cannot be fused"
    reason = not_measured([[0, 2], [1]], None)
    assert reason is not None and "2 shapes" in reason and "run unfused" in reason


def test_each_sample_is_a_round_as_a_run_trains_it_checkpoint_included():
    """A run trains a fused group one iteration per call and checkpoints every member after it
    (``ray_runner``): that time is part of ``L_F``, as the unfused latency has it."""
    now = [0.0]

    class Worker:
        F = 1

        def assign(self, config, checkpoint):
            self.F = 1

        def assign_group(self, trials, configs, checkpoints):
            self.F = len(trials)

        def train(self, iters):
            now[0] += 0.1 * iters                          # the optimizer steps, what the worker's timer sees
            return [{"iter_times": [0.1] * iters}] * self.F if self.F > 1 else {"iter_times": [0.1] * iters}

        def checkpoint(self):
            now[0] += 0.05

        def checkpoint_group(self):
            now[0] += 0.05 * self.F                        # every member's state, serialised

        def peak_memory_gb(self):
            return None

        def group_paths(self):
            return "batched", "FusedSGD"

        def leave(self):
            pass

    result = measure_fused(local_call(Worker()), lambda n: [{}] * n, iters=3, max_f=4, clock=lambda: now[0])
    assert result.solo_iter_s == pytest.approx(0.15)
    assert [s.F for s in result.sizes] == [1, 2, 4]
    for s, expected in zip(result.sizes, (0.15, 0.2, 0.3)):
        assert s.iter_samples == pytest.approx((expected,) * 3)
