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
