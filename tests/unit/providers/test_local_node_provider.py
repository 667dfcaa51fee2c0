"""The local node provider's release handling, without starting Ray."""

import json
import threading

from rubberband.providers.local_node_provider import LocalNodeProvider


def _provider(tmp_path, instances):
    p = object.__new__(LocalNodeProvider)       # no Ray: only what _terminate_released reads
    p._state_dir = str(tmp_path)
    p.lock = threading.RLock()
    p._nodes = {f"node-{i}": {"tags": {"rb-instance": name}} for i, name in enumerate(instances)}
    p._release_seen = set()
    p.terminated = []
    p.terminate_node = lambda nid: (p.terminated.append(nid), p._nodes.pop(nid))
    return p


def test_a_release_is_carried_out_on_the_update_after_the_one_that_first_sees_it(tmp_path):
    # An autoscaler update reads the resource demand before it lists the provider's nodes: the
    # update that first sees a release may act on a demand from before the executor lowered
    # it, and would relaunch a node terminated then.
    p = _provider(tmp_path, ["rb-instance-1", "rb-instance-2", "rb-instance-3"])
    p._terminate_released()
    assert p.terminated == []                                    # nothing released yet
    (tmp_path / "release.json").write_text(json.dumps(["rb-instance-3"]))
    p._terminate_released()
    assert p.terminated == []                                    # first seen: wait one update
    p._terminate_released()
    assert p.terminated == ["node-2"]
    (tmp_path / "release.json").write_text(json.dumps(["rb-instance-2", "rb-instance-3"]))
    p._terminate_released()
    assert p.terminated == ["node-2"]                            # rb-instance-2 first seen now
    p._terminate_released()
    assert p.terminated == ["node-2", "node-1"] and list(p._nodes) == ["node-0"]
