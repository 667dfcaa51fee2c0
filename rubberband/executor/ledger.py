"""The run's ledger: every instance launched (request, running, ready, release) and every
trial run, with the actual cost computed by the simulator's own billing rules.

Each instance carries its instance type, its market and that market's price: a spot instance
is billed at the spot price from its launch to its release or reclaim (DESIGN §4.1), an
on-demand one at the on-demand price. A run whose stages use several instance types bills each
instance by its own type's profile (price, billing rules, data cost per launch): the ledger
splits into one ledger per type (``by_type``) and adds them up."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rubberband.errors import SpecError
from rubberband.nodes import MARKETS, SPOT
from rubberband.profiles.cloud import BillingModel, CloudProfile
from rubberband.providers.base import Release
from rubberband.simulator.model import billed_seconds


@dataclass
class InstanceRecord:
    """One instance, with times in seconds since the run started (``None`` until known)."""

    instance_id: str
    instance_type: str
    price_usd_per_hour: float
    requested_s: float
    stage_requested: int
    launched_s: float | None = None     # running: billing starts here (end of SCALE)
    ready_s: float | None = None        # joined the Ray cluster (end of INIT_INSTANCE)
    released_s: float | None = None
    stage_released: int | None = None
    provider_id: str | None = None      # e.g. the EC2 instance id
    market: str | None = None           # on-demand or spot
    release_reason: str | None = None   # a providers.base.Release: released, interrupted (spot reclaim), lost, ...
    owner_stage: int | None = None      # billed wholly to this stage (an eager target's, DESIGN §4.6)

    def lifetime_s(self, now: float) -> float:
        if self.launched_s is None:
            return 0.0
        end = self.released_s if self.released_s is not None else now
        return max(0.0, end - self.launched_s)


@dataclass
class TrialRun:
    """One TRAIN node as it really ran."""

    trial: str
    stage: int
    gpus: float                         # GPUs held: 1/k of one for a packed TRAIN, k trials to a GPU
    start_s: float
    end_s: float
    iters: int
    iter_s: list[float] = field(default_factory=list)   # each iteration's compute, as the workers timed it
    instance_type: str | None = None    # what it ran on (None: the ledger's own type)
    instances: list[str] = field(default_factory=list)   # the instance of each rank, where it finished
    gpu_ids: list[list[str]] | None = None   # each rank's GPU ids on its instance (None: not reported)
    redone: int = 0                     # iterations trained again first, beyond ``iters`` (DESIGN §4)


@dataclass
class Ledger:
    """Instances and trial runs of one run, and what they cost."""

    cloud: CloudProfile
    instances: dict[str, InstanceRecord] = field(default_factory=dict)
    trials: list[TrialRun] = field(default_factory=list)
    stage_windows: list[tuple[float, float]] = field(default_factory=list)
    launch_errors: list[dict[str, Any]] = field(default_factory=list)   # failed launch attempts, as the provider reported them
    clouds: dict[str, CloudProfile] = field(default_factory=dict)        # the profile of each other instance type of the run

    def profile(self, instance_type: str | None) -> CloudProfile:
        """The profile ``instance_type`` is billed by (``None``: the run's own type)."""
        if instance_type is None or instance_type == self.cloud.instance_type:
            return self.cloud
        if instance_type not in self.clouds:
            raise SpecError(f"ledger: an instance of {instance_type}, which the plan has no profile for "
                            f"(it has {', '.join(dict.fromkeys([self.cloud.instance_type, *self.clouds]))})")
        return self.clouds[instance_type]

    def request(self, instance_id: str, at_s: float, stage: int, market: str | None = None,
                instance_type: str | None = None) -> InstanceRecord:
        """Record a requested instance of ``instance_type`` (default: the run's) on ``market``
        (default: the type's profile's), at its price."""
        cloud = self.profile(instance_type)
        market = market or cloud.market.value
        rec = InstanceRecord(instance_id, cloud.instance_type, self.price_usd_per_hour(market, cloud.instance_type),
                             at_s, stage, market=market)
        self.instances[instance_id] = rec
        return rec

    def price_usd_per_hour(self, market: str, instance_type: str | None = None) -> float:
        """The hourly price of ``market`` for ``instance_type`` (default: the run's; a profile
        that knows no spot price prices everything at its own market's price)."""
        cloud = self.profile(instance_type)
        if market == SPOT and cloud.spot_price_usd_per_hour is None:
            return cloud.hourly_usd
        return cloud.price(market)

    def types(self) -> list[str]:
        """The instance types of the run's records, the run's own first."""
        return list(dict.fromkeys([self.cloud.instance_type, *(r.instance_type for r in self.instances.values()),
                                   *(t.instance_type for t in self.trials if t.instance_type)]))

    def by_type(self) -> dict[str, Ledger]:
        """One ledger per instance type, each with its own records and profile (the run's first)."""
        return {t: Ledger(self.profile(t),
                          {k: r for k, r in self.instances.items() if r.instance_type == t},
                          [x for x in self.trials if (x.instance_type or self.cloud.instance_type) == t],
                          list(self.stage_windows), [e for e in self.launch_errors if t == self.cloud.instance_type])
                for t in self.types()}

    def running(self) -> list[InstanceRecord]:
        return [r for r in self.instances.values() if r.released_s is None]

    def instance_cost_usd(self, rec: InstanceRecord, now: float) -> float:
        """Billed cost of one instance: lifetime rounded up and at least the minimum, by its own
        type's billing rules (per-instance)."""
        if rec.launched_s is None:
            return 0.0
        billed = float(billed_seconds(rec.lifetime_s(now), self.profile(rec.instance_type).billing))
        return billed * rec.price_usd_per_hour / 3600.0

    def cost_usd(self, now: float) -> float:
        """Actual cost so far with the simulator's billing rules (DESIGN §4)."""
        if len(self.types()) > 1:
            return sum(x.cost_usd(now) for x in self.by_type().values())
        data = self.cloud.data.usd_per_launch * sum(1 for r in self.instances.values() if r.launched_s is not None)
        if self.cloud.billing.model is BillingModel.PER_FUNCTION:
            compute = sum(t.gpus * (t.end_s - t.start_s) for t in self.trials) * self.cloud.usd_per_second / self.cloud.gpus_per_instance
        else:
            compute = sum(self.instance_cost_usd(r, now) for r in self.instances.values())
        return compute + data

    def own(self, timeline: list[dict[str, Any]]) -> None:
        """Instances the driver requested for a later stage (an eager target's, DESIGN §4.6: its
        ``owned`` events) are billed wholly to that stage, as the model bills them."""
        for e in timeline:
            if e.get("event") == "owned" and e.get("instance") in self.instances:
                self.instances[e["instance"]].owner_stage = int(e["stage"])

    def stage_costs(self, now: float) -> list[float]:
        """Cost attributed to each stage window: instance-seconds inside it, data at launch,
        and each instance's billing rounding at the stage that released it."""
        costs = [0.0] * len(self.stage_windows)
        if not costs:
            return costs
        if len(self.types()) > 1:
            return [sum(c) for c in zip(*(x.stage_costs(now) for x in self.by_type().values()))]
        # Time before the first window or after the last (an instance the provider terminates
        # a moment after the final SYNC) belongs to the first or last stage.
        windows = list(self.stage_windows)
        windows[0] = (-float("inf"), windows[0][1])
        windows[-1] = (windows[-1][0], float("inf"))
        for rec in self.instances.values():
            if rec.launched_s is None:
                continue
            end = rec.released_s if rec.released_s is not None else now
            per_s = rec.price_usd_per_hour / 3600.0
            owner = rec.owner_stage
            if owner is not None:        # an eager target's: all of it to its stage, as the model bills it
                owner = min(owner, len(costs) - 1)
                if self.cloud.billing.model is BillingModel.PER_INSTANCE:
                    costs[owner] += self.instance_cost_usd(rec, now)       # its life, rounded
                costs[owner] += self.cloud.data.usd_per_launch
                continue
            for i, (a, b) in enumerate(windows):
                if self.cloud.billing.model is BillingModel.PER_INSTANCE:
                    costs[i] += max(0.0, min(b, end) - max(a, rec.launched_s)) * per_s
            costs[min(rec.stage_requested, len(costs) - 1)] += self.cloud.data.usd_per_launch
            if self.cloud.billing.model is BillingModel.PER_INSTANCE:
                rounding = self.instance_cost_usd(rec, now) - rec.lifetime_s(now) * per_s
                last = rec.stage_released if rec.stage_released is not None else len(costs) - 1
                costs[min(last, len(costs) - 1)] += rounding
        if self.cloud.billing.model is BillingModel.PER_FUNCTION:
            for t in self.trials:
                costs[t.stage] += t.gpus * (t.end_s - t.start_s) * self.cloud.usd_per_second / self.cloud.gpus_per_instance
        return costs

    def by_market(self, now: float) -> dict[str, dict[str, Any]]:
        """Per market: instances launched, how many the cloud reclaimed, and their cost."""
        out: dict[str, dict[str, Any]] = {}
        for market in MARKETS:
            recs = [r for r in self.instances.values() if r.market == market and r.launched_s is not None]
            if recs:
                out[market] = {"instances": len(recs),
                               "reclaimed": sum(1 for r in recs if r.release_reason == Release.INTERRUPTED),
                               "price_usd_per_hour": recs[0].price_usd_per_hour,
                               "cost_usd": sum(self.instance_cost_usd(r, now) for r in recs)}
        return out

    def to_dict(self, now: float) -> dict[str, Any]:
        """The ledger as ``result.json`` has it. With several instance types: ``instance_type``
        joins them (``local.1gpu/local.2gpu``), ``markets`` is per market and type
        (``on-demand local.1gpu``), ``price_usd_per_hour`` and ``billing`` are per type, and
        ``by_type`` holds each type's own ledger."""
        if len(self.types()) > 1:
            dicts = {t: x.to_dict(now) for t, x in self.by_type().items()}
            first = next(iter(dicts.values()))
            return {**first, "instance_type": "/".join(dicts),
                    "price_usd_per_hour": {t: d["price_usd_per_hour"] for t, d in dicts.items()},
                    "billing": {t: d["billing"] for t, d in dicts.items()}, "cost_usd": sum(d["cost_usd"] for d in dicts.values()),
                    "instances": [i for d in dicts.values() for i in d["instances"]],
                    "trials": [t for d in dicts.values() for t in d["trials"]], "launch_errors": list(self.launch_errors),
                    "by_type": dicts,
                    "markets": {f"{m} {t}": v for t, d in dicts.items() for m, v in d["markets"].items()}}
        return {
            "instance_type": self.cloud.instance_type,
            "price_usd_per_hour": self.cloud.hourly_usd,
            "billing": self.cloud.billing.to_dict(),
            "cost_usd": self.cost_usd(now),
            "instances": [{**asdict(r), "cost_usd": self.instance_cost_usd(r, now)} for r in self.instances.values()],
            "markets": self.by_market(now),
            "trials": [asdict(t) for t in self.trials],
            "stage_windows": [list(w) for w in self.stage_windows],
            "launch_errors": list(self.launch_errors),
        }
