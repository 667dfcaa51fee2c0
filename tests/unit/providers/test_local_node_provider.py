"""The local node provider as Ray's autoscaler drives it: launches, the event log, releases and
lost nodes, with fake raylets (the ``start_node`` seam) instead of Ray processes."""

import json
import time
from types import SimpleNamespace

import pytest
from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE

from rubberband.providers.local_node_provider import LocalNodeProvider


class FakeRaylet:
    """A raylet process: alive until it is killed or crashes."""

    def __init__(self, pid):
        self.pid, self.exit_code = pid, None

    def poll(self):
        return self.exit_code


class FakeNode:
    """Ray's node object as far as the provider uses it."""

    def __init__(self, pid):
        self.raylet = FakeRaylet(pid)
        self.all_processes = {"raylet": [SimpleNamespace(process=self.raylet)]}
        self.killed = False

    def kill_all_processes(self, check_alive, allow_graceful):
        self.killed = True
        self.raylet.exit_code = -15


@pytest.fixture
def provider(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_FAKE_CLUSTER", "1")          # Ray's fake provider insists on it
    started: dict[str, FakeNode] = {}

    def start_node(node_id, node_config, tags, resources, labels):
        started[node_id] = FakeNode(1000 + len(started))
        return started[node_id]

    p = LocalNodeProvider({"state_dir": str(tmp_path), "provision_latency_s": 0, "seed": 0,
                           "gcs_address": "127.0.0.1:1", "launch_multiple": True}, "rb-test", start_node=start_node)
    p.started = started
    return p


def events(p):
    return [json.loads(line) for line in open(p._events_path)]


def launch(p, count):
    p.create_node_with_resources_and_labels({}, {TAG_RAY_USER_NODE_TYPE: "fake_gpu"}, count, {"CPU": 1, "GPU": 2}, {})
    deadline = time.time() + 5
    while sum(e["event"] == "ready" for e in events(p)) < count and time.time() < deadline:
        time.sleep(0.01)


def workers(p):
    return [nid for nid in p.non_terminated_nodes({}) if nid != p._head_node_id]


def test_a_launch_logs_request_running_and_ready_and_pins_a_resource_per_instance(provider):
    launch(provider, 2)
    log = events(provider)
    assert [e["event"] for e in log if e["instance"] == "rb-instance-1"] == ["request", "running", "ready"]
    assert {e["instance"] for e in log} == {"rb-instance-1", "rb-instance-2"}
    assert all(log[i]["t"] <= log[i + 1]["t"] for i in range(len(log) - 1))
    assert sorted(provider.node_tags(n)["rb-instance"] for n in workers(provider)) == ["rb-instance-1", "rb-instance-2"]
    ready = {e["instance"]: e["raylet_pid"] for e in log if e["event"] == "ready"}
    assert sorted(ready.values()) == [1000, 1001]


def test_a_release_is_carried_out_on_the_update_after_the_one_that_first_sees_it(provider, tmp_path):
    # An autoscaler update reads the resource demand before it lists the provider's nodes: the
    # update that first sees a release may act on a demand from before the executor lowered
    # it, and would relaunch a node terminated then.
    launch(provider, 3)
    by_instance = {provider.node_tags(n)["rb-instance"]: n for n in workers(provider)}
    assert len(workers(provider)) == 3                                   # nothing released yet
    (tmp_path / "release.json").write_text(json.dumps(["rb-instance-3"]))
    assert len(workers(provider)) == 3                                   # first seen: wait one update
    assert by_instance["rb-instance-3"] not in workers(provider)
    assert provider.started[by_instance["rb-instance-3"]].killed
    (tmp_path / "release.json").write_text(json.dumps(["rb-instance-2", "rb-instance-3"]))
    assert len(workers(provider)) == 2                                   # rb-instance-2 first seen now
    assert workers(provider) == [by_instance["rb-instance-1"]]
    terminated = [(e["instance"], e["reason"]) for e in events(provider) if e["event"] == "terminated"]
    assert terminated == [("rb-instance-3", "released"), ("rb-instance-2", "released")]


def test_instances_released_together_are_terminated_newest_first(provider, tmp_path):
    launch(provider, 3)
    (tmp_path / "release.json").write_text(json.dumps(["rb-instance-1", "rb-instance-2", "rb-instance-3"]))
    workers(provider)
    assert workers(provider) == []
    terminated = [e["instance"] for e in events(provider) if e["event"] == "terminated"]
    assert terminated == ["rb-instance-3", "rb-instance-2", "rb-instance-1"]


def test_a_raylet_that_dies_is_logged_lost_and_its_node_is_gone(provider):
    launch(provider, 2)
    victim = workers(provider)[0]
    instance = provider.node_tags(victim)["rb-instance"]
    provider.started[victim].raylet.exit_code = 1                    # crashed behind our back
    assert victim not in workers(provider) and len(workers(provider)) == 1
    (lost,) = [e for e in events(provider) if e["event"] == "terminated"]
    assert (lost["instance"], lost["reason"]) == (instance, "lost")


def emulating(tmp_path, monkeypatch, emulation):
    """A provider with an on-demand and a spot node type that emulates spot reclaims."""
    monkeypatch.setenv("RAY_FAKE_CLUSTER", "1")
    started: dict[str, FakeNode] = {}

    def start_node(node_id, node_config, tags, resources, labels):
        started[node_id] = FakeNode(1000 + len(started))
        return started[node_id]

    types = {"fake_gpu": {"market": "on-demand"}, "fake_gpu_spot": {"market": "spot"}}
    p = LocalNodeProvider({"state_dir": str(tmp_path), "provision_latency_s": 0, "seed": 0, "gcs_address": "127.0.0.1:1",
                           "launch_multiple": True, "node_types": types, "spot_emulation": emulation.to_dict()},
                          "rb-test", start_node=start_node)
    p.started = started
    return p, started


def test_spot_emulation_gives_notice_on_the_metadata_endpoint_then_reclaims_the_node(tmp_path, monkeypatch):
    from rubberband.executor.spot_notice import instance_action
    from rubberband.providers.spot_emulation import SpotEmulation

    p, started = emulating(tmp_path, monkeypatch, SpotEmulation(life_s=1.0, notice_s=0.6))
    for node_type in ("fake_gpu", "fake_gpu_spot"):
        p.create_node_with_resources_and_labels({}, {TAG_RAY_USER_NODE_TYPE: node_type}, 1, {"CPU": 1, "GPU": 2}, {})
    deadline = time.time() + 5
    while sum(e["event"] == "ready" for e in events(p)) < 2 and time.time() < deadline:
        time.sleep(0.01)
    requests = {e["instance"]: e["market"] for e in events(p) if e["event"] == "request"}
    spot = next(i for i, m in requests.items() if m == "spot")
    (ready,) = [e for e in events(p) if e["event"] == "ready" and e["instance"] == spot]
    running_at = next(e["t"] for e in events(p) if e["event"] == "running" and e["instance"] == spot)
    assert instance_action(ready["metadata_url"]) is None                 # 404 before the notice
    while not any(e["event"] == "terminated" for e in events(p)) and time.time() < deadline:
        action = instance_action(ready["metadata_url"])
        if action:
            seen = action
        time.sleep(0.05)
    assert seen["action"] == "terminate"
    (notice,) = [e for e in events(p) if e["event"] == "notice"]
    assert notice["instance"] == spot and notice["reclaim_at"] == pytest.approx(running_at + 1.0, abs=0.05)
    assert notice["t"] == pytest.approx(running_at + 0.4, abs=0.3)
    (gone,) = [e for e in events(p) if e["event"] == "terminated"]
    assert (gone["instance"], gone["reason"]) == (spot, "interrupted")
    assert gone["t"] == pytest.approx(running_at + 1.0, abs=0.3)
    assert len(workers(p)) == 1 and p.node_tags(workers(p)[0])["rb-instance"] != spot      # on-demand untouched
    spot_node = next(n for n in started.values() if n.killed)
    assert spot_node.killed and sum(n.killed for n in started.values()) == 1


def test_the_cap_on_reclaims_counts_only_instances_still_up_at_their_notice(tmp_path, monkeypatch):
    from rubberband.providers.spot_emulation import SpotEmulation

    p, _ = emulating(tmp_path, monkeypatch, SpotEmulation(life_s=0.6, max_reclaims=1))
    for _ in range(2):
        p.create_node_with_resources_and_labels({}, {TAG_RAY_USER_NODE_TYPE: "fake_gpu_spot"}, 1, {"CPU": 1, "GPU": 2}, {})
    deadline = time.time() + 5
    while sum(e["event"] == "ready" for e in events(p)) < 2 and time.time() < deadline:
        time.sleep(0.01)
    first, second = sorted(workers(p), key=lambda n: p.node_tags(n)["rb-instance"])
    p.terminate_node(first)                                  # released before its reclaim: not one of the cap
    while not any(e.get("reason") == "interrupted" for e in events(p)) and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    ended = [(e["instance"], e["reason"]) for e in events(p) if e["event"] == "terminated"]
    assert ended == [("rb-instance-1", "released"), ("rb-instance-2", "interrupted")]


def slow_provider(tmp_path, monkeypatch, start_s):
    """A provider whose raylets take ``start_s`` to start (Ray's takes 1-2 s on this machine)."""
    monkeypatch.setenv("RAY_FAKE_CLUSTER", "1")
    started: dict[str, FakeNode] = {}

    def slow_start(node_id, node_config, tags, resources, labels):
        time.sleep(start_s)
        started[node_id] = FakeNode(1000 + len(started))
        return started[node_id]

    p = LocalNodeProvider({"state_dir": str(tmp_path), "provision_latency_s": 0, "seed": 0,
                           "gcs_address": "127.0.0.1:1", "launch_multiple": True}, "rb-test", start_node=slow_start)
    p.started = started
    return p


def test_nodes_launched_together_start_their_raylets_at_once(tmp_path, monkeypatch):
    # A cloud boots instances side by side: two nodes launched together are both ready one
    # raylet start after they run, not the second one start after the first (raylets started
    # one at a time under the provider's lock made a two-instance stage 0 late by one start).
    p = slow_provider(tmp_path, monkeypatch, start_s=0.6)
    launch(p, 2)
    log = events(p)
    running = sorted(e["t"] for e in log if e["event"] == "running")
    ready = sorted(e["t"] for e in log if e["event"] == "ready")
    assert len(running) == 2 and len(ready) == 2
    assert running[1] < ready[0]                      # provisioning is not held back by a raylet
    assert ready[1] - running[0] < 0.6 + 0.3          # one at a time: >= 1.2 s
    assert len(workers(p)) == 2 and all(p._raylet(p._nodes[n]["node"]) is not None for n in workers(p))


def test_a_node_released_while_its_raylet_starts_is_stopped_once_up(tmp_path, monkeypatch):
    p = slow_provider(tmp_path, monkeypatch, start_s=0.5)
    p.create_node_with_resources_and_labels({}, {TAG_RAY_USER_NODE_TYPE: "fake_gpu"}, 1, {"CPU": 1, "GPU": 2}, {})
    deadline = time.time() + 5
    while not any(e["event"] == "running" for e in events(p)) and time.time() < deadline:
        time.sleep(0.01)
    (node,) = workers(p)
    p.terminate_node(node)                            # the raylet is still starting
    while not p.started and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert workers(p) == [] and p.started[node].killed
    assert [e["event"] for e in events(p)] == ["request", "running", "terminated"]      # never `ready`
