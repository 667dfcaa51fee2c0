"""The Gantt chart: a trial is drawn on every instance it spans, instances are whole-numbered rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from rubberband import CloudProfile, ExperimentSpec, ModelProfile
from rubberband.simulator.trace import sample_timeline

ROOT = Path(__file__).resolve().parents[3]


def draw(allocation):
    """The chart of sample 7 of 50 of the paper's job under ``allocation``: (timeline, axes)."""
    pytest.importorskip("matplotlib")
    from rubberband.cli.gantt import gantt_figure

    spec = ExperimentSpec.sha(32, 1, 50, 3)
    model = ModelProfile.load(ROOT / "profiles" / "resnet101_cifar10_p3.yaml")
    cloud = CloudProfile.load(ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml", "p3.8xlarge")
    timeline = sample_timeline(spec, allocation, model, cloud, samples=50, sample=7)
    return timeline, gantt_figure(timeline)


@pytest.fixture(scope="module")
def figure():
    timeline, fig = draw([32, 20, 12, 8])
    yield timeline, fig.axes[0]
    import matplotlib.pyplot as plt

    plt.close(fig)


def trial_bars(ax, trial):
    """The bars drawn for one trial, as (row, start, end)."""
    return sorted((round(p.get_y() + p.get_height() / 2), p.get_x(), p.get_x() + p.get_width())
                  for p in ax.patches
                  if p.get_x() == pytest.approx(trial.start_s) and p.get_width() == pytest.approx(trial.end_s - trial.start_s))


def test_a_trial_on_two_instances_is_drawn_on_both(figure):
    timeline, ax = figure
    (last,) = [t for t in timeline.trials if t.stage == 3]       # 8 GPUs on 4-GPU instances
    assert [row for row, _, _ in trial_bars(ax, last)] == [0, 1]


def test_every_trial_is_drawn_once_per_instance_it_uses(figure):
    timeline, ax = figure
    for trial in timeline.trials:
        assert [row for row, _, _ in trial_bars(ax, trial)] == sorted(trial.instances)


@pytest.mark.parametrize("allocation", [[32, 20, 12, 8], [8, 8, 8, 8]])    # 8 instances; 2
def test_instance_ticks_are_whole_numbers(allocation):
    import matplotlib.pyplot as plt

    timeline, fig = draw(allocation)
    ax = fig.axes[0]
    plt.close(fig)
    ticks = [t for t in ax.get_yticks() if ax.get_ylim()[1] <= t <= ax.get_ylim()[0]]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_the_title_says_which_sample_it_is(figure):
    _, ax = figure
    assert ax.get_title().startswith("sample 7 of 50: JCT ")
