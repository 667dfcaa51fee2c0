"""The driver applying the spot safety net's switch: after it, spot is neither asked for nor
waited for (a retired spot instance that is reclaimed must bring no spot replacement)."""

from __future__ import annotations

import dataclasses

from rubberband import ExperimentSpec
from rubberband.executor.driver import Driver
from rubberband.plan import plan_allocation
from rubberband.testing.builders import fake_cloud, model_profile
from rubberband.testing.fakes import make_fakes

ITER_S = {1: 4.0}


def test_after_the_switch_the_cluster_is_asked_for_on_demand_only_and_retired_spot_is_let_go():
    # Both spot instances get a notice (t=1022 and 1030); at t=1039, while t001 waits for a spot
    # replacement, the slack runs out and the rest moves to on-demand. i000's replacement
    # (rb-instance-3) is up and running a trial: retired; t001's (rb-instance-4) is cancelled.
    model = model_profile(ITER_S, name="fake")
    cloud = fake_cloud(1, spot_price_usd_per_hour=1.08)
    plan = plan_allocation(ExperimentSpec.from_stages([(2, 10), (1, 10)]), (2, 1), model, cloud, deadline_s=145,
                           samples=2)
    plan = dataclasses.replace(plan, spot_instances=(2, 1))
    fakes = make_fakes(1, ITER_S, provision_s=10, init_s=5)
    fakes.cluster.notify("rb-instance-1", 0.5, at=1022)
    fakes.cluster.notify("rb-instance-2", 0.5, at=1030)
    switched_at = []       # how many port calls came before the switch
    outcome = Driver(plan, fakes.cluster, fakes.runner, {"lr": {"grid": [0.1, 0.5]}}, "loss", clock=fakes.clock,
                     safety_net=model, on_event=lambda k, d: switched_at.append(len(fakes.cluster.calls))
                     if k == "switch" else None).run()
    (switch,) = outcome.switches
    assert switch.at_s == 39.0
    after = [c[1:] for c in fakes.cluster.calls[switched_at[0]:] if c[0] == "cluster"]
    # The retired instance leaves the request as noticed ones do (kept only while up) ...
    assert ("replace", "rb-instance-3") in after
    # ... no spot instance is launched from the switch on, and every wait is for on-demand
    # instances alone (before the fix: {fake.gpu: 2, fake.gpu.spot: 2}, then a wait for a
    # spot instance).
    launched = [e for e in fakes.cluster.events() if e["event"] == "request" and e["t"] >= 1000 + switch.at_s]
    assert launched and {e["market"] for e in launched} == {"on-demand"}
    waits = [c[1] for c in after if c[0] == "wait_nodes"]
    assert waits and all(set(r) <= {"fake.gpu"} for r in waits), waits
    assert {"fake.gpu": 2} in waits
    assert outcome.ended_at - outcome.started_at <= 145.0 and fakes.cluster.nodes() == []
