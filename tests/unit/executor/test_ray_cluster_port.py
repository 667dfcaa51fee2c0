"""The Ray cluster port's demand by node type: one slot bundle per wanted instance, plus one
per noticed instance still up until shortly before its reclaim (so its replacement launches
beside it, and is not launched twice)."""

from __future__ import annotations

import pytest

from rubberband.errors import ProviderError
from rubberband.executor.ports import Node
from rubberband.executor.ray_runner import RayClusterPort
from rubberband.nodes import NodeType

OD, SPOT = NodeType("local.2gpu"), NodeType("local.2gpu", "spot")


class Port(RayClusterPort):
    """The port over a fixed list of live nodes instead of a Ray cluster."""

    def __init__(self, alive: list[Node]):
        self.asked: list[list[dict]] = []
        self.now = 1_000.0          # the wall clock, moved by hand
        super().__init__(2, [OD, SPOT], request=lambda bundles: self.asked.append(bundles), clock=lambda: self.now)
        self.live = alive

    def _alive(self, events=None):
        return [n for n in self.live if n.name not in self.released]


def test_the_request_names_each_node_types_slot():
    port = Port([])
    port.scale_to({OD: 1, SPOT: 2}, stage=0)
    assert port.asked[-1] == [{"rb-slot-local_2gpu": 1}] + [{"rb-slot-local_2gpu_spot": 1}] * 2
    port.scale_to({OD: 1, SPOT: 2}, stage=0)
    assert len(port.asked) == 1                                 # an unchanged demand is not sent again


def test_a_noticed_instance_counts_until_half_its_notice_before_the_reclaim():
    nodes = [Node("rb-instance-1", 2, OD), Node("rb-instance-2", 2, SPOT)]
    port = Port(nodes)
    port.scale_to({OD: 1, SPOT: 1}, stage=0)
    port._reclaim_times["rb-instance-2"] = port.now + 4.0          # what the watcher's notice said
    port.replace("rb-instance-2")
    assert port.asked[-1] == [{"rb-slot-local_2gpu": 1}] + [{"rb-slot-local_2gpu_spot": 1}] * 2   # its replacement
    assert port.nodes() == [nodes[0]] and port.doomed() == ["rb-instance-2"]
    until = port.noticed["rb-instance-2"][1]
    assert until == port.now + 2.0                                  # half the 4 s notice
    port.now = until + 0.01                                         # that moment has passed
    port._push()
    assert port.asked[-1] == [{"rb-slot-local_2gpu": 1}, {"rb-slot-local_2gpu_spot": 1}]
    port.release(["rb-instance-2"], stage=0)                        # let go: no longer noticed
    assert port.doomed() == [] and port.noticed == {}


def test_a_wait_returns_none_when_its_until_comes_first_and_the_nodes_when_they_are_up():
    nodes = [Node("rb-instance-1", 2, SPOT)]
    port = Port(nodes)
    port.poll_s = 0.0
    assert port.wait_nodes({SPOT: 2}, timeout_s=60, until=port.now) is None     # the driver's Wake is due
    assert port.wait_nodes({SPOT: 1}, timeout_s=60, until=port.now) == nodes     # met: the nodes, wake or not
    with pytest.raises(ProviderError, match=r"waited 0s for 2 x local\.2gpu\.spot"):
        port.wait_nodes({SPOT: 2}, timeout_s=0, until=port.now + 60)              # no wake before the timeout


def test_a_wait_counts_instances_asked_for_a_later_stage_as_no_surplus():
    # An eager target's instance (DESIGN §4.6), asked for beside the stage's: up or not, the stage's
    # wait is met by its own, and the target's is never released as a surplus.
    nodes = [Node("rb-instance-1", 2, OD), Node("rb-instance-2", 2, OD)]
    port = Port(nodes)
    port.poll_s = 0.0
    port.scale_to({OD: 2}, stage=1)
    assert port.wait_nodes({OD: 1}, timeout_s=60, extra={OD: 1}) == nodes          # both up: met
    assert port.released == set()
    port.live = nodes[:1]
    assert port.wait_nodes({OD: 1}, timeout_s=60, extra={OD: 1}) == nodes[:1]      # the target's still coming
    with pytest.raises(ProviderError):
        port.wait_nodes({OD: 2}, timeout_s=0, extra={OD: 1})                        # the stage's own are not up
