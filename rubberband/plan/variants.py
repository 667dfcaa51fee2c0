"""Per-stage instance types, trials per GPU and fused trials: one exact search over several ``StageTable``s.

A plan may run each stage on another instance type, and pack ``k`` 1-GPU trials to a GPU, or
fuse ``F`` of them into one program per GPU (DESIGN §4.5), in a stage. Each (instance type, k
or F) is a *variant* with its own ``StageTable`` (same job, same
seed and samples, so the same random numbers in every variant). ``VariantTable`` lays the
variants out as one table that the exact search (``StageGraph``, ``pareto_front``,
``optimal_policy``, ``choose``) runs on unchanged, by encoding the variant in the integers
the search already handles:

* an option's allocation ``a`` in variant ``v`` is the key ``a * V + v`` (``V`` variants);
* a held count ``h`` of type ``t`` is the state ``h * T + t`` (``T`` types): the state
  between stages is now (type, instances held). A held count can only carry instances of
  its own type (``StageTable.state_types``).

A stage of type ``t`` keeps what the stage before held only if that was type ``t`` too; after
another type it starts from nothing held, as the simulator does at a change of type (every
old instance released at the SYNC, all new ones launched: SCALE, INIT and data cost on the
new type). Every other number is the variant table's own, so the search is exact over the
union of the variants: the chosen per-stage plan is never costlier, by the surrogate, than
the best plan of any single variant, and ``choose`` simulates the plans it keeps in full.
The surrogate leaves out the old type's billing rounding at a change (only adds: a lower
bound, as everywhere).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rubberband.plan.table import StageEntry, StageTable
from rubberband.profiles.cloud import CloudProfile, Market
from rubberband.profiles.model import ModelProfile
from rubberband.simulator.engine import simulate
from rubberband.simulator.result import SimResult

# Packing is offered only where it clearly pays (issue #16 item 3): the least gain in the
# profile's packed throughput over one trial alone, the profiler's measurement noise.
PACKING_MIN_GAIN = 0.05


def packing_gain(model: ModelProfile, k: int) -> float:
    """The profile's packed throughput at ``k`` trials per GPU over one trial alone: iterations
    per GPU-second, ``k * E[L_1] / E[L_k]`` (1.0: ``k`` trials take ``k`` times as long)."""
    return k * model.latency(1).mean / model.packed_latency(k).mean


def packing_pays(model: ModelProfile, k: int) -> bool:
    """Whether the search may pack ``k`` 1-GPU trials to a GPU: only where the profile's packed
    throughput beats one trial alone by at least ``PACKING_MIN_GAIN`` (5%).

    The model runs every packed TRAIN as ``startup + iters * L_k`` (``simulate``), so ``k``
    trials on one GPU overlap their ``k`` start-ups: with a start-up, packing looks cheaper
    in the model even where ``L_k = k * L_1`` and packing gives nothing, or less than nothing
    (the local profiler measured 0.96x at ``k = 4``, and the planner packed). The profile does
    not measure that overlap, and a gain within the profiler's noise is no gain: so ``k`` is
    offered only on the profile's own per-iteration throughput, ``packing_gain(model, k) >=
    1 + PACKING_MIN_GAIN``. Where it is offered, the search still packs only where that is
    cheaper. ``k = 1`` (no packing) is always offered."""
    return k == 1 or packing_gain(model, k) >= 1 + PACKING_MIN_GAIN - 1e-12


def fusion_gain(model: ModelProfile, fused: int) -> float:
    """The profile's fused throughput at ``F`` trials per GPU over one plain trial alone:
    iterations per GPU-second, ``F * E[L_1] / E[L_F]`` (``L_1`` the unfused ``iter_latency_s[1]``,
    ``L_F`` one iteration of the whole group; 1.0: fusing gives nothing)."""
    return fused * model.latency(1).mean / model.fused_latency(fused).mean


def fusion_pays(model: ModelProfile, fused: int) -> bool:
    """Whether the search may fuse ``F`` 1-GPU trials into one program per GPU: by the rule of
    ``packing_pays``, only where the profile's fused throughput ``fusion_gain(model, F)`` beats
    one plain trial by at least ``PACKING_MIN_GAIN`` (5%). A fused stage runs one start-up per
    group instead of one per trial, so with a start-up fusion looks cheaper in the model even
    where ``L_F = F * L_1``; that saving is real (one program loads once) but the profile never
    measured it, so it earns nothing on its own. ``F = 1`` (no fusion) is always offered."""
    return fused == 1 or fusion_gain(model, fused) >= 1 + PACKING_MIN_GAIN - 1e-12


class VariantTable:
    """Several ``StageTable``s of one job (one per instance type and trials per GPU or fused per GPU) as one table.

    Args:
        tables: the variants; all of the same spec, samples and seed (build them with one
            ``draws``). Each may plan by its own part of ``model`` (``usable_profile``).
        model: the profile every variant's GPUs were measured by, which full simulations use.
        target_model: likewise for a surrogate job's target stage (default: the first table's).
    """

    def __init__(self, tables: Sequence[StageTable], model: ModelProfile, target_model: ModelProfile | None = None):
        first = tables[0]
        self.tables = list(tables)
        self.model = model
        self.spec, self.samples, self.seed, self.draws = first.spec, first.samples, first.seed, first.draws
        self.type_names = list(dict.fromkeys(t.cloud.instance_type for t in tables))
        self.type_of = [self.type_names.index(t.cloud.instance_type) for t in tables]
        self.state_types = len(self.type_names)
        self.per_instance = all(t.per_instance for t in tables)
        self.fast_s = [min(t.fast_s[i] for t in tables) for i in range(first.num_stages)]
        self.held_at_start = first.held_at_start
        self.target_model = target_model or first.target_model      # a surrogate job's target stage (DESIGN §4.6)
        self.models = first.models
        self.redone = first.redone          # each stage's redone iterations (DESIGN §4): the variants share them
        self._simulations: dict[tuple[tuple[int, ...], tuple[int, ...]], SimResult] = {}

    @property
    def num_stages(self) -> int:
        return self.tables[0].num_stages

    @property
    def cloud(self) -> CloudProfile:
        """The first variant's type (for messages)."""
        return self.tables[0].cloud

    @property
    def clouds(self) -> dict[str, CloudProfile]:
        """Each type's profile, by name."""
        return {t.cloud.instance_type: t.cloud for t in reversed(self.tables)}

    def _split(self, key: int) -> tuple[int, StageTable]:
        a, v = divmod(int(key), len(self.tables))
        return a, self.tables[v]

    def optimistic(self) -> VariantTable:
        """``StageTable.optimistic`` of every variant (full simulations stay shared)."""
        view = copy.copy(self)
        view.tables = [t.optimistic() for t in self.tables]
        return view

    def for_markets(self, markets: Sequence[Market]) -> VariantTable:
        """Every variant on other markets per stage (``StageTable.for_markets``)."""
        other = copy.copy(self)
        other.tables = [t.for_markets(markets) for t in self.tables]
        other.fast_s = [min(t.fast_s[i] for t in other.tables) for i in range(self.num_stages)]
        other._simulations = {}
        return other

    @property
    def start_state(self) -> int:
        """The state before stage 0: the instances held at the start of a variant's type."""
        return next((t.start_state * self.state_types + self.type_of[v] for v, t in enumerate(self.tables)
                     if t.start_state), 0)

    @property
    def markets(self) -> tuple[Market, ...]:
        return self.tables[0].markets

    def candidates(self, stage: int, deadline_s: float = math.inf) -> list[int]:
        """Every variant's candidate keys, ascending; with a deadline, without queued ones that
        cannot meet it even if every other stage ran at its fastest in any variant."""
        V = len(self.tables)
        if deadline_s == math.inf:
            return sorted(a * V + v for v, t in enumerate(self.tables) for a in t.candidates(stage))
        others = sum(self.fast_s) - self.fast_s[stage]
        return sorted(a * V + v for v, t in enumerate(self.tables) for a in t.candidates(stage)
                      if t.parallel(stage, a) or a in t.entries[stage]
                      or t.queue_bound_s_stage(stage, a) + others <= deadline_s)

    def parallel(self, stage: int, key: int) -> bool:
        a, table = self._split(key)
        return table.parallel(stage, a)

    def need(self, stage: int, key: int) -> int:
        """The state of the fewest instances a key needs: count and type."""
        a, v = divmod(int(key), len(self.tables))
        return self.tables[v].need(stage, a) * self.state_types + self.type_of[v]

    def holds(self, state: int) -> bool:
        """Whether a stage may hold the state's count of its type (each type's ``max_instances``)."""
        h, t = divmod(int(state), self.state_types)
        return next(table for v, table in enumerate(self.tables) if self.type_of[v] == t).holds(h)

    def entry(self, stage: int, key: int) -> StageEntry:
        a, table = self._split(key)
        return table.entry(stage, a)

    def train_s(self, stage: int, key: int) -> float:
        a, table = self._split(key)
        return table.train_s(stage, a)

    def train_s_cheap(self, stage: int, key: int) -> bool:
        a, table = self._split(key)
        return table.train_s_cheap(stage, a)

    def train_bound(self, stage: int, key: int) -> float:
        a, table = self._split(key)
        return table.train_bound(stage, a)

    def simulated_cheaply(self, stage: int, key: int) -> bool:
        a, table = self._split(key)
        return table.simulated_cheaply(stage, a)

    def stage_bounds(self, stage: int, key: int) -> tuple[float, float]:
        a, table = self._split(key)
        return table.stage_bounds(stage, a)

    def stage_many(self, i: int, allocations: np.ndarray, held: np.ndarray,
                   previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``StageTable.stage_many`` of each key's variant, from nothing held after another type."""
        allocations, held, previous = np.broadcast_arrays(np.asarray(allocations), np.asarray(held),
                                                          np.asarray(previous))
        a, v = np.divmod(allocations, len(self.tables))
        h = held // self.state_types
        prev_h, prev_t = np.divmod(previous, self.state_types)
        duration, cost = np.zeros(allocations.shape), np.zeros(allocations.shape)
        for var in np.unique(v):
            rows = v == var
            prev = np.where(prev_t[rows] == self.type_of[var], prev_h[rows], 0)
            duration[rows], cost[rows] = self.tables[var].stage_many(i, a[rows], h[rows], prev)
        return duration, cost

    def stage_grid(self, i: int, allocations: np.ndarray, held: np.ndarray,
                   previous: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.stage_many(i, allocations[None, :], held[None, :], previous[:, None])

    def evaluate_many(self, allocations: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        jct = np.zeros(len(allocations))
        cost = np.zeros(len(allocations))
        previous = np.full(len(allocations), self.start_state, dtype=np.int64)
        for i in range(self.num_stages):
            d, c = self.stage_many(i, allocations[:, i], held[:, i], previous)
            jct, cost, previous = jct + d, cost + c, held[:, i]
        return jct, cost

    def evaluate(self, allocation: Sequence[int], held: Sequence[int] | None = None) -> tuple[float, float]:
        held = [self.need(i, a) for i, a in enumerate(allocation)] if held is None else held
        jct, cost = self.evaluate_many(np.array([allocation], dtype=np.int64), np.array([held], dtype=np.int64))
        return float(jct[0]), float(cost[0])

    def launches(self, allocation: Sequence[int], held: Sequence[int]) -> list[tuple[StageTable, int, int, int]]:
        """Per stage of a plan's keys: its variant's table, the stage, the allocation and the new
        instances it launches (all it holds after another type, as ``stage_many`` counts them)."""
        V, T = len(self.tables), self.state_types
        out, previous = [], self.start_state
        for i, (key, state) in enumerate(zip(allocation, held)):
            a, v = divmod(int(key), V)
            prev_h, prev_t = divmod(int(previous), T)
            prev = prev_h if prev_t == self.type_of[v] else 0
            table = self.tables[v]
            out.append((table, i, a, max(0, int(state) // T - int(table.previous_held(i, prev)))))
            previous = state
        return out

    def plan_fields(self, allocation: Sequence[int], held: Sequence[int]) -> dict[str, Any]:
        """A plan's ``Plan`` fields from its keys: allocation, instances, types, trials (and fused) per GPU."""
        fields: dict[str, list] = {"allocation": [], "instances": [], "instance_types": [], "trials_per_gpu": [],
                                   "spot_instances": [], "fused_per_gpu": []}
        for i, (key, state) in enumerate(zip(allocation, held)):
            a, table = self._split(key)
            h = int(state) // self.state_types
            fields["allocation"].append(a)
            fields["instances"].append(h)
            fields["instance_types"].append(table.cloud.instance_type)
            fields["trials_per_gpu"].append(table.k)
            fields["fused_per_gpu"].append(table.fused)
            fields["spot_instances"].append(h if table.markets[i] is Market.SPOT else 0)
        out: dict[str, Any] = {k: tuple(v) for k, v in fields.items()}
        types = set(out["instance_types"])
        out["cloud"] = self.clouds[out["instance_types"][0]]
        out["type_clouds"] = {name: c for name, c in self.clouds.items() if name in types} if len(types) > 1 else {}
        if len(types) == 1:
            out["instance_types"] = ()
        if all(k == 1 for k in out["trials_per_gpu"]):
            out["trials_per_gpu"] = ()
        if all(f == 1 for f in out["fused_per_gpu"]):
            out["fused_per_gpu"] = ()
        return out

    def _one_variant(self, allocation: Sequence[int], held: Sequence[int]):
        """The variant table and its own vectors of a plan all in one variant, else ``None``."""
        V, T = len(self.tables), self.state_types
        variants = {int(a) % V for a in allocation}
        if len(variants) != 1:
            return None
        return self.tables[variants.pop()], [int(a) // V for a in allocation], [int(h) // T for h in held]

    def simulate(self, allocation: Sequence[int], held: Sequence[int]) -> SimResult:
        """The full simulation of a plan's keys, once (a plan of one variant: that table's, shared)."""
        one = self._one_variant(allocation, held)
        if one is not None:
            return one[0].simulate(one[1], one[2])
        key = (tuple(int(a) for a in allocation), tuple(int(h) for h in held))
        if key not in self._simulations:
            f = self.plan_fields(*key)
            self._simulations[key] = simulate(
                self.spec, f["allocation"], self.model, self.clouds if f["instance_types"] else f["cloud"],
                samples=self.samples, seed=self.seed, instances=f["instances"], draws=self.draws,
                spot_instances=f["spot_instances"], trials_per_gpu=f["trials_per_gpu"] or None,
                instance_types=f["instance_types"] or None, held_at_start=self.held_at_start,
                fused_per_gpu=f["fused_per_gpu"] or None, target_model=self.target_model, redone=self.redone)
        return self._simulations[key]

    def simulated(self, allocation: Sequence[int], held: Sequence[int]) -> SimResult | None:
        one = self._one_variant(allocation, held)
        if one is not None:
            return one[0].simulated(one[1], one[2])
        return self._simulations.get((tuple(int(a) for a in allocation), tuple(int(h) for h in held)))

    def spot_instances(self, held: Sequence[int]) -> tuple[int, ...]:
        return tuple(int(h) // self.state_types if m is Market.SPOT else 0 for h, m in zip(held, self.markets))

    def static_candidates(self, deadline_s: float = math.inf, cost_cap: float = math.inf) -> list:
        """Each unpacked, unfused variant's static clusters, as keys."""
        from rubberband.plan.policies import Candidate, static_candidates

        V, T, out = len(self.tables), self.state_types, []
        for v, table in enumerate(self.tables):
            if table.k != 1 or table.fused != 1:
                continue
            for c in static_candidates(table, deadline_s, cost_cap):
                out.append(Candidate(tuple(a * V + v for a in c.allocation),
                                     tuple(h * T + self.type_of[v] for h in c.instances), c.jct_s, c.cost_usd, c.note))
        return out
