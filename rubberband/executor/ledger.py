"""The run's ledger: every instance launched (request, running, ready, release) and every
trial run, with the actual cost computed by the simulator's own billing rules.

Each instance carries its market and that market's price: a spot instance is billed at the
spot price from its launch to its release or reclaim (DESIGN §4.1), an on-demand one at the
on-demand price."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rubberband.profiles.cloud import BillingModel, CloudProfile
from rubberband.providers.base import Release
from rubberband.providers.node_types import MARKETS, SPOT
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
    gpus: int
    start_s: float
    end_s: float
    iters: int
    iter_s: list[float] = field(default_factory=list)   # each iteration's compute, as the workers timed it


@dataclass
class Ledger:
    """Instances and trial runs of one run, and what they cost."""

    cloud: CloudProfile
    instances: dict[str, InstanceRecord] = field(default_factory=dict)
    trials: list[TrialRun] = field(default_factory=list)
    stage_windows: list[tuple[float, float]] = field(default_factory=list)
    launch_errors: list[dict[str, Any]] = field(default_factory=list)   # failed launch attempts, as the provider reported them

    def request(self, instance_id: str, at_s: float, stage: int, market: str | None = None) -> InstanceRecord:
        """Record a requested instance on ``market`` (default: the cloud profile's), at its price."""
        market = market or self.cloud.market.value
        rec = InstanceRecord(instance_id, self.cloud.instance_type, self.price_usd_per_hour(market), at_s, stage,
                             market=market)
        self.instances[instance_id] = rec
        return rec

    def price_usd_per_hour(self, market: str) -> float:
        """The hourly price of ``market`` for the run's instance type (a profile that knows no
        spot price prices everything at the plan's market price)."""
        if market == SPOT and self.cloud.spot_price_usd_per_hour is None:
            return self.cloud.hourly_usd
        return self.cloud.price(market)

    def running(self) -> list[InstanceRecord]:
        return [r for r in self.instances.values() if r.released_s is None]

    def instance_cost_usd(self, rec: InstanceRecord, now: float) -> float:
        """Billed cost of one instance: lifetime rounded up and at least the minimum (per-instance)."""
        if rec.launched_s is None:
            return 0.0
        billed = float(billed_seconds(rec.lifetime_s(now), self.cloud.billing))
        return billed * rec.price_usd_per_hour / 3600.0

    def cost_usd(self, now: float) -> float:
        """Actual cost so far with the simulator's billing rules (DESIGN §4)."""
        data = self.cloud.data.usd_per_launch * sum(1 for r in self.instances.values() if r.launched_s is not None)
        if self.cloud.billing.model is BillingModel.PER_FUNCTION:
            compute = sum(t.gpus * (t.end_s - t.start_s) for t in self.trials) * self.cloud.usd_per_second / self.cloud.gpus_per_instance
        else:
            compute = sum(self.instance_cost_usd(r, now) for r in self.instances.values())
        return compute + data

    def stage_costs(self, now: float) -> list[float]:
        """Cost attributed to each stage window: instance-seconds inside it, data at launch,
        and each instance's billing rounding at the stage that released it."""
        costs = [0.0] * len(self.stage_windows)
        if not costs:
            return costs
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
