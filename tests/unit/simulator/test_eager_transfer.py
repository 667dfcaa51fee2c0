"""Eager transfer (DESIGN §4.6): a surrogate job's target stage started early, in the spec,
the simulator, the reference simulator, the timeline and the task graph."""

from __future__ import annotations

import numpy as np
import pytest

from rubberband import ExperimentSpec, ModelProfile, SpecError
from rubberband.profiles import Constant, Normal
from rubberband.simulator import build_dag, simulate
from rubberband.simulator.trace import sample_timeline
from rubberband.spec.experiment import EagerTransfer, eager_transfer
from rubberband.testing.builders import cloud_profile
from rubberband.testing.reference_sim import reference_simulate

from .test_surrogate_job import BIG, NOISY_S, NOISY_T, SMALL

SURROGATE = ModelProfile({1: Constant(0.5), 2: Constant(0.3)}, Constant(2.0), Constant(1.0), name="w/8")
TARGET = ModelProfile({1: Constant(8.0), 2: Constant(4.5), 4: Constant(2.5)}, Constant(20.0), Constant(3.0),
                      name="full")
CLOUD = cloud_profile("t.4gpu", 4, 36.0, provision_s=10.0, init_s=5.0, minimum_s=0.0)    # $0.01 per second
TUNING = ExperimentSpec.sha(8, 20, 80, 2)            # 8x20 4x20 2x40


def job(after_stage: int, p: float) -> ExperimentSpec:
    return TUNING.with_target(100, EagerTransfer(after_stage, p))


# --- the spec --------------------------------------------------------------------------------------
def test_a_fraction_hands_over_at_the_first_sync_that_many_trials_are_done_by():
    tuning = ExperimentSpec.sha(16, 2, 40, 2)          # 16 8 4 2 1: done 8/16, 12/16, 14/16, 15/16
    assert [eager_transfer(tuning, f).after_stage for f in (0.25, 0.5, 0.6, 0.8, 0.9)] == [0, 0, 1, 2, 3]
    # The default restart probability: 1 - 1/n of the n trials promoted at the hand-over; none when one is.
    assert eager_transfer(tuning, 0.5).restart_probability == pytest.approx(1 - 1 / 8)
    assert eager_transfer(tuning, 0.9).restart_probability == 0.0
    assert eager_transfer(tuning, 0.5, 0.2).restart_probability == 0.2


@pytest.mark.parametrize(("after", "p", "pattern"), [
    (0.95, None, r"eager_transfer.after: 0.95 of the trials are done only at the tuning's end .* at most 0.938"),
    (0.0, None, r"eager_transfer.after: expected the fraction"),
    (1.0, None, r"eager_transfer.after: expected the fraction"),
    (0.9, 0.3, r"eager_transfer.restart_probability: after stage 3 one trial goes on, the winner"),
    (0.5, 1.5, r"eager_transfer.restart_probability: expected a probability"),
])
def test_a_hand_over_the_tuning_cannot_make_is_one_error(after, p, pattern):
    with pytest.raises(SpecError, match=pattern):
        ExperimentSpec.sha(16, 2, 40, 2).with_target(40, eager_transfer(ExperimentSpec.sha(16, 2, 40, 2), after, p))


def test_a_tuning_of_one_stage_has_no_sync_to_hand_over_at():
    with pytest.raises(SpecError, match=r"surrogate.eager_transfer: the tuning has one stage"):
        eager_transfer(ExperimentSpec.from_stages([(4, 10)]), 0.5)


def test_only_an_sha_job_and_only_its_target_stage_start_early():
    hyperband = ExperimentSpec.chain(ExperimentSpec.hyperband(1, 27, 3))
    with pytest.raises(SpecError, match=r"eager_transfer: only an SHA job"):
        hyperband.with_target(27, EagerTransfer(0, 0.5))
    with pytest.raises(SpecError, match=r"eager_transfer.after_stage: 2 is not before the tuning's last stage"):
        TUNING.with_target(100, EagerTransfer(2, 0.5))


def test_the_spec_says_it_and_drops_it():
    spec = job(0, 0.75)
    assert spec.eager == EagerTransfer(0, 0.75)
    assert "target started after stage 0 (eager transfer, restart probability 0.75)" in spec.describe()
    assert spec.without_eager() == TUNING.with_target(100) and spec.without_eager().eager is None


# --- the simulator, by hand ----------------------------------------------------------------------------
# Stage 0: 8 trials on 8 GPUs: SCALE 10 + INIT 5, TRAIN 2 + 20 * 0.5 = 12, SYNC 1 -> 28.
# Stage 1: 4 trials on 4 GPUs, one instance kept: 12 + 1 -> 41.  Stage 2: 2 on 2: 2 + 40 * 0.5 + 1 -> 64.
# An eager target after stage 0 on 4 GPUs (one new instance): SCALE 10 + INIT 5 from 28 -> up at 43;
# TRAIN 20 + 100 * 2.5 = 270 -> 313; its SYNC 3 once the tuning is over too -> 316.
# Restarted at the tuning's end (64, its instance up since 43): 64 + 270 + 3 = 337.
def test_kept_and_restarted_targets_end_as_the_model_says():
    kept = simulate(job(0, 0.0), [8, 4, 2, 4], SURROGATE, CLOUD, samples=4, target_model=TARGET)
    again = simulate(job(0, 1.0), [8, 4, 2, 4], SURROGATE, CLOUD, samples=4, target_model=TARGET)
    assert kept.jct_s[0] == pytest.approx(316.0) and again.jct_s[0] == pytest.approx(337.0)
    # Tuning: 2 instances from their SCALE end (10) to 28, then 1 until 64: 36 + 36 instance-seconds;
    # the target's instance from its SCALE end (38) to its end.
    assert kept.cost_usd[0] == pytest.approx((36 + 36 + (316 - 38)) * 0.01)
    assert again.cost_usd[0] == pytest.approx((36 + 36 + (337 - 38)) * 0.01)
    assert kept.stages[-1].mean_duration_s == pytest.approx(316 - 64) and kept.stages[-1].new_instances == 1
    # The same job with the target after the tuning: 64 + 270 + 3, on the instance stage 2 held.
    seq = simulate(job(0, 0.0).without_eager(), [8, 4, 2, 4], SURROGATE, CLOUD, samples=4, target_model=TARGET)
    assert seq.jct_s[0] == pytest.approx(337.0)


def test_a_target_that_finishes_first_waits_for_the_tuning_and_its_verdict():
    # A target of 2 iterations: up at 43, trained by 43 + 25 = 68, past the tuning's end (64): kept, it
    # ends at 68 + 3; restarted at 64 it trains 25 again from there: 64 + 25 + 3.
    short = TUNING.with_target(2, EagerTransfer(0, 0.0))
    assert simulate(short, [8, 4, 2, 4], SURROGATE, CLOUD, samples=2, target_model=TARGET).jct_s[0] == \
        pytest.approx(71.0)
    longer_tuning = ExperimentSpec.sha(8, 40, 160, 2)          # 8x40 4x40 2x80: ends at 38 + 23 + 43 = 104
    kept = simulate(longer_tuning.with_target(2, EagerTransfer(0, 0.0)), [8, 4, 2, 4], SURROGATE, CLOUD, samples=2,
                    target_model=TARGET)
    assert kept.jct_s[0] == pytest.approx(104 + 3)              # trained by 53 + 25, then waits for the tuning
    again = simulate(longer_tuning.with_target(2, EagerTransfer(0, 1.0)), [8, 4, 2, 4], SURROGATE, CLOUD,
                     samples=2, target_model=TARGET)
    assert again.jct_s[0] == pytest.approx(104 + 25 + 3)


def test_per_function_billing_charges_the_target_the_training_it_did():
    cloud = cloud_profile("t.4gpu", 4, 36.0, provision_s=10.0, init_s=5.0, per_function=True)
    kept = simulate(job(0, 0.0), [8, 4, 2, 4], SURROGATE, cloud, samples=2, target_model=TARGET)
    again = simulate(job(0, 1.0), [8, 4, 2, 4], SURROGATE, cloud, samples=2, target_model=TARGET)
    # Restarted: the first TRAIN is cut at the tuning's end (64 - 43 = 21 s of it), then 270 s again,
    # on 4 of the instance's 4 GPUs.
    target_kept, target_again = kept.stages[-1].mean_cost_usd, again.stages[-1].mean_cost_usd
    assert target_kept == pytest.approx(270 * 0.01) and target_again == pytest.approx((21 + 270) * 0.01)


def test_the_restart_is_drawn_per_sample_at_its_probability():
    sim = simulate(job(0, 0.3), [8, 4, 2, 4], SURROGATE, CLOUD, samples=4000, seed=5, target_model=TARGET)
    restarted = np.isclose(sim.jct_s, 337.0)
    assert set(np.round(sim.jct_s, 6)) == {316.0, 337.0}
    assert restarted.mean() == pytest.approx(0.3, abs=0.03)


@pytest.mark.parametrize("spot", [[0, 0, 0, 1], [2, 0, 0, 0]])
def test_spot_is_refused(spot):
    cloud = CLOUD.replace(spot_price_usd_per_hour=12.0)
    with pytest.raises(SpecError, match=r"spot_instances: a job whose target starts early .* runs on on-demand"):
        simulate(job(0, 0.5), [8, 4, 2, 4], SURROGATE, cloud, samples=2, target_model=TARGET, spot_instances=spot)
    with pytest.raises(SpecError, match=r"spot_instances: a job whose target starts early"):
        sample_timeline(job(0, 0.5), [8, 4, 2, 4], SURROGATE, cloud, target_model=TARGET, spot_instances=spot)
    with pytest.raises(SpecError, match=r"spot_instances: a job whose target starts early"):
        build_dag(job(0, 0.5), [8, 4, 2, 4], TARGET, cloud, spot_instances=spot)


# --- against the reference, the timeline and the graph --------------------------------------------------
LONG = ExperimentSpec.sha(16, 20, 400, 2)            # 16x20 8x40 4x80 2x160 1x100
TYPES = ["small"] * 5 + ["big"]


@pytest.mark.parametrize("after", [0.5, 0.8])
def test_the_simulator_agrees_with_the_reference_in_distribution(after):
    spec = LONG.with_target(30, eager_transfer(LONG, after, 0.5))
    ref_jct, ref_cost = reference_simulate(spec, [16, 8, 4, 2, 1, 4], NOISY_S, [SMALL] * 5 + [BIG], samples=2000,
                                           seed=11, target_model=NOISY_T)
    sim = simulate(spec, [16, 8, 4, 2, 1, 4], NOISY_S, {"small": SMALL, "big": BIG}, samples=4000, seed=12,
                   instance_types=TYPES, target_model=NOISY_T)
    for ref, got in ((ref_jct, sim.jct_s), (ref_cost, sim.cost_usd)):
        assert got.mean() == pytest.approx(ref.mean(), rel=0.01)
        assert np.percentile(got, 90) == pytest.approx(np.percentile(ref, 90), rel=0.02)


def test_the_timeline_replays_each_sample_to_the_simulators_figures():
    spec = LONG.with_target(30, eager_transfer(LONG, 0.5, 0.5))
    clouds = {"small": SMALL, "big": BIG}
    sim = simulate(spec, [16, 8, 4, 2, 1, 4], NOISY_S, clouds, samples=12, seed=3, instance_types=TYPES,
                   target_model=NOISY_T)
    for k in range(12):
        line = sample_timeline(spec, [16, 8, 4, 2, 1, 4], NOISY_S, clouds, seed=3, samples=12, sample=k,
                               instance_types=TYPES, target_model=NOISY_T)
        assert line.jct_s == pytest.approx(sim.jct_s[k]) and line.cost_usd == pytest.approx(sim.cost_usd[k])
        target = [t for t in line.trials if t.stage == 5]
        # The target's instance comes up after the hand-over, and its trial runs there while stage 1 trains.
        start, ready, _ = line.stages[5]
        assert start == pytest.approx(line.stages[0][2]) and target[0].start_s == pytest.approx(ready)
        assert target[0].start_s < line.stages[4][2]


def test_the_task_graph_hangs_the_target_off_the_hand_over():
    g = build_dag(job(0, 0.5).without_eager(), [8, 4, 2, 4], TARGET, CLOUD)     # one profile: the graph takes one
    assert ("SCALE", 3) not in g            # after the tuning the target runs on the instance stage 2 held
    g = build_dag(job(0, 0.5), [8, 4, 2, 4], TARGET, CLOUD)
    assert g.graph["eager_transfer"] == {"after_stage": 0, "restart_probability": 0.5}
    assert list(g.predecessors(("SCALE", 3))) == [("SYNC", 0)]
    assert set(g.predecessors(("SYNC", 3))) == {("TRAIN", 3, 0), ("SYNC", 2)}
