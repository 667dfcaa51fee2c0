"""The executor end to end on the local provider: Ray's autoscaler, warm DDP gangs, real PyTorch."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

import rubberband as rb
from rubberband.executor.run import execute
from rubberband.plan import plan_allocation
from rubberband.providers.local import LocalCluster

from .conftest import ROOT, after_checkpoint, trainer
from .tiny_trainer import Slow

pytestmark = pytest.mark.integration

SPACE = {"lr": {"loguniform": [0.01, 0.3]}, "hidden": [32, 64]}


def _overlaps(runs):
    """Most TRAIN runs in flight at once."""
    events = sorted([(r["start_s"], 1) for r in runs] + [(r["end_s"], -1) for r in runs], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, delta in events:
        now += delta
        most = max(most, now)
    return most


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (a raylet's workers and agents), read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def test_queue_then_resize_continues_from_the_checkpoint(tmp_path, model, cloud):
    # Stage 0: 3 trials queue on 2 GPUs (1 each). Stage 1: the best trial gets both GPUs (DDP).
    spec = rb.ExperimentSpec.from_stages([(3, 2), (1, 2)])
    plan = plan_allocation(spec, (2, 2), model, cloud, deadline_s=600, samples=50)
    assert plan.gpus_per_trial == (1, 2)
    result = execute(plan, trainer("Tiny"), SPACE, metric="val_loss", mode="min", seed=1,
                     runs_dir=tmp_path / "runs", latency_scale=0.2)

    stage0 = [r for r in result.ledger["trials"] if r["stage"] == 0]
    assert len(stage0) == 3 and _overlaps(stage0) == 2          # the third trial waited for a free GPU
    first_two_end = sorted(r["end_s"] for r in stage0)[:2]
    third_start = max(r["start_s"] for r in stage0)
    assert third_start >= min(first_two_end) - 1e-6

    winner = result.trials[result.best["trial"]]
    h0, h1 = winner["history"]
    assert (h0["gpus"], h1["gpus"]) == (1, 2)
    assert h0["step"] == 2 * 5 and h1["step"] == 4 * 5             # resumed from step 10, not from 0
    assert winner["ranks_in_sync"] is True                          # both DDP ranks held identical parameters
    losers = [t for t in result.trials.values() if t is not winner]
    assert all(t["eliminated_after"] == 0 for t in losers)
    assert result.best["metric"] == min(t["metric"] for t in result.trials.values() if t["step"] == 20)

    assert result.ledger["instances"] and all(i["released_s"] is not None for i in result.ledger["instances"])
    assert result.actual["cost_usd"] > 0 and result.actual["jct_s"] > 0
    assert (tmp_path / "runs" / result.run_id / "result.json").exists()
    assert list((tmp_path / "runs" / result.run_id / "checkpoints").glob("*.pt"))


def test_a_lost_node_mid_stage_resumes_the_trial_from_its_checkpoint(tmp_path, model):
    cloud = rb.CloudProfile.load(ROOT / "cloud_profiles" / "local" / "local.yaml", "local.1gpu")
    spec = rb.ExperimentSpec.from_stages([(2, 8)])
    plan = plan_allocation(spec, (2,), model.replace(iter_latency_s={1: model.iter_latency_s[1]}), cloud,
                           deadline_s=600, samples=50)
    assert plan.instances == (2,)
    run_id = "lost-node-test"
    run_dir = tmp_path / "runs" / run_id
    killed = {}

    def pull_the_plug(kind, data):
        if kind == "gang" and data["trial"] == "t000" and not killed:
            instance = data["instances"][0]

            def kill_raylet():
                cluster = LocalCluster.known()[0]
                pid = next(e["raylet_pid"] for e in cluster.read_events()
                           if e["event"] == "ready" and e["instance"] == instance)
                for victim in [pid, *_descendants(pid)]:     # a machine that dies takes its workers with it
                    try:
                        os.kill(victim, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                killed["instance"] = instance

            after_checkpoint(run_dir, "t000", kill_raylet)

    result = execute(plan, trainer("Slow"), SPACE, metric="val_loss", seed=2, runs_dir=tmp_path / "runs",
                     latency_scale=0.2, on_event=pull_the_plug, run_id=run_id)
    assert killed, "the test never found the node to kill"
    t0 = result.trials["t000"]
    assert t0["restarts"] >= 1
    assert t0["step"] == 8 * Slow.steps_per_iter                     # the job completed every iteration
    lost = [i for i in result.ledger["instances"] if i["instance_id"] == killed["instance"]]
    assert lost and lost[0]["released_s"] is not None
    assert len(result.ledger["instances"]) >= 3                      # a replacement was launched and billed


def test_ctrl_c_while_the_head_starts_leaves_nothing_running(tmp_path, model, cloud):
    import rubberband.providers.local as local

    spec = rb.ExperimentSpec.from_stages([(2, 1)])
    plan = plan_allocation(spec, (2,), model, cloud, deadline_s=600, samples=20)
    run_id = "ctrl-c-at-start"
    state = local.STATE_ROOT / f"{run_id}.json"

    def press_ctrl_c():
        deadline = time.time() + 60
        while not state.exists() and time.time() < deadline:    # `ray start --head` was spawned
            time.sleep(0.01)
        sid = json.loads(state.read_text())["sid"]
        seen["sid"] = sid
        os.kill(os.getpid(), signal.SIGINT)

    seen: dict = {}
    threading.Thread(target=press_ctrl_c, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        execute(plan, trainer("Tiny"), SPACE, runs_dir=tmp_path / "runs", latency_scale=0.2, run_id=run_id)
    assert seen, "the head never started"
    assert not (tmp_path / "runs" / run_id / "result.json").exists()
    assert local._session_pids(seen["sid"]) == []            # the head's whole session is gone
    assert LocalCluster.known() == [] and not state.exists()


def test_an_exception_releases_every_node(tmp_path, model, cloud):
    spec = rb.ExperimentSpec.from_stages([(2, 1)])
    plan = plan_allocation(spec, (2,), model, cloud, deadline_s=600, samples=20)
    with pytest.raises(Exception, match="boom"):
        execute(plan, trainer("Failing"), SPACE, runs_dir=tmp_path / "runs", latency_scale=0.2)
    assert LocalCluster.known() == []          # the cluster was stopped and its state file removed


def test_scale_down_releases_the_emptied_instance_at_the_sync(tmp_path, model, cloud):
    # Stage 0: 4 trials on 2 instances; stage 1: 2 trials on 1 instance. The placement packs
    # the survivors on the kept (oldest) instance and the other one is released at the SYNC.
    spec = rb.ExperimentSpec.from_stages([(4, 2), (2, 2)])
    plan = plan_allocation(spec, (4, 2), model, cloud, deadline_s=600, samples=20)
    assert plan.instances == (2, 1)
    result = execute(plan, trainer("Tiny"), SPACE, seed=3, runs_dir=tmp_path / "runs", latency_scale=0.2)
    sync0 = result.ledger["stage_windows"][0][1]
    released = sorted(result.ledger["instances"], key=lambda i: i["released_s"])
    assert len(released) == 2
    assert released[0]["instance_id"] == "rb-instance-2"             # most recently launched goes first
    assert released[0]["released_s"] <= sync0 + 5.0                  # released at the SYNC, not at the end
    assert [s["actual"]["instances"] for s in result.stages] == [2, 1]
    for tid in result.stages[0]["promoted"]:
        assert result.trials[tid]["history"][1]["instances"] == ["rb-instance-1"]
    # Both instances of stage 0 ran and joined (that their raylets start side by side, not one
    # at a time, is tested in tests/unit/providers/test_local_node_provider.py with a slow fake
    # start: on a 2-core machine two real starts at once contend, and their timings prove nothing).
    events = [json.loads(line) for line in (Path(result.run_dir) / "provider" / "events.jsonl").read_text().splitlines()]
    at = {(e["event"], e["instance"]): e["t"] for e in events}
    for i in ("rb-instance-1", "rb-instance-2"):
        assert at["request", i] <= at["running", i] <= at["ready", i]
