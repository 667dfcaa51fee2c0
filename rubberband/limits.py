"""Size guards: the memory and work a simulation, a plan search or a what-if sweep will take,
estimated from the job's shape before anything is allocated, so a job too large for one
machine is refused with one line (the size, the limit, how to shrink it) instead of dying
with a MemoryError or running for hours.

A *cell* is one float64 per Monte-Carlo sample (8 bytes); *work* counts the cells an
algorithm reads or writes. With ``S`` samples and stage ``i`` running ``n_i`` trials:

* ``simulate`` (one plan: ``a_i`` GPUs per stage, at most ``new`` instances launched at once)::

      memory = 8 B * S * (sum n_i + new + 4 * stages)
      work   = S * sum (n_i + q_i(a_i))

  TRAIN durations of every stage (one row per trial), the INIT draws of the largest
  scale-up (one row per instance), per-stage time and cost. ``q(a) = (n - a) * a`` when
  trials queue (``a < n``): each queued trial goes to the GPU that frees first, a scan
  over ``a`` GPUs.
* the planner's table (``A_i`` the valid allocations of stage ``i``)::

      memory = 8 B * S * (4 * sum n_i * M + 2 * H + 16 * stages [+ 40 * H on spot])
      work   = S * sum_i sum_{a in A_i} (n_i + q_i(a))

  ``M`` GPU counts per trial in the profile (each caches its TRAIN durations per stage, its
  latency draws, and the search simulates its candidates on copies; ``check_plan_size`` adds
  one for all fused ``F`` together, whose groups are ``sum 1/F < 1`` rows per trial), ``H`` the
  instances of
  the widest allocation of any stage (their INIT draws); a spot market that may reclaim adds
  each position's incarnations (the spot kernel's schedule). Calibrated on the peak RSS
  (``VmHWM``) of `rubberband plan` (every policy compared), cells per sample (issue 21: the
  estimate was 2-6x low and ``--samples 150000`` peaked at 5.4 GB)::

      experiment (market, type)               measured   estimate
      resnet101_cifar10                           4,614      6,464
      resnet50_sha64                              4,366      8,752
      resnet50_sha512                            35,325     69,728
      demo                                          295        360
      resnet101_spot (on-demand, p3.2xlarge)      7,123      8,000
      resnet101_spot (spot, p3.2xlarge)          33,910     48,960
      resnet101_spot (auto, p3.2xlarge)          36,273     48,960
      resnet101_spot (auto, p3.8xlarge)          14,118     16,704

  The table checks its own size (on-demand terms: it knows no market); ``check_plan`` adds the
  spot term before a plan starts. ``tests/unit/test_limits.py`` measures three again: never
  below, at most 2.5x above.
* a rehearsal (``run --provider sim``: the executor's driver and the scheduler in virtual time)
  keeps, per TRAIN (a trial's stage: the scheduler's and the backend's records, the ledger's,
  the report's), about ``REHEARSAL_TRAIN_BYTES``, and per iteration it trained (its time)
  ``REHEARSAL_ITER_BYTES``; every repeat is kept for the report (a million-trial job grew
  past 3.6 GB, issue 21). With ``I_i`` the iterations of stage ``i``::

      memory = repeats * (REHEARSAL_TRAIN_BYTES * sum n_i + REHEARSAL_ITER_BYTES * sum n_i I_i)
* ``build_dag``: about ``DAG_ELEMENT_BYTES`` per node and edge; a stage that launches ``new``
  instances links each of its running trials to each INIT node (``running * new`` edges).
* a what-if sweep: a table per distinct non-deadline scenario, and per scenario and policy a
  plan search of about ``SEARCH_SIMULATIONS`` full simulations::

      work = tables * table work + scenarios * policies * SEARCH_SIMULATIONS * S * sum n_i

The limits are generous: every shipped experiment, benchmark and figure stays far below
them (SHA(512) at 200 samples, the largest, plans with about 0.1 GB and 1.4e8 work).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rubberband.errors import SpecError

CELL_BYTES = 8
MAX_MEMORY_BYTES = 2 * 2**30        # numpy arrays of one computation
MAX_WORK = 3e10                     # cells touched: about two minutes of numpy (~2.5e8 a second, one core)
MAX_ALLOCATIONS = 20_000            # valid allocations of one stage (the planner weighs every one)
SEARCH_SIMULATIONS = 10             # full simulations of a typical plan search (``choose``)
PLAN_OPS = 1_000_000                # fixed cost of one plan search (the DP over stages), in cells
DAG_ELEMENT_BYTES = 200             # a networkx node or edge with its attributes (measured: ~140)
TABLE_CELLS_PER_TRIAL = 4           # cells per trial, GPU count and sample of a plan (calibrated above)
TABLE_CELLS_PER_INSTANCE = 2        # per instance of the widest allocation and sample (its INIT draws)
TABLE_CELLS_PER_STAGE = 16          # per stage and sample (times, costs, sync and scale draws)
SPOT_CELLS_PER_INSTANCE = 40        # per instance and sample on a spot market that reclaims (incarnations)
# A rehearsal's TRAIN and its iterations, measured with tracemalloc on SHA(512, 4, 4096, 2)
# (~2.5 kB a TRAIN) and rounded up.
REHEARSAL_TRAIN_BYTES = 4096
REHEARSAL_ITER_BYTES = 16

SHRINK = "fewer trials or stages"


def check_samples_seed(samples: object, seed: object) -> None:
    """Monte-Carlo ``samples`` must be a positive integer and ``seed`` a non-negative one."""
    if isinstance(samples, bool) or not isinstance(samples, int | np.integer) or samples < 1:
        raise SpecError(f"samples: expected a positive integer, got {samples!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise SpecError(f"seed: expected a non-negative integer, got {seed!r}")


def queue_work(num_trials: int, allocation: int) -> int:
    """Cells per sample that list scheduling touches when ``num_trials`` queue on ``allocation`` GPUs."""
    return (num_trials - allocation) * allocation if allocation < num_trials else 0


def check_simulation(trials: Sequence[int], allocation: Sequence[int], new_instances: int, samples: int) -> None:
    """Refuse a simulation of one plan too large to hold or to run (see the module docstring)."""
    _check(f"simulating {_trials(trials)} on {','.join(map(str, allocation))} GPUs", samples,
           memory=sum(trials) + new_instances + 4 * len(trials),
           work=sum(n + queue_work(n, a) for n, a in zip(trials, allocation)))


def table_work(trials: Sequence[int], candidates: Sequence[Sequence[int]]) -> int:
    """Cells per sample to fill the planner's table (see the module docstring)."""
    return sum(len(c) * n + sum(queue_work(n, a) for a in c) for n, c in zip(trials, candidates))


def check_table(trials: Sequence[int], candidates: Sequence[Sequence[int]] | None, gpu_counts: int,
                max_instances: int, samples: int) -> None:
    """Refuse a plan search whose table would not fit in memory or take too long to fill.

    With ``candidates=None`` (before they are listed, which alone can take long) the number
    of allocations is bounded from the profile (``gpu_counts`` multiples of the trial count
    plus at most ``4 sqrt(n)`` ways to queue) and the work from the parallel allocations alone.
    """
    if candidates is None:
        counts = [gpu_counts + 4 * math.isqrt(n) for n in trials]
        work = sum(gpu_counts * n for n in trials)
    else:
        counts = [len(c) for c in candidates]
        work = table_work(trials, candidates)
    stage = max(range(len(counts)), key=counts.__getitem__)
    if counts[stage] > MAX_ALLOCATIONS:
        raise SpecError(f"job too large: stage {stage} has about {counts[stage]:,} valid allocations for its "
                        f"{trials[stage]:,} trials ({gpu_counts:,} GPU counts per trial in the model profile), over "
                        f"the {MAX_ALLOCATIONS:,} limit; profile fewer GPU counts per trial or use {SHRINK} "
                        "(limits in rubberband/limits.py)")
    _check(f"planning {_trials(trials)} over {sum(counts):,} allocations ({gpu_counts:,} GPU counts per trial)",
           samples, memory=table_memory_cells(trials, gpu_counts, max_instances), work=work)


def table_memory_cells(trials: Sequence[int], gpu_counts: int, max_instances: int, spot: bool = False) -> int:
    """Cells per sample a plan holds at its peak (see the module docstring); ``spot``: on a
    spot market that may reclaim."""
    return (TABLE_CELLS_PER_TRIAL * sum(trials) * gpu_counts + TABLE_CELLS_PER_INSTANCE * max_instances
            + TABLE_CELLS_PER_STAGE * len(trials) + (SPOT_CELLS_PER_INSTANCE * max_instances if spot else 0))


def check_plan(trials: Sequence[int], gpu_counts: int, max_instances: int, samples: int, spot: bool) -> None:
    """Refuse a plan too large for memory before its first table is drawn, counting what the
    table's own check (``check_table``) cannot know: the spot market's incarnations."""
    _check(f"planning {_trials(trials)}{' on spot' if spot else ''} ({gpu_counts:,} GPU counts per trial)", samples,
           memory=table_memory_cells(trials, gpu_counts, max_instances, spot), work=0)


def check_rehearsal(trials: Sequence[int], iters: Sequence[int], repeat: int = 1) -> None:
    """Refuse, in one line, a rehearsal of a job of ``trials`` per stage, each training ``iters``
    iterations in it (``ExperimentSpec.trials`` and ``.iters``), ``repeat`` of them each kept for
    the report, too large to hold in memory (see the module docstring). Call it before the first
    rehearsal, whatever backend plays it.

    Raises:
        SpecError: naming the job's size, the estimate and how to shrink it.
    """
    trains = sum(trials)
    trained = sum(n * k for n, k in zip(trials, iters))
    per_run = trains * REHEARSAL_TRAIN_BYTES + trained * REHEARSAL_ITER_BYTES
    need = per_run * max(int(repeat), 1)
    if need <= MAX_MEMORY_BYTES:
        return
    fit = int(MAX_MEMORY_BYTES // per_run)
    how = f"use --repeat {fit} or fewer" if fit >= 1 and repeat > 1 else "rehearse a job with fewer trials"
    raise SpecError(f"job too large: rehearsing {len(trials)} stage(s) of {trains:,} trials in all"
                    f"{f' {repeat:,} times' if repeat > 1 else ''} needs about {_gb(need)} of memory, over the "
                    f"{_gb(MAX_MEMORY_BYTES)} limit; {how} (limits in rubberband/limits.py)")


def check_sweep(scenarios: int, policies: int, trials: Sequence[int], samples: int, table_cells: int = 0,
                tables: int = 0) -> None:
    """Refuse a what-if sweep of too many scenarios before the first is planned."""
    plans = scenarios * policies
    _check(f"a what-if sweep of {scenarios:,} scenarios x {policies} policies", samples, memory=0,
           work=tables * table_cells + plans * SEARCH_SIMULATIONS * sum(trials), fixed=plans * PLAN_OPS,
           shrink="fewer swept values")


def check_dag(nodes: int, edges: int) -> None:
    """Refuse a task graph (``build_dag``) too large for memory: about ``DAG_ELEMENT_BYTES`` a
    node or edge. Every running trial of a stage that scales up waits on each new instance,
    so edges grow as trials x instances."""
    nbytes = (nodes + edges) * DAG_ELEMENT_BYTES
    if nbytes > MAX_MEMORY_BYTES:
        raise SpecError(f"job too large: its task graph has {nodes:,} nodes and {edges:,} edges, about {_gb(nbytes)} "
                        f"of memory, over the {_gb(MAX_MEMORY_BYTES)} limit; use {SHRINK}, or simulate() it, which "
                        "needs no graph (limits in rubberband/limits.py)")


def _trials(trials: Sequence[int]) -> str:
    return f"{len(trials)} stage(s) of {sum(trials):,} trial{'' if sum(trials) == 1 else 's'} in all"


def _check(what: str, samples: int, memory: float, work: float, fixed: float = 0.0, shrink: str = SHRINK) -> None:
    """Refuse unless ``memory`` cells and ``work`` cell operations per sample, times ``samples``
    (plus ``fixed`` operations whatever the samples), stay within the limits; the advice is
    the most samples that fit both."""
    nbytes, ops = memory * samples * CELL_BYTES, work * samples + fixed
    over = []
    if nbytes > MAX_MEMORY_BYTES:
        over.append(f"needs about {_gb(nbytes)} of memory, over the {_gb(MAX_MEMORY_BYTES)} limit")
    if ops > MAX_WORK:
        over.append(f"is about {ops:.1e} cell operations, over the {MAX_WORK:.0e} limit (hours of computing)")
    if not over:
        return
    fit = min(MAX_MEMORY_BYTES // (memory * CELL_BYTES) if memory else samples,
              (MAX_WORK - fixed) // work if work else samples)
    how = f"use at most {int(fit):,} samples (--samples) or {shrink}" if fit >= 1 else f"use {shrink}"
    raise SpecError(f"job too large: {what} x {samples:,} samples {' and '.join(over)}; {how} "
                    "(limits in rubberband/limits.py)")


def _gb(nbytes: float) -> str:
    return f"{nbytes / 2**30:,.1f} GB" if nbytes < 1000 * 2**30 else f"{nbytes / 2**40:,.1f} TB"


__all__ = ["CELL_BYTES", "DAG_ELEMENT_BYTES", "MAX_ALLOCATIONS", "MAX_MEMORY_BYTES", "MAX_WORK",
           "PLAN_OPS", "REHEARSAL_ITER_BYTES", "REHEARSAL_TRAIN_BYTES", "SEARCH_SIMULATIONS", "SPOT_CELLS_PER_INSTANCE",
           "TABLE_CELLS_PER_INSTANCE", "TABLE_CELLS_PER_STAGE", "TABLE_CELLS_PER_TRIAL",
           "check_dag", "check_plan", "check_rehearsal", "check_samples_seed", "check_simulation", "check_sweep", "check_table",
           "queue_work", "table_memory_cells", "table_work"]
