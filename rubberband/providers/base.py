"""The provider seam: what a compute provider offers the executor and the profiler, the names
of the events in its log, and the one registry by name that ``execute``, ``profile`` and the
CLI look providers up in.

A provider starts a cluster session (a Ray head whose autoscaler requests and terminates its
instances), records every instance's life in an event log (``ProviderEvent``, with a
``Release`` reason on ``terminated``), sweeps up after the head stopped, and lists (``status``)
or stops (``down``) whatever rubberband left running. The executor requests instances through
Ray's autoscaler and releases chosen ones by listing them in the cluster's ``release_file``.

Each provider owns what is its own: whether it launches from a Ray cluster YAML and how it
reads one, the node types of its cluster, whether it emulates spot reclaims and how
(``--spot-emulation``), and whether it starts a Ray cluster at all (``sim`` rehearses in virtual
time); the executor and the CLI ask the provider, never a provider's module.

Registering a provider is one line: ``register("name", "package.module:Factory")`` (imported
on first use, so the CLI never pays for a provider's SDK it does not use); a provider
subclasses ``ProviderBase`` for the defaults of what it does not offer.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rubberband.errors import SpecError
from rubberband.nodes import NodeType, node_types
from rubberband.profiles.cloud import CloudProfile
from rubberband.schema import did_you_mean


class ProviderEvent(enum.StrEnum):
    """The ``event`` of a provider event-log line (str-valued: the JSON logs read the same)."""

    REQUEST = "request"                  # the autoscaler asked for an instance (SCALE starts)
    RUNNING = "running"                  # launched: billing starts (end of SCALE)
    READY = "ready"                      # joined the Ray cluster (end of INIT_INSTANCE)
    TERMINATED = "terminated"            # gone; ``reason`` is a ``Release``
    NOTICE = "notice"                    # a spot interruption notice (``reclaim_at``; emulated reclaims)
    LAUNCH_ERROR = "launch_error"        # one launch attempt failed; retried
    LAUNCH_FAILED = "launch_failed"      # a launch given up (``fatal``: retrying cannot help)
    TERMINATE_ERROR = "terminate_error"  # still billing; retried on the next update
    DESCRIBE_ERROR = "describe_error"    # could not check the instances this update


class Release(enum.StrEnum):
    """Why an instance was terminated (the ``reason`` of a ``terminated`` event)."""

    RELEASED = "released"          # the executor (or the autoscaler) let it go
    INTERRUPTED = "interrupted"    # shut down behind our back: a spot reclaim
    LOST = "lost"                  # its Ray node died
    SHUTDOWN = "shutdown"          # still up when the cluster stopped (the sweep, or the ledger)
    CANCELLED = "cancelled"        # released before anything was launched


# The file protocol between the executor and a cluster's node provider, both in the run's
# provider state directory: the provider appends each ``ProviderEvent`` to the event log (one
# JSON object a line); the executor lists the instances it releases in the release file (a JSON
# list of instance names, rewritten whole), and the provider terminates them.
EVENTS_FILE = "events.jsonl"
RELEASE_FILE = "release.json"


# Where a spot instance reads its interruption notice: EC2's instance-metadata paths (IMDSv2
# token first), which a provider that emulates reclaims serves as well.
METADATA_TOKEN_PATH = "/latest/api/token"
METADATA_ACTION_PATH = "/latest/meta-data/spot/instance-action"


# What a cluster launches: one instance type's profile, or every type a run's plan uses (the
# plan's own first); and how many instances it may hold, in all or per instance type.
Clouds = CloudProfile | Sequence[CloudProfile]
Room = int | Mapping[str, int]


def clouds_of(cloud: Clouds) -> list[CloudProfile]:
    """The profiles of ``cloud``: itself, or each of them."""
    return [cloud] if isinstance(cloud, CloudProfile) else list(cloud)


def cluster_types(cloud: Clouds, max_instances: Room) -> dict[str, tuple[CloudProfile, int]]:
    """Each instance type a cluster launches (the plan's first) with its profile and how many
    of it the cluster may hold (``max_instances`` itself when it is one number)."""
    out: dict[str, tuple[CloudProfile, int]] = {}
    for c in clouds_of(cloud):
        room = max_instances if isinstance(max_instances, int) else max_instances.get(c.instance_type)
        if room is None:
            raise SpecError(f"cluster: no instance count for {c.instance_type}; say how many the cluster may hold")
        out.setdefault(c.instance_type, (c, int(room)))
    return out


# An instance's life ends with one of these.
ENDED = (ProviderEvent.TERMINATED, ProviderEvent.LAUNCH_FAILED)
LAUNCH_ERRORS = (ProviderEvent.LAUNCH_ERROR, ProviderEvent.LAUNCH_FAILED)


@runtime_checkable
class Cluster(Protocol):
    """A started cluster session, as the executor sees it."""

    run_id: str
    run_dir: Path

    @property
    def address(self) -> str:
        """The Ray head's address (``ray.init(address=...)``)."""

    @property
    def release_file(self) -> Path:
        """Where the executor lists the instances it releases (the provider terminates them)."""

    @property
    def requires_ready(self) -> bool:
        """Whether the provider logs ``ready`` when an instance's initialisation ends (else a
        live Ray node is ready: real EC2 workers join by themselves)."""

    def read_events(self) -> list[dict[str, Any]]:
        """The provider's event log, with the provider's own times where it gave them."""

    def stop(self) -> int:
        """Stop the head and every process of the cluster; return how many there were."""


@runtime_checkable
class Provider(Protocol):
    """What a provider offers the executor, the profiler, the CLI and ``down``/``status``
    (``ProviderBase`` gives the defaults of everything but the cluster's life)."""

    name: str
    cluster_yaml: bool      # launches from a Ray cluster YAML (``--cluster``, the experiment's ``cluster:``)
    starts_cluster: bool    # runs a job on a Ray cluster it starts (else it rehearses it in virtual time)
    emulates_spot: bool     # reclaims spot instances itself (``--spot-emulation``)

    def load_cluster_yaml(self, path: str | Path, instance_type: str) -> Any:
        """Read a Ray cluster YAML as this provider launches from it, for ``instance_type``
        (``validate`` reads the experiment's ``cluster:`` so, before any plan exists)."""

    def node_types(self, cloud: Clouds) -> list[NodeType]:
        """The node types a run's cluster offers the executor (``rubberband.nodes``)."""

    def spot_emulation(self, given: Any, cloud: CloudProfile, spot_instances: tuple[int, ...], seed: int) -> Any:
        """The provider's configuration for reclaiming a plan's spot instances itself
        (``given``: the ``--spot-emulation`` text, or an emulation already built).

        Raises:
            SpecError: the provider emulates no reclaims, or ``given`` does not fit the plan.
        """

    def describe(self, config: Any) -> str | None:
        """One line about a run's configuration worth printing as it starts (``None``: none)."""

    def check(self, cloud: Clouds, max_instances: Room, cluster: Any) -> Any:
        """Check the provider's configuration against the plan (each of its instance types, see
        ``cluster_types``) before anything starts or is written; return it checked (``start``
        and ``sweep`` get it back)."""

    def max_workers(self, config: Any, instance_type: str) -> int | None:
        """The most instances of ``instance_type`` the checked configuration lets the cluster
        hold (a cluster YAML's ``max_workers``), or ``None`` where it sets no limit."""

    def start(self, run_id: str, run_dir: Path, cloud: Clouds, max_instances: Room, config: Any, *,
              seed: int, latency_scale: float, launch_attempts: int, launch_backoff_s: float) -> Cluster:
        """Start the run's cluster head (its autoscaler launches instances of each type on request)."""

    def sweep(self, cluster: Cluster, config: Any) -> None:
        """After the head stopped: release anything of the run still up (raises if it cannot
        make sure; the caller says how to finish the job by hand)."""

    def down(self, run_id: str | None, regions: list[str], cluster_yamls: list[str]) -> dict[str, Any]:
        """Stop rubberband's clusters of this provider (or one run's): ``heads`` stopped, and
        for a cloud ``terminated`` instances, ``stopped_usd_per_hour`` and ``spent_usd``."""

    def status(self, run_id: str | None, regions: list[str], cluster_yamls: list[str]) -> dict[str, Any]:
        """What rubberband has running on this provider: ``heads``, and for a cloud
        ``instances``, ``usd_per_hour`` and ``spent_usd``."""


def cluster_node_types(cloud: Clouds) -> list[NodeType]:
    """The node types of a run's cluster: each instance type on-demand, and on spot when the
    type has a spot price."""
    return [t for c in clouds_of(cloud) for t in node_types(c.instance_type, c.spot_price_usd_per_hour is not None)]


class ProviderBase:
    """The defaults of a provider (see ``Provider``): no cluster YAML, a Ray cluster of each
    instance type on-demand and on spot, no emulated reclaims, nothing to describe."""

    name: str
    cluster_yaml = False
    starts_cluster = True
    emulates_spot = False

    def load_cluster_yaml(self, path: str | Path, instance_type: str) -> Any:
        raise SpecError(f"cluster: the {self.name} provider takes no Ray cluster YAML")

    def node_types(self, cloud: Clouds) -> list[NodeType]:
        return cluster_node_types(cloud)

    def spot_emulation(self, given: Any, cloud: CloudProfile, spot_instances: tuple[int, ...], seed: int) -> Any:
        require_spot_emulation(self)

    def describe(self, config: Any) -> str | None:
        return None

    def max_workers(self, config: Any, instance_type: str) -> int | None:
        return None


# `--spot-emulation` given alone: reclaim by the plan's own preemption model.
SPOT_EMULATION_FROM_PLAN = "model"
SPOT_EMULATION_FLAG = "--spot-emulation"


def require_spot_emulation(provider: Provider | ProviderBase) -> None:
    """Refuse ``--spot-emulation`` on a provider that emulates no reclaims.

    Raises:
        SpecError: one line naming the flag and the providers that do emulate them.
    """
    if provider.emulates_spot:
        return
    emulating = [n for n in names() if get(n).emulates_spot]
    raise SpecError(f"{SPOT_EMULATION_FLAG}: only the {' or '.join(emulating)} provider emulates reclaims (the "
                    f"{provider.name} provider's spot instances are reclaimed by the cloud, or by its own model); "
                    f"drop the flag or run with --provider {emulating[0]}")


def load_cluster_yaml(path: str | Path, instance_type: str) -> Any:
    """``path`` read as a Ray cluster YAML by the provider that launches from one (the first
    registered that reads it), for ``instance_type``.

    Raises:
        SpecError: the error of the first provider that takes a cluster YAML.
    """
    errors = []
    for name in names():
        provider = get(name)
        if provider.cluster_yaml:
            try:
                return provider.load_cluster_yaml(path, instance_type)
            except SpecError as exc:
                errors.append(exc)
    if not errors:
        raise SpecError("cluster: no provider launches from a Ray cluster YAML; remove `cluster:`")
    raise errors[0]


def _sim() -> Provider:
    """The ``sim`` provider (``providers.sim``) with the defaults of ``ProviderBase``: rehearsal in
    virtual time, so it starts no Ray cluster."""
    from rubberband.providers.sim import SimProvider

    class Sim(SimProvider, ProviderBase):
        starts_cluster = False

    return Sim()


DEFAULT = "local"       # the provider a command runs on when none is named

# name -> "module:Factory" (imported on first use) or a factory.
_REGISTRY: dict[str, str | Callable[[], Provider]] = {
    "local": "rubberband.providers.local:LocalProvider",
    "aws": "rubberband.providers.aws_cluster:AwsProvider",
    "sim": _sim,      # rehearsal in virtual time (no Ray cluster)
}
_LOADED: dict[str, Provider] = {}


def register(name: str, factory: str | Callable[[], Provider]) -> None:
    """Make a provider available by name: ``"package.module:Factory"`` or a factory."""
    _REGISTRY[name] = factory
    _LOADED.pop(name, None)


def names() -> tuple[str, ...]:
    """Every registered provider's name."""
    return tuple(_REGISTRY)


def get(name: str, where: str = "provider") -> Provider:
    """The provider registered as ``name``.

    Raises:
        SpecError: no such provider (naming ``where``, the closest name and every valid one).
    """
    if name not in _REGISTRY:
        raise SpecError(f"{where}: unknown provider {name!r}{did_you_mean(name, names())}; "
                        f"choose one of {', '.join(names())}")
    if name not in _LOADED:
        factory = _REGISTRY[name]
        if isinstance(factory, str):
            module, attr = factory.split(":")
            factory = getattr(importlib.import_module(module), attr)
        _LOADED[name] = factory()
    return _LOADED[name]


def cluster_yaml_for(provider: Provider, given: Any, default: Any = None, where: str = "--cluster") -> Any:
    """The Ray cluster YAML a session on ``provider`` launches from: ``given`` (``--cluster``),
    else ``default`` (the experiment's ``cluster:``); ``None`` for a provider that takes none.

    Raises:
        SpecError: a YAML given to a provider that takes none, or none for one that needs it.
    """
    if not provider.cluster_yaml:
        if given is not None:
            takes = [n for n in names() if get(n).cluster_yaml]
            raise SpecError(f"{where}: the {provider.name} provider takes no Ray cluster YAML; drop it, or run on "
                            f"a provider that launches from one ({', '.join(takes)})")
        return None
    chosen = given or default
    if not chosen:
        raise SpecError(f"{where}: the {provider.name} provider needs a Ray cluster YAML (region, node type, AMI, "
                        "subnets); pass --cluster PATH or set `cluster:` in the experiment")
    return chosen
