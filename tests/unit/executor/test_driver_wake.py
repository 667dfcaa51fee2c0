"""The driver keeps the scheduler's clock while it waits for instances: a ``Wake`` that falls
inside ``ClusterPort.wait_nodes`` ends the wait there, the scheduler gets its ``Tick``, and the
wait goes on for what is wanted then. Spot capacity that never comes is left for on-demand
by the safety net, and a budget running out mid-wait stops the run, instead of the run
failing after the node timeout."""

from __future__ import annotations

import dataclasses

import pytest

from rubberband import ExperimentSpec
from rubberband.errors import ProviderError
from rubberband.executor.driver import Driver
from rubberband.plan import plan_allocation
from rubberband.testing.builders import fake_cloud, model_profile, spot_market
from rubberband.testing.fakes import make_fakes

ITER_S = {1: 4.0}
SPACE = {"lr": {"grid": [0.1, 0.5]}}
MODEL = model_profile(ITER_S, name="fake")
# Spot that can be reclaimed (a preemption rate), so the safety net is armed by a request that
# waits for capacity.
CLOUD = fake_cloud(1, spot_price_usd_per_hour=1.08, spot=spot_market(rate_per_hour=1.0, notice_s=120))


def _run(spot: tuple[int, int], deadline_s: float = 1e6, no_capacity: bool = True, **kwargs):
    plan = plan_allocation(ExperimentSpec.from_stages([(2, 10), (1, 10)]), (2, 1), MODEL, CLOUD,
                           deadline_s=deadline_s, samples=2)
    plan = dataclasses.replace(plan, spot_instances=spot)
    fakes = make_fakes(1, ITER_S, provision_s=10, init_s=5)
    if no_capacity:
        fakes.cluster.no_capacity.add("spot")          # no spot instance is ever granted
    seen: list[tuple[float, str]] = []
    driver = Driver(plan, fakes.cluster, fakes.runner, SPACE, "loss", clock=fakes.clock,
                    on_event=lambda kind, data: seen.append((fakes.clock() - 1000, kind)), **kwargs)
    return driver, fakes, seen


def test_spot_that_never_comes_is_left_for_on_demand_by_the_safety_net_and_the_deadline_is_met():
    # Stage 0 asks for 2 spot instances that never come. The safety net's Wake falls inside
    # that wait: at t=190 the slack (deadline 300 - now - T_od 80) is two replacement delays
    # (30 s) and the job moves to on-demand. Before the fix the driver sat in wait_nodes and
    # failed after the node timeout, the scheduler never having seen the time pass.
    driver, fakes, seen = _run((2, 1), deadline_s=300, safety_net=MODEL)
    outcome = driver.run()
    (switch,) = outcome.switches
    assert switch.slack_s == pytest.approx(switch.needed_s, abs=1.0)      # when the rule says, not later
    assert switch.at_s == 190.0                                              # T_od is 80 s then
    assert (switch.first_stage, switch.last_stage) == (0, 1)
    requests = [e for e in fakes.cluster.events() if e["event"] == "request"]
    assert requests and {e["market"] for e in requests} == {"on-demand"}
    assert min(e["t"] for e in requests) == 1000 + switch.at_s        # launched at the switch
    assert sorted(t.step for t in outcome.trials.values()) == [10, 20] and outcome.best is not None
    assert outcome.ended_at - outcome.started_at <= 300
    assert fakes.cluster.nodes() == [] and fakes.runner.live == []


def test_a_budget_that_runs_out_while_spot_is_awaited_stops_the_run_cleanly():
    # Requested spot is counted from its request (safety.Budget), so a wait for capacity
    # spends the budget; its Wake falls inside the wait and the run stops with a reason
    # (no trial ever ran: no best), nothing left requested or up.
    driver, fakes, seen = _run((2, 1), budget_usd=0.05)
    outcome = driver.run()
    assert outcome.stopped is not None and outcome.stopped.startswith("budget:")
    assert outcome.best is None and outcome.budget_left_usd is not None and 0 <= outcome.budget_left_usd < 0.01
    stopped_at = [t for t, kind in seen if kind == "stopped"]
    # 2 spot instances at $1.08/h: $0.05 lasts about 83 s, well before the 300 s node timeout.
    assert stopped_at and 60 < stopped_at[0] < 90
    assert fakes.cluster.called("scale_to")[-1][0] == {} and fakes.cluster.alive == []
    assert fakes.runner.shut_down


def test_a_wait_with_no_wake_to_honour_fails_after_the_node_timeout_as_before():
    # No guard asks for a Wake: the wait is one call, and spot that never comes fails the run.
    driver, fakes, _ = _run((2, 1), node_timeout_s=300)
    with pytest.raises(ProviderError, match=r"waited 300s for 2 x fake\.gpu\.spot"):
        driver.run()
    assert len(fakes.cluster.called("wait_nodes")) == 1


def test_wakes_inside_a_wait_that_is_met_later_change_nothing_but_the_ticks():
    # A deadline 5 s past what the net needs at the start: it asks to be woken at t=5, and as
    # the scale-up it waits for is counted in T_od, the slack holds while the wait lasts (and
    # the spot request counts as waiting for capacity only at t=30). The spot comes at t=25:
    # the scheduler is ticked meanwhile without switching, the wait goes on for the same
    # request, and the run is the one it would be with no net at all.
    runs = []
    for net in (MODEL, None):
        driver, fakes, _ = _run((2, 1), deadline_s=130, no_capacity=False, safety_net=net)
        fakes.cluster.provision_s = 20
        runs.append((driver.run(), fakes))
    (with_net, fakes), (without, plain) = runs
    assert with_net.switches == []
    waits = fakes.cluster.called("wait_nodes")
    stage0 = [w for w in waits if w == ({"fake.gpu.spot": 2},)]
    assert len(stage0) > 1 and waits[:len(stage0)] == stage0          # split at the Wakes, same request
    assert len(plain.cluster.called("wait_nodes")) == len(waits) - len(stage0) + 1
    assert with_net.ended_at == without.ended_at
    assert [(h["start_s"], h["end_s"]) for t in with_net.trials.values() for h in t.history] == \
        [(h["start_s"], h["end_s"]) for t in without.trials.values() for h in t.history]
