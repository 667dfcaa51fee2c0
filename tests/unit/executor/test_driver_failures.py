"""A trial whose own code fails (a function that raises, a NaN metric) is retried from its
checkpoint up to ``max_failures`` times, then marked failed, its traceback kept in the run
directory and ranked last; the job goes on. Against the in-process fakes of the ports."""

from __future__ import annotations

import math

from rubberband import CloudProfile, ExperimentSpec, ModelProfile
from rubberband.executor.driver import Driver
from rubberband.function_api import TrialFunctionError
from rubberband.plan import plan_allocation
from rubberband.testing.fakes import default_metrics, make_fakes

ITER_S = {1: 4.0, 2: 2.5}
# t000 has the better lr: left alone it would win.
SPACE = {"lr": {"grid": [0.1, 0.5]}}


def _run(tmp_path, max_failures: int = 0, metrics=default_metrics, raises: tuple[str, int, int] | None = None):
    fakes = make_fakes(2, ITER_S, provision_s=10, init_s=5)
    fakes.runner.metrics = metrics
    if raises is not None:
        trial, at_step, times = raises
        inner, left = fakes.runner.result, [times]

        def result(future):
            res = inner(future)
            if future.trial == trial and left[0] > 0 and res.step >= at_step:
                left[0] -= 1
                raise TrialFunctionError(f"trial {trial}: the trial function raised ValueError: bad batch",
                                         "Traceback (most recent call last):\n  ValueError: bad batch")
            return res

        fakes.runner.result = result
    spec = ExperimentSpec.from_stages([(2, 3), (1, 3)])
    model = ModelProfile.from_dict({"name": "fake", "iter_latency_s": dict(ITER_S)})
    cloud = CloudProfile.from_dict({"instance_type": "fake.gpu", "gpus_per_instance": 2, "price_usd_per_hour": 3.6,
                                    "provision_latency_s": 10, "init_latency_s": 5})
    plan = plan_allocation(spec, (2, 1), model, cloud, deadline_s=1e6, samples=2)
    driver = Driver(plan, fakes.cluster, fakes.runner, SPACE, "loss", "min", clock=fakes.clock,
                    checkpoint_dir=tmp_path / "checkpoints", max_failures=max_failures)
    return driver.run()


def test_a_trial_that_raises_is_marked_failed_ranked_last_and_the_job_goes_on(tmp_path):
    outcome = _run(tmp_path, raises=("t000", 2, 99))
    t0, t1 = outcome.trials["t000"], outcome.trials["t001"]
    assert t0.failed == "trial t000: the trial function raised ValueError: bad batch" and t0.failures == 1
    assert math.isnan(t0.metric) and t0.history[-1]["failed"] == t0.failed
    assert outcome.stages[0].promoted == ["t001"] and outcome.best == "t001" and t1.step == 6
    assert "ValueError: bad batch" in (tmp_path / "failures" / "t000.txt").read_text()


def test_max_failures_retries_from_the_last_checkpoint(tmp_path):
    outcome = _run(tmp_path, max_failures=1, raises=("t000", 2, 1))
    t0 = outcome.trials["t000"]
    assert t0.failed is None and t0.failures == 1 and t0.restarts == 1
    assert outcome.stages[0].promoted == ["t000"] and outcome.best == "t000" and t0.step == 6


def test_a_trial_failing_more_than_max_failures_is_given_up_on(tmp_path):
    outcome = _run(tmp_path, max_failures=1, raises=("t000", 2, 99))
    t0 = outcome.trials["t000"]
    assert t0.failures == 2 and t0.failed is not None
    assert outcome.stages[0].promoted == ["t001"]
    assert (tmp_path / "failures" / "t000.txt").read_text().count("--- failure") == 2


def test_a_nan_metric_fails_the_trial(tmp_path):
    def metrics(config, step):
        m = default_metrics(config, step)
        return {**m, "loss": math.nan} if config["lr"] == 0.1 and step >= 2 else m

    outcome = _run(tmp_path, metrics=metrics)
    t0 = outcome.trials["t000"]
    assert t0.failed == "trial t000 reported loss = NaN" and t0.step == 2
    assert outcome.stages[0].promoted == ["t001"] and outcome.best == "t001"
