"""Choosing the Availability Zone of a spot plan: price x availability, by planning each.

A zone's spot market is its availability trace (DESIGN §4.1) and its spot price (where the
catalog knows it: ``CloudProfile.zone_spot_price``). A cheap zone that is rarely available
makes a plan wait for capacity and lose work, so neither number decides alone: the planner
plans the job once per candidate zone, each exactly as ``compile_plan`` would (same samples,
same seed), and keeps the cheapest plan that meets the deadline at the confidence asked. The
other zones' best plans go into ``Plan.considered`` so the choice can be checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rubberband.errors import InfeasibleDeadlineError, SpecError
from rubberband.plan.compile import compile_plan
from rubberband.plan.plan import Plan
from rubberband.profiles.cloud import CloudCatalog, CloudProfile, Market
from rubberband.profiles.model import ModelProfile
from rubberband.profiles.spot import trace_zones
from rubberband.schema import did_you_mean
from rubberband.spec.experiment import ExperimentSpec


def _profile(cloud: CloudProfile | CloudCatalog, instance_type: str | None) -> CloudProfile:
    if isinstance(cloud, CloudProfile):
        return cloud
    name = instance_type if instance_type not in (None, "auto") else cloud.instance_types[0]
    return cloud.get(name)


def zone_candidates(cloud: CloudProfile | CloudCatalog, zones: list[str] | None = None,
                    instance_type: str | None = None) -> list[str]:
    """The zones to weigh: ``zones`` (checked against the trace file), else every zone of the
    cloud's trace file in the cloud's region."""
    profile = _profile(cloud, instance_type)
    trace_file = profile.spot.trace_file
    if trace_file is None:
        raise SpecError("--zone: choosing a zone replays each zone's availability trace, and the cloud has none; "
                        "set cloud.overrides.spot.preemption.trace.file (e.g. cloud_profiles/aws/spot_traces/p3.2xlarge.json)")
    known = trace_zones(trace_file, profile.spot.trace.nodes if profile.spot.trace is not None else 1)
    if zones:
        for zone in zones:
            if zone not in known:
                raise SpecError(f"--zone: {zone!r} is not in {trace_file}{did_you_mean(zone, known)}; "
                                f"choose among {', '.join(known)}")
        return list(dict.fromkeys(zones))
    own = [z for z in known if re.fullmatch(re.escape(profile.region) + r"[a-z]", z)]
    if not own:
        raise SpecError(f"--zone: {trace_file} has no zone in {profile.region} (it has {', '.join(known)}); "
                        "name the zones to weigh, e.g. --zone " + ",".join(known[:2]))
    return own


def _in_zone(cloud: CloudProfile | CloudCatalog, zone: str, instance_type: str | None) -> CloudProfile | CloudCatalog:
    if isinstance(cloud, CloudProfile):
        return cloud.in_zone(zone)
    spot = _profile(cloud, instance_type).spot.to_dict()
    spot["preemption"]["trace"]["zone"] = zone
    return cloud.with_overrides({"spot": spot})     # the catalog prices each type in the zone


def plan_zones(spec: ExperimentSpec, model: ModelProfile, cloud: CloudProfile | CloudCatalog, deadline_s: float,
               zones: list[str] | None = None, *, instance_type: str | None = None,
               market: str | Market = Market.SPOT, on_zone: Callable[[str, int, int], None] | None = None,
               **kwargs: Any) -> Plan:
    """The cheapest plan over the candidate zones (``zone_candidates``); ``kwargs`` go to
    ``compile_plan`` for each zone. The chosen zone is the plan cloud's trace zone and
    ``plan.info["zone"]``; ``plan.info["zones"]`` has every zone's cost (``None``: infeasible).
    ``on_zone(zone, k, n)`` is called as the ``k``-th of ``n`` zones is planned (a progress line).

    Raises:
        SpecError: on-demand only (zones differ in their spot markets), or no trace to replay.
        InfeasibleDeadlineError: no zone has a plan meeting the deadline (the error of the zone
            whose plan came closest).
    """
    if market != "auto" and Market(market) is Market.ON_DEMAND:
        raise SpecError("--zone: zones differ in their spot markets only; plan with --market spot or auto")
    if isinstance(cloud, CloudProfile) and market != "auto":
        cloud = cloud.replace(market=Market(market))
    plans: dict[str, Plan] = {}
    failures: dict[str, InfeasibleDeadlineError] = {}
    candidates = zone_candidates(cloud, zones, instance_type)
    for k, zone in enumerate(candidates, 1):
        if on_zone is not None:
            on_zone(zone, k, len(candidates))
        try:
            plans[zone] = compile_plan(spec, model, _in_zone(cloud, zone, instance_type), deadline_s,
                                       instance_type=instance_type, market=market, **kwargs)
        except InfeasibleDeadlineError as exc:
            failures[zone] = exc
    if not plans:
        raise min(failures.values(), key=lambda e: e.needed_s if e.needed_s is not None else e.min_jct_s)
    best_zone = min(plans, key=lambda z: (plans[z].predicted.mean_cost_usd, -plans[z].predicted.p_meet(deadline_s), z))
    best = plans[best_zone]
    others = tuple({**p.summary(), "policy": f"{p.policy} in {z}", "zone": z} for z, p in plans.items() if z != best_zone)
    costs = {**{z: round(p.predicted.mean_cost_usd, 4) for z, p in plans.items()}, **{z: None for z in failures}}
    return replace(best, considered=(*best.considered, *others), info={**best.info, "zone": best_zone, "zones": costs})
