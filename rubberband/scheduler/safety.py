"""The scheduler's two guards: the spot safety net and the hard budget.

**Safety net** (after "Can't Be Late", Wu et al., NSDI '24). A plan on spot keeps replacing
reclaimed spot instances with spot until the job could no longer finish on on-demand in
time. After every event (and at a ``Tick`` it asks for) the scheduler computes::

    slack  = deadline - now - T_od
    needed = REPLACEMENTS * (E[SCALE] + E[INIT])      # two replacement delays (cloud profile)

and, once ``slack < needed``, moves the rest of the job to on-demand for good (see
``Scheduler``). ``T_od``, the time to finish the remaining work on on-demand instances, is a
deterministic estimate that leans late (``finish_s``):

* every TRAIN of a stage of ``n`` trials lasts ``E[startup] + k * (mean(m) + z_n std(m)) * c``:
  a stage waits for its slowest trial, and ``z_n`` is the expected largest of ``n`` standard
  normal draws (Blom's ``Phi^-1((n - 0.375) / (n + 0.25))``, 0 for one trial); ``c`` is the
  re-planner's observed pace correction (``replan.py``; 1 without re-planning); ``k`` counts
  the stage's redone iterations ``r_i`` too (DESIGN §4: a TRAIN of a function trainable trains
  them first), owed by every TRAIN still to start and by a running one started fresh in the
  stage; a TRAIN resumed after a cut (reclaim, move, retry) owes none once its step had moved
  (they were trained first and kept, §4.1), else all of ``r_i`` (it may owe part: leaning late);
* a stage's TRAINs are list-scheduled on its ``min(a_i, n_i)`` slots in queue order, the
  running ones for what is left of them (a running TRAIN is assumed to have begun on time);
* each stage adds ``E[SYNC]``; a stage that holds more instances than the one before, or the
  current stage while it still waits for instances, adds ``E[SCALE] + E[INIT]`` (what is left of it);
* to that sum of expectations, ``LATE_STDS`` (3) standard deviations of the sum are added:
  the stages are independent, and a stage's duration varies about as much as one TRAIN of it
  (``k * std(m) * c``, per wave when trials queue), so ``T_od`` is exceeded about once in 700.

The rule is armed only where spot can cost time, and only once it has:

* spot that cannot be reclaimed (``CloudProfile.spot.at_risk`` false: no preemption rate and no
  trace, an unmodelled cloud included) does not arm it once granted: moving it to on-demand
  would only cost more, so a job holding no reclaimable spot, now or in the stages to come, is
  left alone — unless a spot instance is reclaimed all the same, on a real cloud whose profile
  has no model (then the rule applies to all its spot), or a spot request waits for capacity
  as below (a cloud may never grant it, whatever the profile models);
* the switch keeps the deadline when spot *has* cost time: the slack rule applies from the
  first reclaim (a notice, or a spot instance lost) or once a spot request has waited for
  capacity, i.e. is still not granted two replacement delays after it was made. Before
  that the plan is followed: a plan whose on-demand finish estimate (which leans late by
  ``LATE_STDS``) already passes the deadline at the start would otherwise move to on-demand
  at once, though nothing went wrong and its own spot estimate met the deadline.

The margin of two replacement delays pays for the switch itself (on-demand instances to
provision) and for one more reclaim of a spot instance whose trial is still finishing on it.
Since nothing may happen for a long time (a spot request waiting for a zone's capacity), the
scheduler asks to be woken (``Wake``) when ``slack`` would reach ``needed`` if no work got done,
or, when it already has but the rule is not armed, when the oldest ungranted spot request
would count as waiting for capacity.

**Budget.** ``Budget`` counts what the run has committed, by the billing rules of DESIGN §4:
each instance from its launch to its release (or now), rounded up to the granularity and at
least the minimum, plus the data charge per launch. An instance not yet ready is counted from
its request (its launch is after that, so this never undercounts), and a request cancelled
before it launched at its minimum charge (the scheduler cannot tell it was never launched):
the count errs high, so the budget holds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import NormalDist

import numpy as np

from rubberband.errors import SpecError
from rubberband.profiles.cloud import BillingModel, CloudProfile, Market
from rubberband.profiles.distributions import Distribution
from rubberband.profiles.model import ModelProfile
from rubberband.simulator.model import billed_seconds, list_schedule
from rubberband.spec.experiment import ExperimentSpec
from rubberband.units import format_usd

REPLACEMENTS = 2.0        # the slack must cover this many replacement delays (SCALE + INIT)
LATE_STDS = 3.0           # T_od: the expected on-demand finish plus this many standard deviations
WAKE_RESOLUTION_S = 1.0   # the guards act this close to their limits (no storm of Ticks)


class SafetyNet:
    """``T_od`` and the switching rule of the module docstring for one job."""

    def __init__(self, model: ModelProfile, cloud: CloudProfile, deadline_s: float,
                 replacements: float = REPLACEMENTS, target_model: ModelProfile | None = None):
        if not math.isfinite(deadline_s):
            raise SpecError("safety net: the plan has no deadline to keep; plan with --deadline")
        self.model, self.cloud, self.deadline_s = model, cloud, float(deadline_s)
        # A surrogate job's target stage runs by the full-width profile (DESIGN §4.6), never
        # corrected by the surrogate's pace (``target=True`` below; the factor is not applied).
        self.target_model = target_model
        self.scale_s = cloud.provision_latency_s.mean + cloud.init_latency_s.mean
        self.needed_s = replacements * self.scale_s
        self.sync_s = model.sync_s.mean

    def by_target(self, target: bool) -> bool:
        """Whether a TRAIN of the target stage (``target``) is priced by the target's own
        profile, uncorrected by the surrogate's pace factor."""
        return target and self.target_model is not None

    def _model(self, target: bool) -> ModelProfile:
        return self.target_model if target and self.target_model is not None else self.model

    def stage_sync_s(self, target: bool = False) -> float:
        """The SYNC after a stage (the target stage's by the target's profile)."""
        return self._model(target).sync_s.mean

    def latency(self, gpus: int, trials_per_gpu: int = 1, fused: bool = False, target: bool = False) -> Distribution:
        """Seconds per iteration of a trial on ``gpus`` GPUs, or packed ``trials_per_gpu`` to a GPU
        (``fused``: of its fused group of ``trials_per_gpu``, DESIGN §4.5; ``target``: of the
        target stage, by the target's profile, DESIGN §4.6)."""
        model = self._model(target)
        if fused:
            return model.fused_latency(trials_per_gpu)
        return model.packed_latency(trials_per_gpu) if trials_per_gpu > 1 else model.latency(gpus)

    def train_s(self, gpus: int, iters: int, trials: int, factor: float = 1.0, trials_per_gpu: int = 1,
                fused: bool = False, target: bool = False) -> float:
        """One TRAIN of ``iters`` iterations on ``gpus`` GPUs (packed: ``trials_per_gpu`` to a
        GPU; ``fused``: in a fused group of that many) in a stage of ``trials`` trials, as long as
        the stage's slowest is expected to be (module docstring)."""
        d = self.latency(gpus, trials_per_gpu, fused, target)
        factor = 1.0 if self.by_target(target) else factor
        z = NormalDist().inv_cdf((trials - 0.375) / (trials + 0.25)) if trials > 1 else 0.0
        return self._model(target).trial_startup_s.mean + iters * (d.mean + z * d.std) * factor

    def train_var(self, gpus: int, iters: float, factor: float = 1.0, trials_per_gpu: int = 1,
                  fused: bool = False, target: bool = False) -> float:
        """The variance of one TRAIN's ``iters`` iterations (``L`` is drawn once per TRAIN)."""
        factor = 1.0 if self.by_target(target) else factor
        return (iters * self.latency(gpus, trials_per_gpu, fused, target).std * factor) ** 2

    def late(self, expected_s: float, variance: float) -> float:
        """``T_od`` from its expectation and variance (module docstring)."""
        return expected_s + LATE_STDS * math.sqrt(variance)

    def stage_s(self, busy: list[float], queued: list[float], slots: int, target: bool = False) -> float:
        """A stage's TRAINs list-scheduled on ``slots``: ``busy`` are the running ones' times
        left, ``queued`` the durations of those still to start (in order); plus its SYNC."""
        # The simulator's list scheduling, one sample: the running TRAINs (and idle slots, at 0)
        # are the first on the slots, the queued ones follow.
        slots = max(slots, len(busy), 1)
        durations = np.array([*busy, *[0.0] * (slots - len(busy)), *queued])[:, None]
        return float(list_schedule(durations, slots)[0]) + self.stage_sync_s(target)


class Budget:
    """What a run has committed against a hard budget (the module docstring's count).

    ``types``: the profile of every instance type the run may hold (a plan with a type per
    stage); an instance is priced and billed by its own type's profile, ``cloud`` by default."""

    def __init__(self, cloud: CloudProfile, budget_usd: float, types: Mapping[str, CloudProfile] | None = None):
        if not budget_usd > 0:
            raise SpecError(f"--budget: expected a positive amount of dollars, got {budget_usd}")
        self.types = {cloud.instance_type: cloud, **(types or {})}
        if any(c.billing.model is BillingModel.PER_FUNCTION for c in self.types.values()):
            raise SpecError("--budget: the budget guard counts instance time; this cloud profile bills per function")
        self.cloud, self.usd = cloud, float(budget_usd)
        self.closed_usd = 0.0           # instances already released or lost

    def _of(self, itype: str | None) -> CloudProfile:
        return self.types.get(itype, self.cloud) if itype else self.cloud

    def hourly(self, market: Market, itype: str | None = None) -> float:
        return self._of(itype).price(market)

    def minimum_usd(self, market: Market, itype: str | None = None) -> float:
        """The least one more instance on ``market`` costs: its minimum charge and its data."""
        cloud = self._of(itype)
        return self.hourly(market, itype) * cloud.billing.minimum_s / 3600.0 + cloud.data.usd_per_launch

    def instance_usd(self, market: Market, since_s: float, until_s: float, itype: str | None = None) -> float:
        cloud = self._of(itype)
        billed = float(billed_seconds(max(until_s - since_s, 0.0), cloud.billing))
        return billed * self.hourly(market, itype) / 3600.0 + cloud.data.usd_per_launch

    def granularity_usd(self, held: list[tuple[Market, str | None]]) -> float:
        """What one more billing granule (at least a second) of these instances (market, type) costs."""
        return sum(max(self._of(t).billing.granularity_s, WAKE_RESOLUTION_S) * self.hourly(m, t)
                   for m, t in held) / 3600.0

    def usd_per_s(self, held: list[tuple[Market, str | None]]) -> float:
        """What these instances (market, type) cost per second."""
        return sum(self.hourly(m, t) for m, t in held) / 3600.0


def cheapest_run_usd(spec: ExperimentSpec, model: ModelProfile, cloud: CloudProfile,
                     target_model: ModelProfile | None = None) -> float:
    """A lower bound on what any run of ``spec`` costs, by DESIGN §4's billing.

    Its iterations need ``W`` GPU-seconds at least: every trial's iterations of every stage on
    the GPU count that needs the fewest GPU-seconds for them (at the profile's mean latency; a
    surrogate job's target stage by ``target_model``, DESIGN §4.6, when given). An instance is
    billed at least its time up and at least ``minimum_s``, so the instance-seconds billed are at
    least ``max(W / G, minimum_s)`` (their sum is at least their largest term, at least one
    instance's minimum), at the cheapest market's price; plus one launch's data charge (a run
    launches at least one instance). Not the sum of the two: the minimum top-up is charged only
    on an instance that lives less than ``minimum_s``, and then it covers its iterations too.
    Start-ups, SYNCs, SCALEs, INITs, idle GPUs, other launches and rounding only add to it."""
    prices = [cloud.price_usd_per_hour] + ([cloud.spot_price_usd_per_hour] if cloud.spot_price_usd_per_hour else [])
    per_instance_s = min(prices) / 3600.0

    def gpu_s_per_iter(m: ModelProfile) -> float:
        return min(g * m.latency(g).mean for g in m.iter_latency_s)

    gpu_s = sum(stage.num_trials * stage.iters
                * gpu_s_per_iter(target_model if stage.target and target_model is not None else model)
                for stage in spec.stages)
    instance_s = max(gpu_s / cloud.gpus_per_instance, float(cloud.billing.minimum_s))
    return instance_s * per_instance_s + cloud.data.usd_per_launch


def check_budget(budget_usd: float, spec: ExperimentSpec, model: ModelProfile, cloud: CloudProfile,
                 target_model: ModelProfile | None = None) -> float:
    """``--budget`` must be positive and at least ``cheapest_run_usd`` (``target_model``: a
    surrogate job's target stage's profile, DESIGN §4.6).

    Raises:
        SpecError: naming ``--budget``, with the cheapest possible run.
    """
    if not budget_usd > 0 or not math.isfinite(budget_usd):
        raise SpecError(f"--budget: expected a positive amount of dollars, got {budget_usd}")
    cheapest = cheapest_run_usd(spec, model, cloud, target_model)
    if budget_usd < cheapest:
        raise SpecError(f"--budget: {format_usd(budget_usd)} is below the cheapest possible run of this job, "
                        f"{format_usd(cheapest)} "
                        "(its iterations alone on the fewest GPU-seconds at the cheapest price, or one instance's "
                        "minimum charge if more); raise it")
    return budget_usd
