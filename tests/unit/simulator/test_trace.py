"""One sampled timeline: any sample of a simulation replays exactly, and trials sit on every instance they use."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rubberband import CloudProfile, ExperimentSpec, ModelProfile, SpecError
from rubberband.simulator import simulate
from rubberband.simulator.trace import median_sample, sample_timeline

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def paper_job():
    spec = ExperimentSpec.sha(32, 1, 50, 3)                 # 32x1 10x3 3x9 1x37
    model = ModelProfile.load(ROOT / "profiles" / "resnet101_cifar10_p3.yaml")
    cloud = CloudProfile.load(ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml", "p3.8xlarge")
    return spec, model, cloud


@pytest.mark.parametrize("sample", [0, 1, 57, 199])
def test_any_sample_replays_the_simulation(paper_job, sample):
    spec, model, cloud = paper_job
    result = simulate(spec, [32, 20, 12, 8], model, cloud, samples=200, seed=3)
    timeline = sample_timeline(spec, [32, 20, 12, 8], model, cloud, seed=3, samples=200, sample=sample)
    assert timeline.jct_s == pytest.approx(result.jct_s[sample], rel=1e-12)
    assert timeline.cost_usd == pytest.approx(result.cost_usd[sample], rel=1e-12)
    assert (timeline.sample, timeline.samples) == (sample, 200)


# (allocation, instances): trials across instances (8 GPUs on 4-GPU instances), packed, queued, held idle.
LAYOUTS = [([32, 20, 12, 8], None), ([32, 20, 12, 16], None), ([8, 10, 12, 4], None),
           ([32, 40, 24, 32], None), ([32, 20, 12, 8], [8, 8, 8, 8])]


@pytest.mark.parametrize(("allocation", "instances"), LAYOUTS)
def test_a_trial_is_on_every_instance_its_gpus_are_on_and_no_instance_is_oversubscribed(paper_job, allocation, instances):
    spec, model, cloud = paper_job
    G = cloud.gpus_per_instance
    timeline = sample_timeline(spec, allocation, model, cloud, seed=1, instances=instances)
    alive = {s.instance: s for s in timeline.instances}
    for trial in timeline.trials:
        assert len(trial.instances) == math.ceil(trial.gpus / G)
        assert len(set(trial.instances)) == len(trial.instances)
        for i in trial.instances:
            assert alive[i].ready_s <= trial.start_s <= trial.end_s <= alive[i].released_s
        if trial.gpus > G:
            assert trial.lane == 0
        else:
            assert 0 <= trial.lane < G // trial.gpus
    # At every trial start, the GPUs in use on each instance fit on it, and no two trials share a lane.
    for t in timeline.trials:
        running = [u for u in timeline.trials if u.start_s <= t.start_s < u.end_s]
        for i in {i for u in running for i in u.instances}:
            on_i = [u for u in running if i in u.instances]
            assert sum(min(u.gpus, G) for u in on_i) <= G
            assert len({u.lane for u in on_i}) == len(on_i)


def test_the_eight_gpu_trial_of_the_paper_plan_spans_two_instances(paper_job):
    spec, model, cloud = paper_job
    timeline = sample_timeline(spec, [32, 20, 12, 8], model, cloud)
    (last,) = [t for t in timeline.trials if t.stage == 3]
    assert last.instances == (0, 1) and last.gpus == 8


@pytest.mark.parametrize(("jct", "median"), [([5.0, 1.0, 3.0], 2), ([4.0, 1.0, 3.0, 2.0], 3), ([7.0], 0)])
def test_median_sample_is_the_middle_jct(jct, median):
    assert median_sample(np.array(jct)) == median


def test_the_median_sample_of_the_readme_example_is_not_sample_zero(paper_job):
    spec, model, cloud = paper_job
    result = simulate(spec, [32, 20, 12, 8], model, cloud, samples=1000, seed=0)
    k = median_sample(result.jct_s)
    assert int(np.sum(result.jct_s < result.jct_s[k])) == 499            # the lower of the two middle ones
    assert np.mean(result.jct_s < result.jct_s[0]) < 0.1     # what the chart showed before


@pytest.mark.parametrize("sample", [-1, 10, True, 1.5])
def test_a_sample_outside_the_run_is_one_error(paper_job, sample):
    spec, model, cloud = paper_job
    with pytest.raises(SpecError, match=r"^sample: expected a sample number in 0\.\.9, got "):
        sample_timeline(spec, [32, 20, 12, 8], model, cloud, samples=10, sample=sample)


# --- spot instances: one sample's reclaims, lost work and replacements ----------------------
from rubberband.profiles.cloud import Billing, BillingModel, DataCost  # noqa: E402
from rubberband.profiles.distributions import Normal  # noqa: E402
from rubberband.profiles.spot import SpotMarket, SpotTrace  # noqa: E402
from rubberband.testing.builders import model_profile, spot_cloud  # noqa: E402

SPOT_MODEL = model_profile({1: Normal(4.0, 0.4), 2: Normal(2.2, 0.2), 4: Normal(1.3, 0.1), 8: Normal(0.8, 0.08)},
                           startup_s=Normal(8.0, 1.0), sync_s=1.0, name="m")
SPOT_SPEC = ExperimentSpec.sha(num_trials=16, min_iters=2, max_iters=40, eta=2)      # 16, 8, 4, 2, 1 trials
FLAKY = SpotTrace("z", 1, np.array([0.0, 100.0, 150.0, 400.0, 900.0]), np.array([1, 0, 1, 0, 1]), 1000.0)


MARKETS = {"rate": SpotMarket(rate_per_hour=30.0), "notice": SpotMarket(notice_s=120, rate_per_hour=30.0),
           "trace": SpotMarket(trace=FLAKY)}
# (allocation, instances, spot instances): packed; mixed, with trials over two instances; a
# static cluster with queued trials; markets switching between stages.
SPOT_LAYOUTS = {"packed": ([16, 8, 8, 4, 2], None, None), "mixed-wide": ([16, 8, 8, 16, 8], None, [2, 1, 1, 2, 2]),
                "static-queued": ([4, 4, 4, 4, 4], [2] * 5, None), "switching": ([16, 8, 8, 8, 8], None, [4, 1, 0, 2, 0])}


@pytest.mark.parametrize("layout_name", SPOT_LAYOUTS)
@pytest.mark.parametrize("market", MARKETS)
def test_every_spot_sample_replays_the_simulation_with_its_reclaims(market, layout_name):
    allocation, instances, spot = SPOT_LAYOUTS[layout_name]
    cloud = spot_cloud(MARKETS[market])
    result = simulate(SPOT_SPEC, allocation, SPOT_MODEL, cloud, samples=30, seed=3, instances=instances,
                      spot_instances=spot)
    timelines = [sample_timeline(SPOT_SPEC, allocation, SPOT_MODEL, cloud, seed=3, instances=instances, samples=30,
                                 sample=k, spot_instances=spot) for k in range(30)]
    assert [t.jct_s for t in timelines] == result.jct_s.tolist()                     # to the last bit
    assert [t.cost_usd for t in timelines] == pytest.approx(result.cost_usd.tolist(), rel=1e-12)
    reclaims = np.mean([t.reclaims for t in timelines])
    assert reclaims == pytest.approx(sum(s.mean_reclaims for s in result.stages), rel=1e-12) and reclaims > 0.5


@pytest.mark.parametrize("market", ["rate", "notice"])
def test_a_reclaimed_trial_loses_its_iteration_in_progress_and_resumes_on_the_replacement(market):
    # A 15 s notice: nothing new starts on a noticed instance, and with MARKETS' 120 s notice on
    # two-minute lives hardly any instance is ever used before its notice.
    cloud = spot_cloud(MARKETS[market] if market == "rate" else SpotMarket(notice_s=15, rate_per_hour=30.0))
    allocation, instances, spot = SPOT_LAYOUTS["mixed-wide"]
    checked = 0
    for k in range(20):
        timeline = sample_timeline(SPOT_SPEC, allocation, SPOT_MODEL, cloud, seed=1, samples=20, sample=k,
                                   spot_instances=spot)
        spans = {s.instance: s for s in timeline.instances}
        for s in timeline.instances:
            if s.cancelled:                            # released at a SYNC before its SCALE ended
                assert s.requested_s <= s.released_s <= s.launched_s
            else:
                assert s.requested_s <= s.launched_s <= s.ready_s <= s.released_s
            if s.replaces is not None:                 # asked for at the notice, not before the old one started
                old = spans[s.replaces]
                assert old.market == s.market == "spot"
                if old.reclaimed_s is not None:
                    assert s.requested_s == max(old.reclaimed_s - cloud.spot.notice_s, old.launched_s)
                else:                                  # noticed before a SYNC, reclaimed after: released there
                    assert market == "notice" and old.launched_s <= s.requested_s <= old.released_s
        for attempt in timeline.trials:
            if attempt.lost_from_s is None:
                continue
            checked += 1
            assert attempt.start_s <= attempt.lost_from_s <= attempt.end_s
            gone = [i for i in attempt.instances if spans[i].reclaimed_s == attempt.end_s]
            assert gone and all(spans[i].market == "spot" for i in gone)
            resumed = min((t for t in timeline.trials if (t.stage, t.trial) == (attempt.stage, attempt.trial)
                           and t.start_s > attempt.start_s), key=lambda t: t.start_s)
            replacement = next(s for s in timeline.instances if s.replaces == gone[0])
            while replacement.instance not in resumed.instances:     # itself reclaimed before the TRAIN resumed
                replacement = next(s for s in timeline.instances if s.replaces == replacement.instance)
            assert resumed.start_s >= replacement.ready_s
    assert checked > 5


def test_on_a_gang_trace_no_more_spot_instances_are_held_than_are_available():
    from rubberband.simulator.spot import trace_offsets

    gangs = SpotTrace("g", 4, np.array([0.0, 300.0, 900.0, 1200.0, 2000.0, 2600.0, 3000.0]),
                      np.array([4, 2, 0, 3, 4, 1, 4]), 3600.0)
    cloud = spot_cloud(SpotMarket(trace=gangs))
    allocation, spot = [16, 8, 8, 16, 8], [4, 2, 2, 4, 2]
    offsets = trace_offsets(cloud.spot, 2, 40)
    crowded = 0
    for k in range(40):
        timeline = sample_timeline(SPOT_SPEC, allocation, SPOT_MODEL, cloud, seed=2, samples=40, sample=k,
                                   spot_instances=spot)
        held = [s for s in timeline.instances if s.market == "spot" and s.released_s > s.launched_s]
        for t in {s.launched_s for s in held} | {s.ready_s for s in held}:
            alive = sum(s.launched_s <= t < s.released_s for s in held)
            assert alive <= gangs.available_at(t + offsets[k])
            crowded += alive == gangs.available_at(t + offsets[k]) < 4
    assert crowded > 0                          # the cap was reached below the gang's size, not just never tested


def test_a_per_function_timeline_costs_its_launches_data_as_the_simulation_does(paper_job):
    spec, model, cloud = paper_job
    cloud = cloud.replace(billing=Billing(BillingModel.PER_FUNCTION), data=DataCost(10.0, 0.09))
    result = simulate(spec, [32, 20, 12, 8], model, cloud, samples=20, seed=3)
    timeline = sample_timeline(spec, [32, 20, 12, 8], model, cloud, seed=3, samples=20, sample=5)
    assert timeline.cost_usd == pytest.approx(result.cost_usd[5], rel=1e-12)
