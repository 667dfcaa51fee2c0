"""Re-planning at a SYNC: correct the profile from what was observed, re-plan what is left.

**Estimator.** The scaling curve is corrected by one multiplicative factor ``c`` on every
GPU count's iteration latency (mean and std). Each TRAIN that ran uninterrupted gives one
observation: its per-iteration time ``L = (duration - E[startup]) / (iters + r)`` against the
profile's mean ``mu(m)``, as ``x = log(L / mu(m))``, where ``r`` is the stage's redone
iterations (DESIGN §4: a function trainable's TRAIN trains them too, ``redone_iters``). The estimate shrinks the observations'
mean towards the profile (``x = 0``) with a prior worth ``PRIOR_WEIGHT`` TRAINs::

    c = exp( sum(x) / (n + PRIOR_WEIGHT) )

so the first few TRAINs move it only part of the way, and one straggler among many barely
does (a straggler 30% slow among 32 normal TRAINs moves ``c`` by under 1%).

**Decision.** At the SYNC ending stage ``i`` the remaining stages ``i+1..`` are simulated
under the corrected model against the remaining deadline (``deadline - now``), as they are
planned now and as the normal planner (``compile_plan``, same policy and confidence) would
plan them afresh: over the plan's instance types (a type per stage when it has several), on
spot and on-demand (``market="auto"``) when it holds spot instances, unless the safety net
has moved the job to on-demand; when no plan meets the deadline, the fastest one the
planner names. Both start from the instances held now, exactly as the run goes on
(``HeldInstances``: the count, type and market of stage ``i``'s instances, passed as
``held_at_start`` to ``simulate`` and ``compile_plan``), and both count the job's redone
iterations (DESIGN §4: ``redone=self.redone[first:]``, also to ``plan_allocation``; the
remaining stages resume trials trained before them, which their sub-spec alone would take for
fresh ones, as the warm table's ``tail`` does): a next stage that needs no more than
is held waits for no SCALE or INIT and launches nothing, one that needs more launches only
the rest, and held instances it does not keep cost nothing more. Held instances help only a
next stage of their type and market: a plan that changes type (or moves spot to on-demand)
at the next stage launches all of its instances afresh, as the run does. With
``max_instances`` (the room the real cluster has for each type: its ``max_workers``) the new
plan, the fastest one included, never holds more instances of a type than that (``compile_plan``'s
``max_instances``): a plan the cluster cannot hold would wait for instances that never come.
The plan changes only when

* it must, to keep the promise: the current plan misses the constraint (mean JCT, or
  ``P(JCT <= remaining) >= confidence``) by more than ``MISS_TOLERANCE`` (2%) of the
  deadline — less is the noise of the stages so far, not a wrong profile — and the new
  plan is better at it; or
* the new plan meets the constraint and costs at least ``SAVING_THRESHOLD`` (10%) less,

which keeps it from flapping on noise.

**Warm start.** The new plan is searched on the job's own table, not a fresh one: at start
the Replanner builds the ``StageTable`` the plan was compiled on (its spec, profile, type,
market, samples, seed and ``max_instances``: the same random numbers, one stream per stage
of the whole job), and at each SYNC takes its tail, ``table.tail(first, held,
model=corrected)`` (``plan/table.py``): the remaining stages alone, from the instances held,
with their draws read again, never drawn (the stage means too while the factor is 1). It
keeps that tail for the next SYNC. The search on it is the one ``compile_plan`` makes on a
table built from scratch with those draws, so the plan is the same; and the current plan
is simulated on the same draws, so the two are compared on common random numbers. A plan
``compile_plan`` would search on another table (a type per stage, ``market="auto"``, packing
under the optimal policy, or a market the safety net moved the job to) is re-planned by
``compile_plan`` itself, on fresh streams of the remaining stages.

**A cut that keeps the decision.** When the current plan keeps the promise (within
``MISS_TOLERANCE``), only a plan whose simulated cost is at most ``(1 - SAVING_THRESHOLD)`` of
the current plan's replaces it, so the warm search is cut there (``cheaper_plan``'s ``cost_cap``,
``Replanner._cut``, a hair above). The cut search returns the plan the full one does whenever
that plan could be followed: that plan's billed cost ``B`` is under the cut, every plan the cut
drops has a surrogate cost (a lower bound on its billed cost) at least the cut, above ``B``, and
``choose`` passes over such plans anyway once it holds ``B`` (it stops at the first surrogate at
least the best billed cost). When the full search's plan could not be followed (it saves less),
whatever the cut search returns costs at least as much, and is not followed either (or it
finds nothing). So the decision is the same; the cut only spares the search the plans between
the cut and the current cost, which the threshold rules out. A re-plan that must meet the
deadline is searched in full.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rubberband.errors import InfeasibleDeadlineError, SpecError
from rubberband.plan import compile_plan, plan_allocation
from rubberband.plan.compile import (
    cheaper_plan,
    check_max_instances,
    fusion_counts,
    packing_counts,
    plan_on_table,
    profile_gpu,
    type_cap,
)
from rubberband.plan.plan import Plan
from rubberband.plan.table import StageTable
from rubberband.profiles.cloud import CloudCatalog, CloudProfile, Market
from rubberband.profiles.model import ModelProfile
from rubberband.simulator import HeldInstances, simulate
from rubberband.simulator.model import redone_iters
from rubberband.simulator.result import SimResult
from rubberband.spec.experiment import ExperimentSpec

PRIOR_WEIGHT = 4.0          # the profile counts as this many TRAINs
SAVING_THRESHOLD = 0.10     # re-plan to save money only when it saves at least this share
MISS_TOLERANCE = 0.02       # a plan missing by less than this share of the deadline is kept
_CUT_SLACK = 1e-9           # relative: the warm search's cut sits this far above the saving's bound


@dataclass(frozen=True)
class Replan:
    """One re-plan, as a decision the backend logs (the scheduler already follows it)."""

    sync: int                        # the SYNC (stage index) it happened at
    factor: float                    # observed / profiled iteration latency
    first_stage: int
    last_stage: int
    old_allocation: tuple[int, ...]
    new_allocation: tuple[int, ...]
    cost_delta_usd: float            # new minus old predicted cost of the remaining stages
    p_meet: float                    # the new plan's P(remaining JCT <= remaining deadline)
    reason: str
    trigger: str = "sync"            # or "reclaim in stage": a spot reclaim during stage ``sync``

    def line(self) -> str:
        """``sync 1: 1.27x slower than profiled; stages 2-3 re-planned 12,8→16,12 GPUs, +$0.42, P(meet) 0.93``"""
        if abs(math.log(self.factor)) < 0.005:
            pace = "on the profiled pace"
        elif self.factor > 1:
            pace = f"{self.factor:.2f}x slower than profiled"
        else:
            pace = f"{1 / self.factor:.2f}x faster than profiled"
        sign = "+" if self.cost_delta_usd >= 0 else "-"
        stages = (f"stage {self.first_stage}" if self.first_stage == self.last_stage
                  else f"stages {self.first_stage}-{self.last_stage}")
        return (f"{self.trigger} {self.sync}: {pace}; {stages} re-planned "
                f"{','.join(map(str, self.old_allocation))}→{','.join(map(str, self.new_allocation))} GPUs, "
                f"{sign}${abs(self.cost_delta_usd):.2f}, P(meet) {self.p_meet:.2f} ({self.reason})")

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "line": self.line()}


class Replanner:
    """The estimator and the re-planning rule of the module docstring, for one job."""

    def __init__(self, plan: Plan, model: ModelProfile, samples: int | None = None, seed: int = 0,
                 prior_weight: float = PRIOR_WEIGHT, threshold: float = SAVING_THRESHOLD,
                 max_instances: int | dict[str, int] | None = None, target_model: ModelProfile | None = None):
        self.plan, self.model = plan, model
        # A surrogate job's target stage runs by its own profile (DESIGN §4.6), never corrected by
        # the surrogate's TRAINs (the scheduler observes none of its own: it is the last stage).
        self.target_model = target_model if plan.spec.target_stage is not None else None
        self.max_instances = max_instances      # the cluster's room per type (``None``: no limit)
        # The plan's own samples by default: its table's, which the re-plans are searched on.
        self.samples, self.seed = plan.samples if samples is None else samples, seed
        self.prior_weight, self.threshold = prior_weight, threshold
        self.redone = redone_iters(plan.spec, model)      # r_i: what each TRAIN of stage i trains again
        self._sum = 0.0
        self._n = 0
        self._table, self._table_first = self._job_table(), 0     # the table of stages _table_first..

    @property
    def table(self) -> StageTable | None:
        """The table the next re-plan starts from (its stage 0 is the job's stage
        ``table_first``), or ``None`` when ``compile_plan`` builds one afresh at each SYNC."""
        return self._table

    @property
    def table_first(self) -> int:
        return self._table_first

    def _job_table(self) -> StageTable | None:
        """The table the plan was compiled on (the same random numbers), to re-plan from
        (``None`` where ``compile_plan`` would search another: several types or markets)."""
        plan = self.plan
        if plan.type_clouds and set(plan.type_clouds) != {plan.cloud.instance_type}:
            return None
        markets = {Market.SPOT if n else Market.ON_DEMAND for n in plan.spot_counts}
        if markets - {plan.cloud.market}:
            return None
        try:
            caps = check_max_instances(self.max_instances, plan.cloud)
            return StageTable(plan.spec, self.model, plan.cloud, samples=self.samples, seed=self.seed,
                              held_at_start=plan.held_at_start, max_instances=type_cap(caps, plan.cloud),
                              target_model=self.target_model)
        except SpecError:     # e.g. a stage the cluster's room cannot hold: compile_plan says so at the SYNC
            return None

    def _warm_table(self, first: int, held: HeldInstances, model: ModelProfile, market: Market | str, policy: str,
                    several: bool) -> StageTable | None:
        """The table of stages ``first..`` from the one kept (its tail), where ``compile_plan``
        would search a plain table of the plan's type and market; kept for the next SYNC."""
        table = self._table
        cloud = self.plan.cloud
        if (table is None or several or market is not cloud.market or first < self._table_first
                or (policy == "optimal" and (packing_counts(model, cloud) or fusion_counts(model, cloud)))):
            return None
        self._table = table.tail(first - self._table_first, held, model=model)
        self._table_first = first
        return self._table

    def observe(self, gpus: int, iters: int, duration_s: float, trials_per_gpu: int = 1, fused: bool = False,
                stage: int | None = None) -> None:
        """One TRAIN of ``iters`` iterations on ``gpus`` GPUs per trial (packed: ``trials_per_gpu``
        to a GPU, measured against the packed latency; ``fused``: in a fused group of that many,
        against the fused latency) that ran uninterrupted, in the job's stage ``stage``: its
        time also trained that stage's redone iterations (``None``: none)."""
        if iters <= 0:
            return
        redone = self.redone[stage] if stage is not None and 0 <= stage < len(self.redone) else 0
        per_iter = (duration_s - self.model.trial_startup_s.mean) / (iters + redone)
        latency = (self.model.fused_latency(trials_per_gpu) if fused else self.model.packed_latency(trials_per_gpu)
                   if trials_per_gpu > 1 else self.model.latency(gpus))
        mean = latency.mean
        if per_iter > 0 and mean > 0:
            self._sum += math.log(per_iter / mean)
            self._n += 1

    @property
    def factor(self) -> float:
        return math.exp(self._sum / (self._n + self.prior_weight))

    def corrected(self) -> ModelProfile:
        c = self.factor
        return self.model.replace(iter_latency_s={g: d.with_moments(d.mean * c, d.std * c)
                                                  for g, d in self.model.iter_latency_s.items()},
                                  fused_iter_latency_s={f: d.with_moments(d.mean * c, d.std * c)
                                                        for f, d in self.model.fused_iter_latency_s.items()})

    def _meets(self, result: SimResult, remaining_s: float) -> bool:
        if self.plan.confidence is None:
            return result.mean_jct_s <= remaining_s
        return result.p_meet(remaining_s) >= self.plan.confidence

    def _cut(self, old: SimResult) -> float:
        """The cost at which the warm search of a plan that keeps the promise is cut: what a plan
        saving ``threshold`` of ``old``'s mean cost may cost at most, and a hair above (never
        above ``old``'s cost itself), so that a plan saving exactly ``threshold`` is still found."""
        cost = old.mean_cost_usd
        return min(cost, (1.0 - self.threshold) * cost * (1.0 + _CUT_SLACK))

    def replan(self, sync: int, now: float, allocation: list[int], instances: list[int],
               spot: list[int], market: Market | str | None = None, trigger: str = "sync",
               types: list[str] | None = None, packing: list[int] | None = None,
               fusion: list[int] | None = None) -> tuple[Plan, Replan] | None:
        """At the SYNC ending stage ``sync`` (at ``now``), the plan of stages ``sync+1..`` to
        switch to, with its ``Replan`` record, or ``None`` to keep the current one; ``market``
        overrides the plan's (the safety net has moved the job to on-demand); ``types``,
        ``packing`` and ``fusion``: each stage's instance type, trials per GPU and trials fused
        per GPU now (default: the plan's)."""
        first = sync + 1
        remaining = self.plan.deadline_s - now
        if first >= self.plan.spec.num_stages() or not math.isfinite(remaining) or remaining <= 0:
            return None
        spec = self.plan.spec
        sub = ExperimentSpec(spec.stages[first:], tuple(b - first for b in spec.bracket_starts if b > first), spec.eta)
        model, cloud = self.corrected(), self.plan.cloud
        target = self.target_model      # the plan's spec ends in a target stage, so does ``sub``
        types = list(types or [c.instance_type for c in self.plan.stage_clouds])
        packing = list(packing or self.plan.packing)
        fusion = list(fusion or self.plan.fusion)
        several = len(set(types)) > 1 or types[0] != cloud.instance_type
        held = HeldInstances(instances[sync], spot[sync], types[sync])     # what stage ``sync`` holds now
        # The job's r_i, not ``sub``'s own: its first stages resume trials trained before ``first``.
        redone = self.redone[first:]
        if market is None:
            # A market-auto plan's cloud says on-demand even when every stage is on spot: a plan
            # holding spot is re-planned on spot and on-demand both (only the safety net forces
            # on-demand); an all-spot plan of market spot stays on spot.
            mixed = any(0 < s < h for s, h in zip(spot, instances))
            market = cloud.market if cloud.market is Market.SPOT and not mixed else "auto" if any(spot) else cloud.market
        policy = self.plan.policy if self.plan.policy != "manual" else "optimal"
        catalog = _catalog(self.plan.type_clouds, model)
        table = None if catalog else self._warm_table(first, held, model, market, policy, several)
        old = simulate(sub, allocation[first:], model, {**self.plan.type_clouds, cloud.instance_type: cloud}
                       if several else cloud, samples=self.samples, seed=self.seed, instances=instances[first:],
                       draws=table.draws if table is not None else None, spot_instances=spot[first:],
                       trials_per_gpu=packing[first:], instance_types=types[first:] if several else None,
                       held_at_start=held, fused_per_gpu=fusion[first:], target_model=target, redone=redone)
        slack = MISS_TOLERANCE * self.plan.deadline_s
        old_ok = self._meets(old, remaining + slack)
        try:
            if table is not None and old_ok and not any(table.reclaimed):
                # Only a plan saving ``threshold`` replaces one that keeps the promise: the search
                # is cut at the most such a plan may cost (the module docstring says why it is exact).
                new = cheaper_plan(table, remaining, policy, self.plan.confidence, cost_cap=self._cut(old))
                if new is None:
                    return None
            elif table is not None:
                new = plan_on_table(table, remaining, policy, self.plan.confidence)
            else:
                new = compile_plan(sub, model, catalog or cloud, remaining, policy=policy, samples=self.samples,
                                   seed=self.seed, confidence=self.plan.confidence,
                                   instance_type="auto" if catalog else None, market=market, held_at_start=held,
                                   max_instances=self.max_instances, target_model=target, redone=redone)
        except InfeasibleDeadlineError as exc:     # nothing meets it: the fastest plan comes closest
            new = plan_allocation(sub, exc.allocation, model, cloud, remaining, samples=self.samples, seed=self.seed,
                                  held_at_start=held, target_model=target, redone=redone)
        same = (tuple(new.allocation), tuple(new.instances), [c.instance_type for c in new.stage_clouds],
                list(new.packing), list(new.fusion)) == (tuple(allocation[first:]), tuple(instances[first:]),
                                                         types[first:], packing[first:], fusion[first:])
        if same:
            return None
        new_ok = self._meets(new.predicted, remaining)
        saving = old.mean_cost_usd - new.predicted.mean_cost_usd
        if not old_ok and (new_ok or new.predicted.p_meet(remaining) > old.p_meet(remaining)):
            reason = "to meet the deadline"
        elif new_ok and saving >= self.threshold * old.mean_cost_usd:
            reason = f"saves {saving / old.mean_cost_usd:.0%}"
        else:
            return None
        record = Replan(sync, self.factor, first, self.plan.spec.num_stages() - 1, tuple(allocation[first:]),
                        tuple(new.allocation), -saving, new.predicted.p_meet(remaining), reason, trigger)
        return new, record


def _catalog(clouds: dict[str, CloudProfile], model: ModelProfile) -> CloudCatalog | None:
    """A plan's several types as a catalog to re-plan over, a type per stage again
    (``instance_type="auto"``); ``None`` for one type, or when the profile does not say it was
    measured on their GPU model (``auto`` could not tell where it holds): the first type's then."""
    if len(clouds) < 2:
        return None
    first = next(iter(clouds.values()))
    catalog = CloudCatalog(first.provider, first.region, {name: {k: v for k, v in c.to_dict().items() if k not in _NOT_OF_A_TYPE}
                                                          for name, c in clouds.items()}, {})
    gpu = profile_gpu(model, catalog)[0]
    return catalog if gpu is not None and gpu in {c.gpu_model for c in clouds.values()} else None


_NOT_OF_A_TYPE = ("provider", "region", "instance_type", "market")     # the catalog (or the market asked) says these
