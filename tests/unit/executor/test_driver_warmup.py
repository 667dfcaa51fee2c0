"""The driver when a new instance is lost while its workers warm up (a spot reclaim with no
notice, seen by the closed-loop aws test): the run waits for a replacement instead of failing."""

from __future__ import annotations

import pytest

from rubberband import ExperimentSpec
from rubberband.errors import ProviderError
from rubberband.executor.driver import Driver
from rubberband.plan import plan_allocation
from rubberband.testing.builders import fake_cloud, model_profile
from rubberband.testing.fakes import make_fakes

ITER_S = {1: 4.0}


def _driver(lose: bool, every_time: bool = False, **kwargs):
    model = model_profile(ITER_S, name="fake")
    cloud = fake_cloud(1)
    plan = plan_allocation(ExperimentSpec.from_stages([(2, 3), (1, 3)]), (2, 1), model, cloud, deadline_s=1e6, samples=2)
    fakes = make_fakes(1, ITER_S, provision_s=10, init_s=5)
    warm = fakes.runner.warm

    def failing_warm(nodes, trials_per_gpu=1):
        # The first warm-up (every one) dies with its worker: the newest instance went away
        # (or, lose=False, none did).
        if every_time or not fakes.runner.calls_made:
            fakes.runner.calls_made = True
            if lose:
                fakes.cluster.lose(nodes[-1].name, reason="interrupted")
            raise RuntimeError("The actor died unexpectedly before finishing this task")
        return warm(nodes, trials_per_gpu)

    fakes.runner.calls_made = False
    fakes.runner.warm = failing_warm
    return Driver(plan, fakes.cluster, fakes.runner, {"lr": {"grid": [0.1, 0.5]}}, "loss", clock=fakes.clock,
                  **kwargs), fakes


def test_an_instance_lost_while_its_workers_warm_up_is_replaced_and_the_run_goes_on():
    driver, fakes = _driver(lose=True)
    outcome = driver.run()
    events = fakes.cluster.events()
    assert [e["instance"] for e in events if e["event"] == "request"] == ["rb-instance-1", "rb-instance-2",
                                                                          "rb-instance-3"]
    ended = {e["instance"]: e["reason"] for e in events if e["event"] == "terminated"}
    assert ended["rb-instance-2"] == "interrupted"
    # The trials ran on the instance that stayed and the replacement, never on the lost one.
    used = {i for t in outcome.trials.values() for h in t.history for i in h["instances"]}
    assert used == {"rb-instance-1", "rb-instance-3"}
    assert sorted(t.step for t in outcome.trials.values()) == [3, 6] and outcome.best is not None
    assert fakes.cluster.nodes() == []


def test_a_warm_up_that_fails_with_every_instance_alive_fails_the_run():
    driver, _ = _driver(lose=False)
    with pytest.raises(RuntimeError, match="The actor died unexpectedly"):
        driver.run()


def test_instances_lost_while_warming_up_again_and_again_fail_the_run_after_the_node_timeout():
    # The first instances are up at 15 s and lost while warming; their replacements would be up
    # at 30 s, after the 20 s the wait for instances may take.
    driver, fakes = _driver(lose=True, every_time=True, node_timeout_s=20.0)
    with pytest.raises(ProviderError, match=r"waited 5s for 2 x fake\.gpu"):
        driver.run()
    # The two instances and one replacement for the one lost; no endless relaunching.
    assert len([e for e in fakes.cluster.events() if e["event"] == "request"]) == 3
