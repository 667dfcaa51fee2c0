"""Node types and instances: what the executor asks a provider for — an instance type on a market.

A stage holds ``s`` spot and ``o`` on-demand instances of one type (DESIGN §4.1); each
(instance type, market) pair is one Ray node type of the cluster (``p3.2xlarge`` and
``p3.2xlarge.spot``), so the autoscaler can be asked for each separately. Every node of a
type carries one unit of the type's slot resource, never used by a task: asking Ray's
autoscaler for N bundles of it means "N instances of this type", whatever their GPUs are busy
with. A stage that later needs several instance types asks for several node types the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rubberband.errors import SpecError

SPOT = "spot"
ON_DEMAND = "on-demand"
MARKETS = (ON_DEMAND, SPOT)
SLOT_PREFIX = "rb-slot-"
# Every instance a provider launches is named ``rb-instance-<n>`` (n counts from 1 per run): the
# executor's name for it, a Ray custom resource its node carries, and the ``instance`` of its
# provider events and ``release.json`` entries.
INSTANCE_PREFIX = "rb-instance-"


def instance_name(n: int) -> str:
    """The ``n``-th instance of a run: ``rb-instance-<n>``."""
    return f"{INSTANCE_PREFIX}{n}"


@dataclass(frozen=True, order=True)
class NodeType:
    """An instance type on a market (``name``: ``p3.2xlarge`` or ``p3.2xlarge.spot``)."""

    instance_type: str
    market: str = ON_DEMAND

    def __post_init__(self) -> None:
        if self.market not in MARKETS:
            raise SpecError(f"market: expected {' or '.join(MARKETS)}, got {self.market!r}")

    @property
    def spot(self) -> bool:
        return self.market == SPOT

    @property
    def name(self) -> str:
        return f"{self.instance_type}.spot" if self.spot else self.instance_type

    @property
    def ray_name(self) -> str:
        """The Ray node type name (Ray's names may not contain dots)."""
        return self.name.replace(".", "_")

    @property
    def slot(self) -> str:
        """The custom resource one node of this type carries (see the module docstring)."""
        return SLOT_PREFIX + self.ray_name

    def __str__(self) -> str:
        return self.name


def node_types(instance_type: str, spot: bool) -> list[NodeType]:
    """The node types of a cluster for ``instance_type``: on-demand, and spot when it has a spot market."""
    return [NodeType(instance_type, ON_DEMAND)] + ([NodeType(instance_type, SPOT)] if spot else [])


def counts(types: Iterable[NodeType]) -> dict[NodeType, int]:
    """How many of each node type ``types`` lists."""
    out: dict[NodeType, int] = {}
    for t in types:
        out[t] = out.get(t, 0) + 1
    return out


def within(up: Mapping[NodeType, int], usable: Mapping[NodeType, int], waited: Mapping[NodeType, int],
           extra: Mapping[NodeType, int]) -> bool:
    """Whether a wait for ``waited`` instances is met: per type, at least that many up, and no
    more usable (up or not) than it and ``extra`` together (instances asked for too, not waited
    for: an eager target's, DESIGN §4.6); with no ``extra``, exactly ``waited`` up and nothing else."""
    types = {*up, *usable, *waited, *extra}
    return all(waited.get(t, 0) <= up.get(t, 0) and usable.get(t, 0) <= waited.get(t, 0) + extra.get(t, 0)
               for t in types)


def describe(request: Mapping[NodeType, int]) -> str:
    """``2 x p3.2xlarge.spot + 1 x p3.2xlarge`` (for messages)."""
    return " + ".join(f"{n} x {t}" for t, n in sorted(request.items()) if n) or "no instances"
