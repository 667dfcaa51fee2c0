"""Spot on the local provider with --spot-emulation: a mixed stage (one spot, one on-demand
instance), the spot node gets a notice on its fake metadata endpoint, the watcher tells the
driver, the node is reclaimed for real, the trial resumes from its checkpoint on the
replacement, and the ledger bills the spot instance at the spot price up to the reclaim."""

import dataclasses

import pytest

import rubberband as rb
from rubberband.executor.run import execute
from rubberband.plan import plan_allocation
from rubberband.profiles.cloud import Market
from rubberband.providers.local import LocalCluster

from .conftest import ROOT, trainer
from .tiny_trainer import Slow

pytestmark = pytest.mark.integration

SPACE = {"lr": {"loguniform": [0.01, 0.3]}}
ITERS = 80      # 13-26 s of training (0.17-0.33 s an iteration): the spot instance lives 14 s


def test_a_reclaimed_spot_node_is_replaced_and_its_trial_resumes_from_the_checkpoint(tmp_path, model):
    cloud = rb.CloudProfile.load(ROOT / "cloud_profiles" / "local" / "local.yaml", "local.1gpu").replace(
        spot_price_usd_per_hour=0.3, market=Market.ON_DEMAND)
    spec = rb.ExperimentSpec.from_stages([(2, ITERS)])
    plan = plan_allocation(spec, (2,), model.replace(iter_latency_s={1: model.iter_latency_s[1]}), cloud,
                           deadline_s=600, samples=20)
    plan = dataclasses.replace(plan, spot_instances=(1,))          # one spot, one on-demand instance
    seen = []
    # Each spot instance lives 14 s from its RUNNING (the first only: max=1), with a 4 s notice.
    result = execute(plan, trainer("Slow"), SPACE, metric="val_loss", seed=5, runs_dir=tmp_path / "runs",
                     latency_scale=0.2, on_event=lambda k, d: seen.append((k, d)), run_id="spot-emulation",
                     spot_emulation="life=14s,notice=4s,max=1")

    ledger = result.ledger
    spot = [i for i in ledger["instances"] if i["market"] == "spot"]
    on_demand = [i for i in ledger["instances"] if i["market"] == "on-demand"]
    assert len(on_demand) == 1 and len(spot) == 2                   # the reclaimed one and its replacement
    reclaimed, replacement = sorted(spot, key=lambda i: i["launched_s"])
    assert reclaimed["release_reason"] == "interrupted"
    assert reclaimed["released_s"] - reclaimed["launched_s"] == pytest.approx(14.0, abs=1.5)
    # Billed at the spot price, to the reclaim (the minimum: 60 s).
    assert reclaimed["price_usd_per_hour"] == 0.3 and on_demand[0]["price_usd_per_hour"] == cloud.price_usd_per_hour
    assert reclaimed["cost_usd"] == pytest.approx(60 * 0.3 / 3600)
    assert ledger["markets"]["spot"]["reclaimed"] == 1 and ledger["markets"]["on-demand"]["reclaimed"] == 0
    assert ledger["cost_usd"] == pytest.approx(sum(i["cost_usd"] for i in ledger["instances"]))
    (stage,) = result.stages
    assert (stage["predicted"]["spot_instances"], stage["actual"]["spot_instances"], stage["actual"]["reclaimed"]) == (1, 1, 1)
    assert ("emulation", {"text": "spot emulation: each spot instance reclaimed 14s after it runs, 4s notice, "
                                  "at most 1 reclaim(s)"}) in seen

    # The watcher's notice reached the driver before the reclaim, and the replacement was
    # requested then (before the reclaim).
    (notice,) = [d for k, d in seen if k == "notice"]
    assert notice["instance"] == reclaimed["instance_id"]
    assert replacement["requested_s"] < reclaimed["released_s"]

    # The trial on the spot node resumed on the replacement from a checkpoint and finished.
    moved = [d for k, d in seen if k == "resume"]
    assert moved and all(d["left"] == [reclaimed["instance_id"]] for d in moved)
    assert moved[0]["step"] > 0 and moved[0]["instances"] == [replacement["instance_id"]]
    for trial in result.trials.values():
        assert trial["step"] == ITERS * Slow.steps_per_iter
    assert all(i["released_s"] is not None for i in ledger["instances"])
    assert LocalCluster.known() == []                                 # nothing left running
