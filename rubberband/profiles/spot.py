"""Spot market models (DESIGN §4.1): when the cloud reclaims a spot instance, and how much notice it gives.

Two preemption models, exactly one per instance type:

* ``rate_per_hour: λ`` — each instance's lifetime from the end of its SCALE is exponential with
  rate λ per hour, independent of every other instance.
* ``trace: {file, zone}`` — a zone's recorded availability, replayed from a uniformly random
  offset per Monte-Carlo sample (cyclically: a 45-day trace outlasts any tuning job). While it
  says unavailable a spot request waits; when it turns unavailable every spot instance of the
  zone is reclaimed together.
* ``trace: {file, zone, nodes: n}`` (a gang trace, ``n`` > 1) — how many of ``n`` spot
  instances the zone granted over time: a cap on how many can be held at once. Spot
  instances are ranked (a plan's j-th spot instance, oldest first, keeps its rank when
  replaced): the j-th is held only while at least ``j + 1`` are available, so when the count
  drops the newest ranks are reclaimed, and a request above the cap waits until the count
  rises. A plan holds at most ``n`` spot instances on such a trace.

For types without a trace, ``advisor_rate_per_hour`` turns the AWS Spot Instance Advisor's
interruption-frequency bucket into a rate. The Advisor's "frequency of interruption" is the
share of instances interrupted over a month; with exponential lifetimes a share ``f`` per
month of 730 h is ``λ = -ln(1 - f) / 730``, taken at the bucket's midpoint (25% for ">20%"):

=========  ==========  ==========
bucket     f (month)   λ per hour
=========  ==========  ==========
<5%        2.5%        0.000035
5-10%      7.5%        0.00011
10-15%     12.5%       0.00018
15-20%     17.5%       0.00026
>20%       25%         0.00039
=========  ==========  ==========

The shipped V100 traces (``cloud_profiles/aws/spot_traces``) show far more: 0.10–1.39
reclaims per *available hour* in 2023, three to four orders of magnitude above what the
"<5%/month" bucket suggests for GPU types. The Advisor's buckets are an optimistic prior;
prefer a trace, or a rate measured on the workload's own runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from rubberband.errors import SpecError
from rubberband.schema import check_mapping, did_you_mean, number

HOURS_PER_MONTH = 730.0
ADVISOR_BUCKETS = {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.25}


def advisor_rate_per_hour(bucket: str) -> float:
    """Reclaims per instance-hour for a Spot Instance Advisor interruption bucket (table above)."""
    if bucket not in ADVISOR_BUCKETS:
        raise SpecError(f"spot.preemption.advisor: unknown bucket {bucket!r}{did_you_mean(bucket, ADVISOR_BUCKETS)}; "
                        f"choose one of {', '.join(ADVISOR_BUCKETS)}")
    return -math.log1p(-ADVISOR_BUCKETS[bucket]) / HOURS_PER_MONTH


@dataclass(frozen=True, eq=False)
class SpotTrace:
    """A zone's availability as a step function: ``values[i]`` instances available from
    ``times_s[i]`` until the next change, over ``duration_s`` seconds (then it repeats)."""

    zone: str
    nodes: int
    times_s: np.ndarray = field(repr=False)
    values: np.ndarray = field(repr=False)
    duration_s: float
    source: str = ""

    def __post_init__(self) -> None:
        t, v = np.asarray(self.times_s, dtype=float), np.asarray(self.values, dtype=np.int64)
        where = f"spot trace {self.zone}"
        if t.ndim != 1 or t.shape != v.shape or len(t) == 0:
            raise SpecError(f"{where}: needs matching, non-empty change times and values")
        if t[0] != 0.0 or np.any(np.diff(t) <= 0) or self.duration_s <= t[-1]:
            raise SpecError(f"{where}: change times must start at 0, increase, and end before duration_s")
        if np.any(v < 0) or np.any(v > self.nodes):
            raise SpecError(f"{where}: availability must lie between 0 and nodes={self.nodes}")
        object.__setattr__(self, "times_s", t)
        object.__setattr__(self, "values", v)

    def available_at(self, t_s: np.ndarray | float) -> np.ndarray:
        """Instances available at ``t_s`` seconds from the trace's start (wrapping around)."""
        idx = np.searchsorted(self.times_s, np.mod(t_s, self.duration_s), side="right") - 1
        return self.values[idx]

    def next_change(self, t_s: np.ndarray | float, up: bool, at_least: int = 1) -> np.ndarray:
        """The first time ``>= t_s`` at which the zone is up (``up``: at least ``at_least``
        instances available) or down (fewer), wrapping around; ``inf`` where that never happens."""
        want = self.values >= at_least if up else self.values < at_least
        if not want.any():
            return np.full(np.shape(t_s), np.inf)
        t = np.asarray(t_s, dtype=float)
        cycles, local = np.divmod(t, self.duration_s)
        idx = np.searchsorted(self.times_s, local, side="right") - 1
        # The start of the next wanted run at or after each interval, on a doubled timeline.
        starts = np.flatnonzero(want)
        doubled = np.concatenate([self.times_s[starts], self.times_s[starts] + self.duration_s])
        k = np.searchsorted(doubled, self.times_s[idx], side="left")
        nxt = np.where(want[idx], local, doubled[np.minimum(k, len(doubled) - 1)])
        return cycles * self.duration_s + np.maximum(nxt, local)

    def window(self, start_s: float, end_s: float) -> SpotTrace:
        """The part of the trace from ``start_s`` to ``end_s`` as a trace of its own (e.g. the
        first half to plan with and the second to check the plan on)."""
        if not 0 <= start_s < end_s <= self.duration_s:
            raise SpecError(f"spot trace {self.zone}: window {start_s:g}..{end_s:g} s is not inside 0..{self.duration_s:g} s")
        inside = (self.times_s > start_s) & (self.times_s < end_s)
        times = np.concatenate([[0.0], self.times_s[inside] - start_s])
        values = np.concatenate([[self.available_at(start_s)], self.values[inside]])
        return SpotTrace(self.zone, self.nodes, times, values, end_s - start_s, source=self.source)

    @property
    def available_fraction(self) -> float:
        """Share of the trace's time with at least one instance available."""
        spans = np.diff(np.append(self.times_s, self.duration_s))
        return float(spans[self.values > 0].sum() / self.duration_s)

    @property
    def drops_per_available_hour(self) -> float:
        """Transitions from available to none, per hour available."""
        up = self.values > 0
        drops = int(np.sum(up & ~np.roll(up, -1)))      # the last run wraps round to the first
        return drops / (self.available_fraction * self.duration_s / 3600.0) if up.any() else 0.0


def load_trace(path: str | Path, zone: str, nodes: int = 1, where: str = "spot.preemption.trace") -> SpotTrace:
    """One zone's trace from a file written by ``scripts/derive_spot_traces.py``."""
    traces = _read_traces(str(Path(path).resolve()), where)
    matches = [t for t in traces if t["zone"] == zone and t["nodes"] == nodes]
    if not matches:
        zones = sorted({t["zone"] for t in traces if t["nodes"] == nodes})
        raise SpecError(f"{where}.zone: {zone!r} has no {nodes}-instance trace in {path}"
                        f"{did_you_mean(zone, zones)}; choose one of {', '.join(zones) or '(none)'}")
    t = matches[0]
    times, values = zip(*t["changes"])
    return SpotTrace(zone, nodes, np.array(times, dtype=float), np.array(values, dtype=np.int64),
                     float(t["duration_s"]), source=str(path))


def trace_zones(path: str | Path, nodes: int = 1) -> list[str]:
    """The zones a trace file covers with ``nodes``-instance traces."""
    return sorted({t["zone"] for t in _read_traces(str(Path(path).resolve()), "trace") if t["nodes"] == nodes})


@lru_cache(maxsize=8)
def _read_traces(path: str, where: str) -> tuple[dict[str, Any], ...]:
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{where}.file: no trace file at {path}; point it at e.g. "
                        f"cloud_profiles/aws/spot_traces/p3.2xlarge.json")
    try:
        doc = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SpecError(f"{where}.file: {path} is not a JSON trace file ({str(exc).splitlines()[0]}); "
                        f"write one with scripts/derive_spot_traces.py") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traces"), list) or not doc["traces"]:
        raise SpecError(f"{where}.file: {path} has no `traces:` list; write it with scripts/derive_spot_traces.py")
    out = []
    for i, t in enumerate(doc["traces"]):
        w = f"{where}.file: {path} traces[{i}]"
        t = check_mapping(t, w, required=("zone", "nodes", "duration_s", "changes"), optional=("start", "probe_s"))
        changes = t["changes"]
        if not isinstance(changes, list) or not changes or not all(
                isinstance(c, list) and len(c) == 2 and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in c)
                and float(c[1]).is_integer() and c[1] >= 0 for c in changes):
            raise SpecError(f"{w}.changes: expected a non-empty list of [seconds, instances available] pairs, "
                            "the count a whole number >= 0")
        number(t["duration_s"], f"{w}.duration_s", positive=True)
        out.append(t)
    return tuple(out)


_PREEMPTION_KINDS = ("rate_per_hour", "trace", "advisor")


@dataclass(frozen=True, eq=False)
class SpotMarket:
    """How one instance type's spot market behaves (DESIGN §4.1).

    ``rate_per_hour`` (exponential lifetimes) and ``trace`` (a zone's replayed availability) are
    mutually exclusive; ``advisor`` is a Spot Advisor bucket turned into a rate. ``notice_s`` is
    the interruption notice: a replacement is requested that long before the reclaim.
    """

    notice_s: float = 0.0
    rate_per_hour: float = 0.0
    trace: SpotTrace | None = None
    advisor: str | None = None
    trace_file: str | None = None
    explicit: bool = False        # a preemption model was given (even "rate_per_hour: 0")

    def __post_init__(self) -> None:
        number(self.notice_s, "spot.notice_s", minimum=0)
        number(self.rate_per_hour, "spot.preemption.rate_per_hour", minimum=0)
        if self.trace is not None and self.rate_per_hour:
            raise SpecError("spot.preemption: give exactly one of rate_per_hour, trace or advisor")
        if self.trace is not None:
            if not (self.trace.values > 0).any():
                raise SpecError(f"spot.preemption.trace.zone: {self.trace.zone} never has spot capacity in this trace; "
                                "choose another zone")

    @property
    def modelled(self) -> bool:
        """Whether a preemption model was given (else spot instances are assumed never reclaimed)."""
        return self.explicit or self.at_risk or self.advisor is not None

    @property
    def at_risk(self) -> bool:
        """Whether an instance of this market can be reclaimed at all."""
        return self.rate_per_hour > 0 or self.trace is not None

    def __eq__(self, other: object) -> bool:
        # Two windows of one trace file name the same file and zone: the trace itself decides.
        return isinstance(other, SpotMarket) and self.to_dict() == other.to_dict() and (
            self.trace is other.trace or (self.trace is not None and other.trace is not None
                                          and self.trace.duration_s == other.trace.duration_s
                                          and np.array_equal(self.trace.times_s, other.trace.times_s)
                                          and np.array_equal(self.trace.values, other.trace.values)))

    def __hash__(self) -> int:
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    @classmethod
    def from_dict(cls, data: Any, where: str = "spot") -> SpotMarket:
        """Read a ``spot:`` block (a relative trace ``file``: see ``resolve_trace_file``)."""
        data = check_mapping(data, where, optional=("notice_s", "preemption"))
        notice = number(data.get("notice_s", 0.0), f"{where}.notice_s", minimum=0)
        pre = data.get("preemption")
        if pre is None:
            return cls(notice_s=notice)
        pre = check_mapping(pre, f"{where}.preemption", optional=_PREEMPTION_KINDS)
        given = [k for k in _PREEMPTION_KINDS if pre.get(k) is not None]
        if len(given) != 1:
            raise SpecError(f"{where}.preemption: give exactly one of {', '.join(_PREEMPTION_KINDS)}"
                            f" (got {', '.join(given) or 'none'}), e.g. {{rate_per_hour: 0.2}}")
        kind = given[0]
        if kind == "rate_per_hour":
            return cls(notice, number(pre[kind], f"{where}.preemption.rate_per_hour", minimum=0), explicit=True)
        if kind == "advisor":
            bucket = str(pre[kind])
            return cls(notice, advisor_rate_per_hour(bucket), advisor=bucket, explicit=True)
        spec = check_mapping(pre[kind], f"{where}.preemption.trace", required=("file", "zone"), optional=("nodes",))
        path = Path(str(spec["file"]))
        nodes = int(number(spec.get("nodes", 1), f"{where}.preemption.trace.nodes", positive=True))
        trace = load_trace(path, str(spec["zone"]), nodes, where=f"{where}.preemption.trace")
        return cls(notice, trace=trace, trace_file=str(path), explicit=True)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"notice_s": self.notice_s}
        if self.trace is not None:
            trace: dict[str, Any] = {"file": self.trace_file, "zone": self.trace.zone}
            if self.trace.nodes != 1:
                trace["nodes"] = self.trace.nodes
            out["preemption"] = {"trace": trace}
        elif self.advisor is not None:
            out["preemption"] = {"advisor": self.advisor}
        elif self.rate_per_hour or self.explicit:
            out["preemption"] = {"rate_per_hour": self.rate_per_hour}
        return out


def resolve_trace_file(spot: Any, base_dir: str | Path) -> Any:
    """A ``spot:`` mapping whose relative ``preemption.trace.file`` now resolves against
    ``base_dir`` (the folder of the file that named it); anything else is returned as is."""
    try:
        file = spot["preemption"]["trace"]["file"]
    except (TypeError, KeyError):
        return spot
    if not isinstance(file, str) or Path(file).is_absolute():
        return spot
    trace = {**spot["preemption"]["trace"], "file": str((Path(base_dir) / file).resolve())}
    return {**spot, "preemption": {**spot["preemption"], "trace": trace}}
