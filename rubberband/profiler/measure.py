"""The profiler: measure a job's model profile and the provider's latencies through the real executor.

It starts a cluster of the experiment's instance type on the provider and measures with the
executor's own pieces (the provider, Ray's autoscaler, warm DDP worker gangs, the driver):

* **cloud latencies**, over ``launches`` (>= 2) instance launches (the first one before the
  model measurements, the others after them, each growing the cluster by one): provisioning,
  the driver asking -> running (the autoscaler's lag in noticing the ask, then the provider's
  request -> running, from its event log); initialisation, running -> usable: until
  its workers are warm (the driver's ``nodes`` event), plus the one-off extra time the first
  trials on those fresh workers take (first model build, first backward pass, ...), which a
  job pays once per new instance and the trial start-up measured on used workers misses. On
  the ``local`` provider, whose instances are Ray nodes sharing this machine's CPUs, one more
  launch grows the cluster by *two* at once: how much later two instances launched together
  are ready than one alone gives ``init_contention_s`` (DESIGN §4, ``contention_s``), and
  ``init_latency_s`` is fitted from the launches of one alone;
* **per GPUs-per-trial count** ``m`` (powers of two up to the requested maximum): TRAIN
  durations of one-stage runs of the driver, with trials of ``k = 1`` and ``k = 1 + iters``
  iterations. ``d = startup + k L`` (DESIGN §4) gives per-trial samples of ``L`` and of the
  start-up: ``L`` from the iterations the workers time themselves, plus any per-iteration
  time outside their timer (``fit.split_timed_trains``; the run's own timings are the same
  timer); ``m = 1`` queues ``2 G`` trials on ``G`` GPUs (so
  both a fresh gang and a hand-off are measured), ``m > 1`` runs ``G // m`` gangs at once;
* **SYNC**: a stage's time outside its TRAIN nodes (ranking, stopping gangs, asking for the
  next stage's instances);
* **packing** (``max_packing > 1``): seconds per iteration of one trial with ``k = 1, 2, 4,
  ...`` trials on every GPU of the first instance, until throughput stops rising or memory
  runs out (``rubberband.profiler.packing``); written as ``packed_iter_latency_s`` for
  ``k >= 2``, scaled so that the packed measurement's ``k = 1`` is the solo ``L`` (the
  planner compares the two: only the measured throughput ratio may tell it to pack), with
  ``gpu_memory_gb_per_trial`` where CUDA reports it;
* **fusion** (``max_fused > 1``, off by default): seconds per iteration of a fused group of
  ``F = 1, 2, 4, ...`` trials of one model shape on one GPU of the first instance, and its
  memory, until throughput stops rising or memory runs out (``rubberband.profiler.fusion``);
  written as ``fused_iter_latency_s`` and ``fused_memory_gb``, scaled like the packed ones;
  trials that cannot be fused leave the reason under ``profiling.fusion``;
* **checkpoint interval** (function trainables): the iterations each trial of the long runs
  reported checkpoints at, read from its state (``function_api.TrialState.checkpoints``), give
  ``checkpoint_every`` (``fit.checkpoint_interval``; ``never`` when none reported one), with
  which the model counts the iterations a resumed trial trains again (DESIGN §4).

Each latency is fitted with ``fit.fit_latency``; the raw samples are kept under
``profiling.samples``. The profiling's own wall time and cost (the provider's instance-seconds
with the cloud profile's price and billing rules, ``ledger_from_events``) are reported. ``ray``
is imported only when a cluster is started.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from rubberband.config import Experiment, load_experiment
from rubberband.errors import ProviderError, RubberbandError, SpecError
from rubberband.profiler.fit import (
    checkpoint_interval,
    split_timed_trains,
    split_train_durations,
    to_profile_entry,
)
from rubberband.profiler.fusion import FusedResult, fused_entries, not_measured
from rubberband.profiler.packing import DEFAULT_MAX_K, PackingResult
from rubberband.profiles.cloud import CloudProfile
from rubberband.profiles.distributions import Constant, Distribution, parse_distribution
from rubberband.profiles.model import ModelProfile
from rubberband.providers import base as providers
from rubberband.providers.base import ProviderEvent

if TYPE_CHECKING:
    from rubberband.executor.session import Session
    from rubberband.plan import Plan

log = logging.getLogger("rubberband.profiler")

K_SHORT = 1                 # iterations of the short trials; the long ones run K_SHORT + iters
Train = tuple[float, list[float]]    # one TRAIN: its duration and its iterations' seconds (the worker's timer)
MIN_LAUNCHES = 2
HEADER = "# Measured on this machine by `rubberband profile`; rerun it to refresh.\n"


# --- what was asked ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Request:
    """A checked profiling request (everything that can be wrong is caught before any cluster starts)."""

    experiment: Experiment
    provider: str
    cloud: CloudProfile
    gpu_counts: tuple[int, ...]
    iters: int
    repeats: int
    max_seconds: float | None
    launches: int
    global_batch_size: int | None
    cluster: Any = None            # the provider's checked configuration (aws: the Ray cluster YAML)
    latency_scale: float = 1.0     # scales the provider's emulated provisioning (local; aws on an emulator)
    max_packing: int = DEFAULT_MAX_K   # the most trials per GPU to measure packed; 1: none
    max_fused: int = 1             # the largest fused group to measure; 1: none
    min_seconds: float = 0.0       # the least wall time one measurement takes (``min_profile_seconds``)

    @property
    def trainer(self) -> str:
        """The experiment's trainer (``check_request`` refuses an experiment without one)."""
        return self.experiment.trainer or ""


def gpu_counts(requested: int | Sequence[int] | None, cloud: CloudProfile) -> tuple[int, ...]:
    """GPUs per trial to measure: powers of two up to ``min(G, max(requested))``, plus any
    other count asked for explicitly.

    Raises:
        SpecError: a count below 1, or one that one instance of ``cloud`` cannot host.
    """
    G = cloud.gpus_per_instance
    if requested is None:
        asked: list[int] = [G]
    elif isinstance(requested, int) and not isinstance(requested, bool):
        asked = [requested]
    elif isinstance(requested, bool):
        raise SpecError(f"--gpus: expected GPU counts per trial such as 1,2, got {requested!r}")
    else:
        asked = list(requested)
    if not asked:
        raise SpecError("--gpus: give at least one GPU count per trial, e.g. 1,2")
    for g in asked:
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise SpecError(f"--gpus: expected whole numbers of GPUs per trial of at least 1, got {g!r}")
        if g > G:
            raise SpecError(f"--gpus: {g} GPUs per trial cannot fit on {cloud.instance_type} ({G} GPUs per instance); "
                            f"profile at most {G}, or pick an instance type with more GPUs")
    top = max(asked)
    counts = {1 << i for i in range(top.bit_length()) if 1 << i <= top}
    return tuple(sorted(counts | set(asked)))


def check_request(experiment: str | Path | Experiment, provider: str = "local", gpus: int | Sequence[int] | None = None,
                  iters: int = 4, repeats: int = 3, max_seconds: float | None = None, launches: int = MIN_LAUNCHES,
                  cluster: Any = None, max_packing: int = DEFAULT_MAX_K) -> Request:
    """Load and check what to profile, without starting anything.

    Raises:
        SpecError: an unknown provider, ``iters`` or ``repeats`` below 1, a GPU count the
            instance type cannot host, no trainer, a trainer that cannot be loaded, ...
    """
    prov = providers.get(provider, "--provider")
    for name, value in (("--iters", iters), ("--repeats", repeats), ("launches", launches),
                        ("--max-packing", max_packing)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"{name}: must be a whole number of at least 1, got {value!r}")
    if launches < MIN_LAUNCHES:
        raise SpecError(f"launches: at least {MIN_LAUNCHES} instance launches are needed to fit latencies, got {launches}")
    if max_seconds is not None and (isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float))
                                    or not max_seconds > 0):
        raise SpecError(f"--max-seconds: must be a positive number of seconds, got {max_seconds!r}")
    exp = experiment if isinstance(experiment, Experiment) else load_experiment(experiment)
    if exp.auto_instance_type:
        raise SpecError("cloud.instance_type: `auto` cannot be profiled; name the instance type to measure on")
    if not exp.trainer:
        raise SpecError("trainer: the experiment names no trainer; add `trainer: package.module:Name`")
    cloud = exp.cloud
    counts = gpu_counts(gpus, cloud)
    from rubberband.executor.worker import load_trainer  # imports the user's module, not torch

    trainer = load_trainer(exp.trainer)
    batch = getattr(trainer, "global_batch_size", None)
    if isinstance(batch, int):
        bad = [m for m in counts if batch % m]
        if bad:
            raise SpecError(f"--gpus: the trainer's global_batch_size {batch} does not split over {bad[0]} GPUs; "
                            f"profile counts that divide it")
    steps = launches + (1 if shares_machine(provider) else 0)     # local: one more, of two together
    needed, launch_s, repeat_s = min_profile_seconds(exp.model, cloud, counts[0], iters, steps)
    if max_seconds is not None and max_seconds < needed:
        raise SpecError(f"--max-seconds: {max_seconds:g}s is below the {needed:.0f}s one measurement needs "
                        f"({launches} instance launches{' and one of two instances together' if steps > launches else ''} of about {launch_s:.1f}s each and one repeat of {counts[0]} "
                        f"GPU(s) per trial, about {repeat_s:.1f}s by the experiment's profiles); give at least "
                        f"{needed:.0f}s, or leave it out")
    cluster_cfg = prov.check(cloud, launches, providers.cluster_yaml_for(prov, cluster, exp.cluster))
    return Request(exp, provider, cloud, counts, iters, repeats, float(max_seconds) if max_seconds else None,
                   launches, batch if isinstance(batch, int) else None, cluster_cfg, max_packing=max_packing,
                   min_seconds=needed)


def min_profile_seconds(model: ModelProfile, cloud: CloudProfile, gpus: int, iters: int,
                        launches: int) -> tuple[float, float, float]:
    """The least wall time a profile takes, whatever ``--max-seconds`` says: every launch (it fits
    the latencies from them) and one repeat at the first GPU count (a stage of ``K_SHORT`` and
    one of ``K_SHORT + iters`` iterations), by what the cloud and the experiment's model profile
    expect (``launch = E[provision] + E[init]``, ``repeat = 2 (startup + sync) + (2 K_SHORT +
    iters) E[iteration]``; a GPU count the profile does not cover counts no iteration time).

    Returns:
        ``(seconds, one launch, one repeat)``.
    """
    launch = cloud.provision_latency_s.mean + cloud.init_latency_s.mean
    per_iter = model.latency(gpus).mean if model.covers(gpus) else 0.0
    repeat = 2 * (model.trial_startup_s.mean + model.sync_s.mean) + (2 * K_SHORT + iters) * per_iter
    return launches * launch + repeat, launch, repeat


# --- what was measured -------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuCountResult:
    """One GPUs-per-trial count: its fitted seconds per iteration and the samples behind it."""

    gpus: int
    iter_latency_s: Distribution
    iter_samples: tuple[float, ...]
    startup_samples: tuple[float, ...]
    repeats: int

    @property
    def startup_s(self) -> float:
        return statistics.fmean(self.startup_samples) if self.startup_samples else 0.0


@dataclass(frozen=True)
class ProfileResult:
    """What ``profile`` measured, wrote and spent."""

    experiment: str
    provider: str
    instance_type: str
    trainer: str
    per_gpus: tuple[GpuCountResult, ...]
    trial_startup_s: Distribution
    sync_s: Distribution
    provision_latency_s: Distribution
    init_latency_s: Distribution
    samples: dict[str, Any]
    seconds: float
    cost_usd: float
    instance_seconds: float
    price_usd_per_hour: float
    iters: int
    repeats: int
    stopped_early: bool
    notes: tuple[str, ...]
    profile: dict[str, Any]
    cloud_overrides: dict[str, Any]
    out: str | None = None
    cloud_out: str | None = None
    run_dir: str | None = None
    skipped_gpus: tuple[int, ...] = field(default_factory=tuple)
    packing: PackingResult | None = None

    @property
    def model(self) -> ModelProfile:
        """The measured model profile."""
        return ModelProfile.from_dict(self.profile, where="measured profile")

    @property
    def gpu_counts(self) -> tuple[int, ...]:
        return tuple(r.gpus for r in self.per_gpus)

    def to_dict(self) -> dict[str, Any]:
        return {
            "experiment": self.experiment, "provider": self.provider, "instance_type": self.instance_type,
            "trainer": self.trainer, "iters": self.iters, "repeats": self.repeats,
            "gpus": [{"gpus": r.gpus, "repeats": r.repeats, "startup_s": r.startup_s,
                      "iter_latency_s": r.iter_latency_s.to_dict(), "iter_samples": list(r.iter_samples),
                      "startup_samples": list(r.startup_samples)} for r in self.per_gpus],
            "skipped_gpus": list(self.skipped_gpus),
            "trial_startup_s": self.trial_startup_s.to_dict(), "sync_s": self.sync_s.to_dict(),
            "provision_latency_s": self.provision_latency_s.to_dict(), "init_latency_s": self.init_latency_s.to_dict(),
            "samples": self.samples, "seconds": self.seconds, "cost_usd": self.cost_usd,
            "instance_seconds": self.instance_seconds, "price_usd_per_hour": self.price_usd_per_hour,
            "stopped_early": self.stopped_early, "notes": list(self.notes),
            "out": self.out, "cloud_out": self.cloud_out, "run_dir": self.run_dir,
            "profile": self.profile, "cloud_overrides": self.cloud_overrides,
            "packing": self.packing.to_dict() if self.packing else None,
        }

    def table(self) -> str:
        """The human summary the CLI prints."""
        from rubberband.render import render
        from rubberband.units import format_usd

        rows = [[r.gpus, len(r.iter_samples), r.repeats, f"{r.startup_s:.3f}s", f"{r.iter_latency_s.mean:.4f}",
                 f"{r.iter_latency_s.std:.4f}", describe(r.iter_latency_s)] for r in self.per_gpus]
        lines = [f"profiled {self.experiment} on {self.provider} {self.instance_type} (trainer {self.trainer}; "
                 f"trials of {K_SHORT} and {K_SHORT + self.iters} iterations, {self.repeats} repeats)", ""]
        lines.append(render(["GPUs/trial", "samples", "repeats", "start-up", "s/iter mean", "s/iter std", "fitted"], rows))
        lines.append("")
        if self.packing and self.packing.counts:
            alone = self.packing.counts[0].throughput
            lines.append(f"packed 1-GPU trials ({self.packing.mode}; every GPU of one instance packed at once):")
            lines.append(render(["trials/GPU", "samples", "s/iter mean (one trial)", "throughput vs alone"],
                                [[c.k, len(c.iter_samples), f"{c.mean_s:.4f}", f"{c.throughput / alone:.2f}x"]
                                 for c in self.packing.counts]))
            lines.append(f"packing stopped: {self.packing.stopped}")
            lines.append("")
        n_launch = len(self.samples.get("cloud", {}).get("init_latency_s", []))
        lines.append(f"trial start-up                            {describe(self.trial_startup_s)}")
        lines.append(f"sync (per stage)                          {describe(self.sync_s)}")
        lines.append(f"provisioning (asked -> running)           {describe(self.provision_latency_s)} over {n_launch} launches")
        lines.append(f"initialisation (running -> usable)        {describe(self.init_latency_s)} over {n_launch} launches")
        for note in self.notes:
            lines.append(f"note: {note}")
        written = [p for p in (self.out, self.cloud_out) if p]
        if written:
            lines.append("wrote " + " and ".join(written) + (" (use the latter as the experiment's `cloud.overrides`)"
                                                             if self.cloud_out else ""))
        lines.append(f"profiling took {self.seconds:.0f}s and cost {format_usd(self.cost_usd)} "
                     f"({self.instance_seconds:.0f} instance-seconds of {self.instance_type} at "
                     f"{format_usd(self.price_usd_per_hour)}/h, billed per the cloud profile)")
        return "\n".join(lines)


def describe(dist: Distribution) -> str:
    """``normal mean 0.47s std 0.02s`` — one latency in words."""
    if isinstance(dist, Constant):
        return f"constant {dist.value:.4g}s"
    return f"{dist.kind} mean {dist.mean:.4g}s std {dist.std:.4g}s"


# --- the measurement -----------------------------------------------------------------------------
class _Measurement:
    """Runs one-stage jobs through the real driver on a session and collects samples."""

    def __init__(self, req: Request, session: Session):
        self.req, self.session = req, session
        exp = req.experiment
        self.G = req.cloud.gpus_per_instance
        # Only the plan's shape matters here: any latency will do for the planning model.
        self.planning_model = ModelProfile({m: Constant(1.0) for m in {1, *req.gpu_counts}}, name="profiling")
        self.metric, self.mode, self.seed = exp.metric, exp.mode, exp.seed
        self.warmed: dict[str, float] = {}
        self.asked: list[float] = []        # when the driver asked for a stage's instances
        self.first_trials: dict[str, list[float]] = {}   # instance -> TRAIN durations of its first trials
        self.together: dict[str, int] = {}                # instance -> how many were launched with it (itself included)
        self.plan: Plan | None = None
        self.runs = 0
        # A function trainable's long trials: the iterations each checkpointed at, and how far it got.
        self.checkpoints: list[tuple[tuple[int | float, ...], int | float]] = []

    def _on_event(self, kind: str, data: dict[str, Any]) -> None:
        if kind == "stage":
            self.asked.append(time.time())
        elif kind == "nodes":
            for inst in data["instances"]:
                self.warmed.setdefault(inst, data["at"])

    def run(self, trials: int, iters: int, allocation: int):
        """One stage of ``trials`` trials of ``iters`` iterations on ``allocation`` GPUs."""
        from rubberband.executor.driver import Driver
        from rubberband.plan import plan_allocation
        from rubberband.spec import ExperimentSpec

        spec = ExperimentSpec.from_stages([(trials, iters)])
        plan = plan_allocation(spec, (allocation,), self.planning_model, self.req.cloud, deadline_s=3600, samples=10,
                               seed=self.seed)
        self.plan = plan
        # A new seed per stage: the trials sample new configs, so the samples span the search
        # space as a tuning job's trials do.
        self.runs += 1
        driver = Driver(plan, self.session.port, self.session.runner, self.req.experiment.search_space, self.metric,
                        self.mode, seed=self.seed + self.runs, on_event=self._on_event, keep_warm=True)
        return driver.run()

    def launch(self, count: int) -> float:
        """Grow to ``count`` instances (one launch more) with a tiny stage on every GPU; return
        seconds taken. Instances are only ever added: releasing one while the autoscaler still
        sees the larger request can make it launch a replacement."""
        t0 = time.time()
        before = set(self.warmed)
        outcome = self.run(self.G * count, K_SHORT, self.G * count)
        fresh = set(self.warmed) - before
        for inst in fresh:
            self.together[inst] = len(fresh)
        # The trials that ran on the new instance were its workers' first: their TRAIN
        # durations show the one-off cost of a worker's first trial.
        on_fresh = {tid for tid, t in outcome.trials.items() if t.history and set(t.history[-1]["instances"]) <= fresh}
        for inst in fresh:
            self.first_trials[inst] = [r["end_s"] - r["start_s"] for r in outcome.train_runs if r["trial"] in on_fresh]
        return time.time() - t0

    def cloud_samples(self, hot_short_s: float) -> dict[str, list[float]]:
        """Per launch: ``provision`` (the driver asking -> running: the autoscaler's ``lag``
        plus the provider's request -> running) and ``init`` (running
        -> usable), where ``init = warm + first_trial``: ``warm`` is running -> warm workers
        and ``first_trial`` how much longer the instance's first trials took than
        ``hot_short_s``, the mean of the same trials on used workers (the one-off cost of a
        worker's first trial, which ``warm`` does not pay). ``lag``, from the driver asking for
        instances to the provider's request (the autoscaler noticing the request), is also
        reported on its own."""
        events = self.session.read_events()
        times: dict[str, dict[str, float]] = {}
        for e in events:
            times.setdefault(e["instance"], {}).setdefault(e["event"], e["t"])
        out: dict[str, list[float]] = {"provision": [], "init": [], "warm": [], "first_trial": [], "lag": [],
                                       "together": []}
        for inst, warm_at in self.warmed.items():
            t = times.get(inst, {})
            requested, running = t.get(ProviderEvent.REQUEST), t.get(ProviderEvent.RUNNING)
            if requested is not None and running is not None:
                # SCALE runs from the driver asking to the instance running (DESIGN §4): the
                # autoscaler's lag in noticing the ask is part of it, as it is in a run.
                asked = [a for a in self.asked if a <= requested]
                lag = requested - asked[-1] if asked else 0.0
                if asked:
                    out["lag"].append(lag)
                out["provision"].append(max(0.0, running - requested + lag))
            if running is not None:
                warm = max(0.0, warm_at - running)
                first = self.first_trials.get(inst)
                extra = max(0.0, statistics.fmean(first) - hot_short_s) if first else 0.0
                out["warm"].append(warm)
                out["first_trial"].append(extra)
                out["init"].append(warm + extra)
                out["together"].append(float(self.together.get(inst, 1)))
        return out

    def packing(self, progress: Callable[[str], None], may_continue: Callable[[], bool]) -> PackingResult:
        """Packed throughput on the first instance (see ``rubberband.profiler.packing``)."""
        from rubberband.executor.search_space import sample_configs
        from rubberband.profiler.packing import measure_packing

        node = self.session.port.nodes()[0]
        self.session.runner.release_instance(node.name)      # its GPUs go to the packed workers
        self.runs += 1
        seed = self.seed + self.runs

        def report(c) -> None:
            progress(f"packing {c.k} trial(s) per GPU: {c.mean_s:.4f}s per iteration of one trial "
                     f"({c.throughput:.3g} iterations/s per GPU)")

        result = measure_packing(
            node.name, node.gpus, self.req.experiment.trainer, self.seed,
            lambda n: sample_configs(self.req.experiment.search_space, n, seed=seed), self.req.iters,
            self.req.max_packing, self.req.cloud.gpu_memory_gb, logical=self.req.cloud.gpu_model == "logical",
            on_count=report, may_continue=may_continue)
        progress(f"packing stopped: {result.stopped}")
        self.session.runner.warm([node])     # warm again, so the launches after this time only new instances
        return result

    def fusion(self, progress: Callable[[str], None], may_continue: Callable[[], bool]) -> FusedResult | str:
        """Fused throughput on one GPU of the first instance (see ``rubberband.profiler.fusion``),
        or why the search space's trials cannot be fused."""
        import ray

        from rubberband.executor.search_space import sample_configs
        from rubberband.executor.worker import DDPWorker
        from rubberband.profiler.fusion import measure_fused

        node = self.session.port.nodes()[0]
        self.session.runner.release_instance(node.name)      # its GPUs go to the fused worker
        self.runs += 1
        pool = sample_configs(self.req.experiment.search_space, 4 * self.req.max_fused, seed=self.seed + self.runs)
        actor: Any = ray.remote(num_cpus=0, num_gpus=1, max_restarts=0)(DDPWorker).options(
            resources={node.name: 0.001}).remote(self.req.experiment.trainer, self.seed)
        try:
            def call(method: str, *args: Any) -> Any:
                return ray.get(getattr(actor, method).remote(*args), timeout=600)

            call("warmup")
            groups, reason = call("fusable", pool)
            reason = not_measured(groups, reason)
            if reason is not None:
                progress(f"fusion not measured: {reason}")
                return reason
            same_shape = [pool[i] for i in groups[0]]       # the largest group of one model shape

            def report(s) -> None:
                progress(f"fusion {s.F} trial(s) in one program: {s.mean_s:.4f}s per iteration of the group "
                         f"({s.throughput:.3g} trial-iterations/s)")

            result = measure_fused(call, lambda n: [same_shape[i % len(same_shape)] for i in range(n)],
                                   self.req.iters, self.req.max_fused, self.req.cloud.gpu_memory_gb,
                                   on_size=report, may_continue=may_continue)
        finally:
            ray.kill(actor, no_restart=True)
            self.session.runner.warm([node])     # warm again, so the launches after this time only new instances
        progress(f"fusion stopped: {result.stopped}")
        return result

    def gpu_count(self, m: int) -> tuple[list[Train], list[Train], list[float]]:
        """One repeat at ``m`` GPUs per trial: (short TRAINs, long TRAINs, sync samples), each
        TRAIN as ``(duration, its iterations' seconds as the worker timed them)``."""
        G = self.G
        trials, allocation = (2 * G, G) if m == 1 else (G // m, m * (G // m))
        out: list[list[Train]] = []
        sync: list[float] = []
        for k in (K_SHORT, K_SHORT + self.req.iters):
            outcome = self.run(trials, k, allocation)
            if k > K_SHORT:
                self.checkpoints.extend(_function_checkpoints(outcome.trials.values()))
            runs = outcome.train_runs
            out.append([(r["end_s"] - r["start_s"], list(r.get("iter_s") or [])) for r in runs])
            stage = outcome.stages[0]
            sync.append(max(0.0, (stage.end_s - stage.start_s) - (max(r["end_s"] for r in runs)
                                                                   - min(r["start_s"] for r in runs))))
        return out[0], out[1], sync


def profile(experiment: str | Path | Experiment, provider: str = "local", gpus: int | Sequence[int] | None = None,
            iters: int = 4, repeats: int = 3, max_seconds: float | None = None, out: str | Path | None = None,
            cloud_out: str | Path | bool | None = None, *, launches: int = MIN_LAUNCHES,
            runs_dir: str | Path = "runs", on_progress: Callable[[str], None] | None = None,
            cluster: Any = None, latency_scale: float = 1.0, max_packing: int = DEFAULT_MAX_K,
            max_fused: int = 1) -> ProfileResult:
    """Measure a job's model profile and the provider's latencies, and write them.

    Args:
        experiment: an experiment YAML path or a loaded ``Experiment`` (its trainer, search
            space, metric, seed and instance type are used).
        provider: where to measure: ``local`` or ``aws`` (EC2, with ``cluster``).
        gpus: GPUs per trial: powers of two up to ``min(G, max(gpus))`` are measured
            (default: up to the instance type's ``G``).
        iters: extra iterations of the long trials (they run ``1 + iters``; short ones 1).
        repeats: runs of each trial length per GPU count.
        max_seconds: a bound on the profiling's wall time: repeats (and then GPU counts) that
            would not fit are skipped and the result says so. The start-up and the instance
            launches are always done.
        out: the model profile YAML to write (default under ``runs_dir``, see ``output_paths``).
        cloud_out: the cloud-profile override YAML (``provision_latency_s``,
            ``init_latency_s``) to write; default next to ``out`` as ``<stem>.cloud.yaml``;
            ``False`` writes none.
        launches: instance launches to time (at least 2; the cluster grows to this many instances).
        runs_dir: where the profiling cluster keeps its run directory, and where the profiles
            go unless ``out`` says otherwise.
        on_progress: called with one line of text per step.
        cluster: ``aws`` only: the Ray cluster YAML to launch from (default: the experiment's ``cluster:``).
        latency_scale: multiplies the provider's emulated provisioning wait (the local
            provider; aws against an emulator such as moto). Real EC2 is timed as it is.
        max_packing: the most 1-GPU trials per GPU to measure packed (``k = 1, 2, 4, ...``
            up to it, stopping when throughput stops rising); 1 measures no packing.
        max_fused: the largest fused group to measure (``F = 1, 2, 4, ...`` trials of one
            model shape in one program, ``rubberband.profiler.fusion``); 1 (the default)
            measures no fusion.

    Returns:
        A ``ProfileResult``.

    Raises:
        SpecError: bad arguments (checked before any cluster starts), or a trainer rejecting
            its input.
        ProviderError: the trainer or the provider failed; the message names the trainer
            and the error. The cluster is stopped in every case.
    """
    req = check_request(experiment, provider, gpus, iters, repeats, max_seconds, launches, cluster, max_packing)
    if isinstance(latency_scale, bool) or not isinstance(latency_scale, (int, float)) or not latency_scale > 0:
        raise SpecError(f"--latency-scale: must be a positive number, got {latency_scale!r}")
    if isinstance(max_fused, bool) or not isinstance(max_fused, int) or max_fused < 1:
        raise SpecError(f"--max-fused: must be a whole number of trials of at least 1 (1: no fusion), got {max_fused!r}")
    req = dataclasses.replace(req, latency_scale=float(latency_scale), max_fused=max_fused)
    exp, cloud = req.experiment, req.cloud
    progress = on_progress or (lambda line: None)
    from rubberband.executor.run import ledger_from_events, new_run_id
    from rubberband.executor.session import cluster_session

    run_id = "profile-" + new_run_id()
    run_dir = Path(runs_dir).resolve() / run_id
    t_start = time.time()
    progress(f"starting a {provider} cluster of {cloud.instance_type} for {exp.name}")
    durations: dict[int, tuple[list[Train], list[Train]]] = {}
    done_repeats: dict[int, int] = {}
    sync: list[float] = []
    notes: list[str] = []
    skipped: list[int] = []
    stopped_early = False
    packing: PackingResult | None = None
    packing_skipped = False
    fusion: FusedResult | str | None = None
    room = req.launches + (2 if shares_machine(req.provider) else 0)    # the launch of two together
    with cluster_session(req.provider, cloud, room, run_dir, run_id=run_id, trainer=exp.trainer, seed=exp.seed,
                         config=req.cluster, latency_scale=req.latency_scale, time_attr=exp.time_attr) as session:
        measurement = _Measurement(req, session)
        try:
            # The first launch; the model is measured on that one instance, the other launches
            # come last (they grow the cluster, which the measurements should not see).
            launch_s = measurement.launch(1)
            progress(f"first instance ready and warm after {launch_s:.1f}s")
            reserve_s = (req.launches - 1 + (1 if shares_machine(provider) else 0)) * launch_s
            repeat_s: dict[int, float] = {}
            for _ in range(req.repeats):
                for m in req.gpu_counts:
                    if m in skipped:
                        continue
                    guess = repeat_s.get(m) or (max(repeat_s.values()) if repeat_s else 0.0)
                    if (req.max_seconds is not None and durations
                            and time.time() - t_start + guess + reserve_s > req.max_seconds):
                        stopped_early = True
                        if m not in durations:
                            skipped.append(m)
                        continue
                    t0 = time.time()
                    short, long, stage_sync = measurement.gpu_count(m)
                    repeat_s[m] = time.time() - t0
                    have = durations.setdefault(m, ([], []))
                    have[0].extend(short)
                    have[1].extend(long)
                    sync.extend(stage_sync)
                    done_repeats[m] = done_repeats.get(m, 0) + 1
                    est_iter, _ = _estimate(have, req.iters)
                    progress(f"{m} GPU(s)/trial, repeat {done_repeats[m]}/{req.repeats}: "
                             f"{statistics.fmean(est_iter):.4f}s per iteration ({repeat_s[m]:.1f}s)")
            if req.max_packing > 1 and 1 in durations:
                def budget_left() -> bool:
                    return req.max_seconds is None or (time.time() - t_start + repeat_s[1] + reserve_s
                                                       <= req.max_seconds)

                if budget_left():
                    packing = measurement.packing(progress, budget_left)
                else:
                    stopped_early = packing_skipped = True
            if req.max_fused > 1 and 1 in durations:
                if req.max_seconds is None or time.time() - t_start + repeat_s[1] + reserve_s <= req.max_seconds:
                    fusion = measurement.fusion(progress, lambda: req.max_seconds is None or (
                        time.time() - t_start + repeat_s[1] + reserve_s <= req.max_seconds))
                else:
                    stopped_early = True
                    notes.append("fusion not measured: no time left within --max-seconds")
            for count in range(2, req.launches + 1):
                measurement.launch(count)
            if shares_machine(provider):
                measurement.launch(req.launches + 2)        # two instances launched together
            cloud_samples = measurement.cloud_samples(statistics.fmean(d for d, _ in durations[1][0]))
            provision = cloud_samples["provision"]
            init = [x for x, n in zip(cloud_samples["init"], cloud_samples["together"]) if n == 1]
            init_pair = [x for x, n in zip(cloud_samples["init"], cloud_samples["together"]) if n == 2]
            progress(f"provisioning: {_secs(provision)}; initialisation: {_secs(init)} (running -> warm workers "
                     f"{_secs(cloud_samples['warm'])}, plus first trials' one-off cost {_secs(cloud_samples['first_trial'])}); "
                     f"autoscaler lag (asked -> provider request): {_secs(cloud_samples['lag'])}")
        except RubberbandError:
            raise
        except Exception as exc:
            raise _trainer_error(exc, req.trainer) from None
    stop_time = session.stopped_at or time.time()
    took = stop_time - t_start
    if measurement.plan is None:
        raise ProviderError(f"profile: no stage ran on the {provider} cluster; nothing was measured")
    ledger = ledger_from_events(measurement.plan, session.read_events(), t_start, stop_time, [(0.0, took)])
    cost = ledger.cost_usd(now=took)
    instance_s = sum(rec.lifetime_s(took) for rec in ledger.instances.values())

    if stopped_early:
        short_of = {m: n for m, n in done_repeats.items() if n < req.repeats}
        parts = [f"{m} GPU(s) with {n} of {req.repeats} repeats" for m, n in short_of.items()]
        if skipped:
            parts.append(f"GPU counts {', '.join(map(str, skipped))} not measured")
        if packing_skipped:
            parts.append("packing not measured")
        notes.append(f"stopped early to stay within {req.max_seconds:.0f}s: " + "; ".join(parts))

    estimates = {m: _estimate(durations[m], req.iters) for m in req.gpu_counts if m in durations}
    startup_all = [s for _, startup in estimates.values() for s in startup]
    entries: dict[str, Any] = {
        "iter_latency_s": {m: to_profile_entry(iter_samples) for m, (iter_samples, _) in estimates.items()},
        "trial_startup_s": to_profile_entry(startup_all),
        "sync_s": to_profile_entry(sync),
        "provision_latency_s": to_profile_entry(provision),
        "init_latency_s": to_profile_entry(init),
    }
    samples = {
        "iter_latency_s": {m: e["empirical"]["samples"] for m, e in entries["iter_latency_s"].items()},
        "trial_startup_s": entries["trial_startup_s"]["empirical"]["samples"],
        "sync_s": entries["sync_s"]["empirical"]["samples"],
        "cloud": {"provision_latency_s": entries["provision_latency_s"]["empirical"]["samples"],
                  "init_latency_s": entries["init_latency_s"]["empirical"]["samples"],
                  **({"init_two_together_s": [round(x, 4) for x in init_pair]} if init_pair else {}),
                  **{key: [round(x, 4) for x in cloud_samples[part]] for key, part in (
                      ("init_warm_s", "warm"), ("init_first_trial_s", "first_trial"), ("scale_request_lag_s", "lag"))}},
    }
    fitted = {key: parse_distribution(entries[key]["fitted"], key)
              for key in ("trial_startup_s", "sync_s", "provision_latency_s", "init_latency_s")}
    per_gpus = tuple(GpuCountResult(m, parse_distribution(entries["iter_latency_s"][m]["fitted"], f"iter_latency_s.{m}"),
                                    tuple(iter_samples), tuple(startup), done_repeats[m])
                     for m, (iter_samples, startup) in estimates.items())
    trainer_name = req.trainer.split(":")[-1]
    now = dt.datetime.now(dt.UTC)
    profile_doc: dict[str, Any] = {
        "name": exp.model.name,
        "description": f"{trainer_name} on {provider} {cloud.instance_type}, measured by `rubberband profile`",
        "measured_on": {"provider": provider, "region": cloud.region, "instance_type": cloud.instance_type,
                        "gpu_model": cloud.gpu_model or "unknown", "host": os.uname().nodename},
        "measured_at": now.isoformat(timespec="seconds"),
        "rubberband_version": _version(),
    }
    if req.global_batch_size:
        profile_doc["global_batch_size"] = req.global_batch_size
    profile_doc["profiling"] = {
        "experiment": exp.name, "trainer": exp.trainer,
        "seconds": round(took, 1), "cost_usd": round(cost, 6), "instance_seconds": round(instance_s, 1),
        "iters": req.iters, "trial_iters": [K_SHORT, K_SHORT + req.iters], "repeats": req.repeats,
        "repeats_done": dict(done_repeats), "launches": req.launches, "stopped_early": stopped_early,
        **({"notes": list(notes)} if notes else {}),
        "fit": {"criterion": "aic", "iter_latency_s": {m: e["fit"] for m, e in entries["iter_latency_s"].items()}},
        "samples": samples,
    }
    profile_doc["iter_latency_s"] = {m: e["fitted"] for m, e in entries["iter_latency_s"].items()}
    profile_doc["trial_startup_s"] = entries["trial_startup_s"]["fitted"]
    profile_doc["sync_s"] = entries["sync_s"]["fitted"]
    if packing is not None:
        # The packed counts are timed their own way (all GPUs of one instance at once, after a
        # warm-up iteration); what they measure is the throughput k trials per GPU give against
        # one. Scaled so that their k = 1 is the solo latency above, a packed latency keeps that
        # ratio: compared with the solo one, as the planner compares them, it gains what the
        # measurement found and nothing the two methods' difference adds.
        scale, packed = packed_entries(packing, statistics.fmean(estimates[1][0]) if 1 in estimates else None)
        samples["packed_iter_latency_s"] = {k: e["empirical"]["samples"] for k, e in packed.items()}
        profile_doc["profiling"]["packing"] = {
            "mode": packing.mode, "stopped": packing.stopped, "iters": req.iters,
            "solo_iter_s_as_packed": round(packing.counts[0].mean_s, 6), "scaled_by": round(scale, 4),
            "throughput_vs_alone": {c.k: round(c.throughput / packing.counts[0].throughput, 4) for c in packing.counts},
            "fit": {k: e["fit"] for k, e in packed.items() if k > 1},
        }
        if len(packing.counts) > 1:
            profile_doc["packed_iter_latency_s"] = {k: e["fitted"] for k, e in packed.items() if k > 1}
        if packing.gpu_memory_gb_per_trial is not None:
            profile_doc["gpu_memory_gb_per_trial"] = round(packing.gpu_memory_gb_per_trial, 3)
    if isinstance(fusion, str):
        profile_doc["profiling"]["fusion"] = {"not_fusable": fusion}
    elif fusion is not None:
        fused = fused_entries(fusion, statistics.fmean(estimates[1][0]) if 1 in estimates else None)
        profile_doc["profiling"]["fusion"] = fused["profiling"]
        profile_doc["fused_iter_latency_s"] = fused["fused_iter_latency_s"]
        if fused["fused_memory_gb"]:
            profile_doc["fused_memory_gb"] = fused["fused_memory_gb"]
    if measurement.checkpoints:     # a function trainable: how often it checkpoints
        every = checkpoint_interval(measurement.checkpoints)
        profile_doc["checkpoint_every"] = "never" if every is None else every
        reached = max(r for _, r in measurement.checkpoints)
        profile_doc["profiling"]["checkpoints"] = {
            "trials": len(measurement.checkpoints), "iterations": _plain(reached),
            "checkpointed_at": [_plain(list(c)) for c, _ in measurement.checkpoints[:3]]}
        if every is None:
            notes.append(f"no trial reported a checkpoint in {reached} iterations: checkpoint_every is `never` "
                         "(every stage restarts it); a function that checkpoints less often: set checkpoint_every "
                         "in the profile, or profile with a larger --iters")
            profile_doc["profiling"]["notes"] = list(notes)
        progress(f"checkpoints: every {every} iteration(s)" if every is not None else "checkpoints: never")
    ModelProfile.from_dict(profile_doc, where="measured profile")   # what we write must load

    overrides = {"provision_latency_s": entries["provision_latency_s"]["fitted"],
                 "init_latency_s": entries["init_latency_s"]["fitted"]}
    if init_pair:
        together_s = contention_s(fitted["init_latency_s"], init_pair)
        overrides["init_contention_s"] = round(together_s, 4)
        progress(f"two instances launched together: ready {statistics.fmean(init_pair):.2f}s after running, "
                 f"{together_s:.2f}s later than the later of two launched alone would be (init_contention_s)")
    exp.catalog.with_overrides(overrides).get(cloud.instance_type, exp.type_market)   # and so must this

    out_path, cloud_path = output_paths(exp.name, cloud.instance_type, out, cloud_out, runs_dir)
    _write_yaml(out_path, HEADER, profile_doc)
    if cloud_path is not None:
        header = (f"# Cloud latencies measured by `rubberband profile` on {provider} {cloud.instance_type} at "
                  f"{profile_doc['measured_at']}\n# over {len(init)} launches (provisioning: asked -> running; "
                  f"initialisation: running -> warm workers, plus their first trials' one-off cost)"
                  + (", and one launch of two instances together (init_contention_s: how much longer each of "
                     "them took)" if init_pair else "")
                  + ".\n# Use these keys as an experiment's `cloud.overrides`.\n")
        _write_yaml(cloud_path, header, overrides)

    result = ProfileResult(
        experiment=exp.name, provider=provider, instance_type=cloud.instance_type, trainer=req.trainer,
        per_gpus=per_gpus, trial_startup_s=fitted["trial_startup_s"], sync_s=fitted["sync_s"],
        provision_latency_s=fitted["provision_latency_s"], init_latency_s=fitted["init_latency_s"], samples=samples, seconds=took,
        cost_usd=cost, instance_seconds=instance_s, price_usd_per_hour=cloud.hourly_usd, iters=req.iters,
        repeats=req.repeats, stopped_early=stopped_early, notes=tuple(notes), profile=profile_doc,
        cloud_overrides=overrides, out=str(out_path), cloud_out=str(cloud_path) if cloud_path else None,
        run_dir=str(run_dir), skipped_gpus=tuple(skipped), packing=packing,
    )
    return result


def shares_machine(provider: str) -> bool:
    """Whether the provider's instances share this machine's CPUs (``local``: Ray nodes here),
    so that instances launched together initialise slower than one alone (DESIGN §4)."""
    return provider == "local"


def contention_s(init: Distribution, together: Sequence[float], seed: int = 0) -> float:
    """``init_contention_s`` (DESIGN §4) from the INITs of two instances launched together
    (``together``: running -> both ready, per instance) and ``init``, the INIT fitted from
    launches of one alone: how much longer the pair took than the later of two independent
    ``init`` draws (the model's wait for two new instances without contention); 0 at least, and
    at most ``init``'s mean: two instances sharing the CPUs one had to itself take at most twice
    as long, so more is a burst of load from elsewhere during the pair's launch, not contention."""
    import numpy as np

    alone = float(np.max(init.sample(np.random.default_rng(seed), (2, 20000)), axis=0).mean())
    return min(init.mean, max(0.0, statistics.fmean(together) - alone))


def output_paths(name: str, instance_type: str, out: str | Path | None = None,
                 cloud_out: str | Path | bool | None = None, runs_dir: str | Path = "runs") -> tuple[Path, Path | None]:
    """Where ``profile`` writes the model profile and the cloud latency overrides.

    By default both go under ``runs_dir`` (``<runs_dir>/profiles/<name>_<type>.yaml`` and
    ``<stem>.cloud.yaml`` beside it), never into the shipped ``profiles/`` or ``cloud_profiles/``:
    a measurement is this machine's, and a checkout stays as committed. ``cloud_out=False``
    writes no overrides.
    """
    out_path = Path(out) if out else Path(runs_dir) / "profiles" / f"{name}_{instance_type}.yaml"
    if cloud_out is False:
        return out_path, None
    if cloud_out is None or cloud_out is True:
        return out_path, out_path.with_name(out_path.stem + ".cloud.yaml")
    return out_path, Path(cloud_out)


def _secs(values: Sequence[float]) -> str:
    return ", ".join(f"{x:.2f}s" for x in values) or "-"


def packed_entries(packing: PackingResult, solo_s: float | None) -> tuple[float, dict[int, dict[str, Any]]]:
    """``(scale, {k: profile entry})``: the packed counts' samples times ``scale``, which makes
    the packed measurement's ``k = 1`` equal ``solo_s`` (the solo seconds per iteration the
    profile writes); ``scale`` is 1 without ``solo_s``."""
    scale = solo_s / packing.counts[0].mean_s if solo_s else 1.0
    return scale, {c.k: to_profile_entry([x * scale for x in c.iter_samples]) for c in packing.counts}


def _function_checkpoints(trials: Any) -> list[tuple[tuple[int | float, ...], int | float]]:
    """Of a function trainable's trials (the driver's), the iterations each reported checkpoints
    at and how far it got, from its state; nothing for a ``Trainer`` class's trials."""
    from rubberband.function_api import STATE_MAGIC, unpack_state

    out = []
    for trial in trials:
        if trial.checkpoint is not None and trial.checkpoint.startswith(STATE_MAGIC):
            state = unpack_state(trial.checkpoint)
            out.append((state.checkpoints, state.progress))
    return out


def _estimate(trains: tuple[list[Train], list[Train]], iters: int) -> tuple[list[float], list[float]]:
    """Seconds per iteration and start-up samples: from the workers' own iteration timings
    (``split_timed_trains``) when every TRAIN has them, else from durations alone."""
    short, long = trains
    k_long = K_SHORT + iters
    if all(len(it) == K_SHORT for _, it in short) and all(len(it) == k_long for _, it in long):
        return split_timed_trains(short, long, K_SHORT, k_long)
    return split_train_durations([d for d, _ in short], [d for d, _ in long], K_SHORT, k_long)


def _trainer_error(exc: BaseException, trainer: str) -> RubberbandError:
    """One line naming the trainer and what went wrong (Ray wraps the worker's exception)."""
    cause = getattr(exc, "cause", None) or exc
    text = next((line.strip() for line in str(cause).splitlines() if line.strip()), "")
    if len(text) > 300:
        text = text[:297] + "..."
    msg = f"trainer {trainer} failed while profiling: {type(cause).__name__}: {text}"
    return SpecError(msg) if isinstance(cause, SpecError) else ProviderError(msg)


def _version() -> str:
    from rubberband import __version__

    return __version__


def _plain(value: Any) -> Any:
    """Python scalars only (``yaml.safe_dump`` refuses numpy's)."""
    if isinstance(value, dict):
        return {(_plain(k)): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


def _write_yaml(path: Path, header: str, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(header + yaml.safe_dump(_plain(data), sort_keys=False))
    tmp.replace(path)

