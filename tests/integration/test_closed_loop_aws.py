"""Closed loop on the aws provider (issue 15 item 7b): EC2 (moto) keeps reclaiming the spot
instances of a real run, the spot safety net moves the rest of the job to on-demand, and the
job finishes by its deadline with every instance terminated."""

import threading
import time

import boto3
import pytest

import rubberband as rb
from rubberband.executor.run import execute
from rubberband.plan import plan_allocation
from rubberband.profiles.distributions import Normal
from rubberband.providers.local import LocalCluster
from tests.conftest import running_rubberband_instances, write_cluster_yaml

from .conftest import ROOT, paced_model, trainer
from .tiny_trainer import Paced

pytestmark = [pytest.mark.integration, pytest.mark.aws]

AWS = ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml"
LIFE_S = 3.0          # each spot instance is reclaimed this long after a trial is placed on it
DEADLINE_S = 60.0


class SpotReclaimer:
    """AWS taking spot capacity back, again and again: every spot instance of the run is
    terminated in EC2 ``life_s`` after the first trial is placed on it (the ``gang`` event),
    behind the executor's back (as test_aws's single reclaim does), for ``window_s`` from the
    first placement: long enough that a job kept on spot misses its deadline, short enough
    that it still ends. (Placed, not merely ready: a node lost while the driver warms its
    workers up fails the run, see the report of issue 15.)"""

    def __init__(self, endpoint: str, run_id: str, life_s: float, window_s: float):
        self.ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
        self.run_id, self.life_s, self.window_s = run_id, life_s, window_s
        self.first: float | None = None
        self.doomed: set[str] = set()
        self.reclaimed: list[str] = []         # EC2 ids
        self._timers: list[threading.Timer] = []

    def on_event(self, kind: str, data: dict) -> None:
        if kind != "gang":
            return
        self.first = self.first or time.time()
        if time.time() - self.first > self.window_s:
            return
        for inst in set(data["instances"]) - self.doomed:
            self.doomed.add(inst)
            timer = threading.Timer(self.life_s, self._reclaim, (inst,))
            timer.daemon = True
            timer.start()
            self._timers.append(timer)

    def _reclaim(self, inst: str) -> None:
        pages = self.ec2.describe_instances(Filters=[
            {"Name": "tag:rubberband:run-id", "Values": [self.run_id]},
            {"Name": "tag:rubberband:instance", "Values": [inst]},
            {"Name": "instance-state-name", "Values": ["running"]}])
        for found in (i for r in pages["Reservations"] for i in r["Instances"]):
            if found.get("InstanceLifecycle") == "spot":
                self.ec2.terminate_instances(InstanceIds=[found["InstanceId"]])
                self.reclaimed.append(found["InstanceId"])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for timer in self._timers:
            timer.cancel()


def test_the_safety_net_moves_a_job_whose_spot_keeps_being_reclaimed_to_on_demand_and_meets_the_deadline(
        tmp_path, moto_ec2):
    # Spot g5.xlarge with this test's latencies (a 2 s launch queue, then the raylet and its
    # warm workers: 4-10 s measured here), a trainer at its profile's pace (0.5 s an iteration;
    # the profile says 0.6 for the round trips). SHA (2,16),(1,24) on 2 then 1 instances: ~39 s
    # predicted, 60 s deadline. Every spot instance is reclaimed 3 s after a trial is placed on
    # it. Kept on spot (run by hand with safety_net=None), each trial gains a few iterations
    # per instance and waits ~10 s for the next: stage 0 took 42 s, the job 84 s, late. With
    # the safety net the first reclaim arms it, and once the slack left no longer covers the
    # on-demand finish plus two replacement delays (2 x 10 s) the rest moves to on-demand:
    # switched at 13 s, done in 43-57 s.
    cloud = rb.CloudProfile.load(AWS, "g5.xlarge", market="spot").replace(
        provision_latency_s=Normal(2.0, 0.5), init_latency_s=Normal(8.0, 2.0))
    profile = paced_model()
    spec = rb.ExperimentSpec.from_stages([(2, 16), (1, 24)])
    plan = plan_allocation(spec, (2, 1), profile, cloud, deadline_s=DEADLINE_S, samples=50)
    assert plan.spot_counts == (2, 1) and plan.predicted.mean_jct_s < DEADLINE_S / 1.5

    run_id = "safety-net"
    seen = []
    with SpotReclaimer(moto_ec2, run_id, LIFE_S, window_s=DEADLINE_S) as reclaimer:
        result = execute(plan, trainer("Paced"), {"lr": {"loguniform": [0.01, 0.3]}}, provider="aws", metric="val_loss",
                         seed=3, runs_dir=tmp_path / "runs", latency_scale=1.0, run_id=run_id, safety_net=profile,
                         on_event=lambda k, d: (seen.append((k, d)), reclaimer.on_event(k, d)),
                         cluster_config=write_cluster_yaml(tmp_path / "c.yaml", spot=True, max_workers=8))
    assert reclaimer.reclaimed, "the test never reclaimed a spot instance"
    (switch,) = result.loop["safety_net"]
    assert switch["line"].startswith("safety net: ") and switch["line"].endswith("move to on-demand")
    assert [d["line"] for k, d in seen if k == "switch"] == [switch["line"]]
    ledger = result.ledger["instances"]
    assert any(i["release_reason"] == "interrupted" for i in ledger)
    # Before the switch only spot was asked for; after it only on-demand, and the rest ran there.
    assert all(i["market"] == "spot" for i in ledger if i["requested_s"] < switch["at_s"] - 1.0)
    on_demand = [i for i in ledger if i["market"] == "on-demand"]
    assert on_demand and all(i["requested_s"] >= switch["at_s"] - 1.0 for i in on_demand)
    assert all(i["market"] == "on-demand" for i in ledger if i["requested_s"] > switch["at_s"] + 1.0)
    assert result.loop["met_deadline"] and result.actual["jct_s"] <= DEADLINE_S
    assert result.trials[result.best["trial"]]["step"] == (16 + 24) * Paced.steps_per_iter
    # Everything it launched is terminated in EC2, and nothing of the cluster is left running.
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_ec2)
    launched = [i for r in ec2.describe_instances(Filters=[{"Name": "tag:rubberband:run-id", "Values": [run_id]}])
                ["Reservations"] for i in r["Instances"]]
    assert {i["InstanceId"] for i in launched} == {i["provider_id"] for i in ledger}
    assert all(i["State"]["Name"] == "terminated" for i in launched)
    assert all(i["released_s"] is not None for i in ledger)
    assert running_rubberband_instances(moto_ec2) == []
    assert LocalCluster.known() == []
