"""``pareto_front`` (plan/search.py) against the whole-matrix DP it replaced: every kept point of
a stage meets every option of the next, all at once, and each state keeps the points strictly
cheaper than every faster one. The merged sources and the bounds taken as prefixes must give
the same front, point for point, with and without a deadline, a cap and a Lagrangian weight."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest

from rubberband import Billing, BillingModel, ExperimentSpec
from rubberband.plan.search import StageGraph, pareto_front
from rubberband.plan.table import StageTable
from rubberband.profiles.cloud import Market

from .test_search import fig12, wide_model


def whole_matrix_front(graph: StageGraph, deadline_s: float, cost_cap: float, lam: float | None):
    """The (JCT, cost) points of the front by the old DP: a (points x options) matrix per stage."""
    finite_d, finite_c = math.isfinite(deadline_s), math.isfinite(cost_cap)
    t_eps = 1e-9 * max(1.0, deadline_s if finite_d else 1.0)
    c_eps = 1e-9 * max(1.0, cost_cap if finite_c else 1.0)
    t_go = graph.to_go(1.0, 0.0) if finite_d else None
    c_go = graph.to_go(0.0, 1.0) if finite_c else None
    v_go = graph.to_go(lam, 1.0) if lam and finite_d and finite_c else None
    T, C, S = np.zeros(1), np.zeros(1), np.zeros(1, dtype=np.int64)
    for i in range(graph.num_stages):
        nxt = graph.next[i]
        Tn, Cn = T[:, None] + graph.dur[i][S], C[:, None] + graph.cost[i][S]
        keep = np.ones(Tn.shape, dtype=bool)
        if t_go is not None:
            keep &= Tn + t_go[i + 1][nxt][None, :] <= deadline_s + t_eps
        if c_go is not None:
            keep &= Cn + c_go[i + 1][nxt][None, :] <= cost_cap + c_eps
        if v_go is not None:
            keep &= Cn + lam * Tn + v_go[i + 1][nxt][None, :] <= cost_cap + lam * deadline_s + c_eps + lam * t_eps
        keep = np.flatnonzero(keep)
        if len(keep) == 0:
            return []
        _, option = np.divmod(keep, len(nxt))
        Tn, Cn, Sn = Tn.ravel()[keep], Cn.ravel()[keep], nxt[option]
        order = np.lexsort((Cn, Tn, Sn))
        Tn, Cn, Sn = Tn[order], Cn[order], Sn[order]
        mask = np.zeros(len(Tn), dtype=bool)
        starts = np.flatnonzero(np.r_[True, Sn[1:] != Sn[:-1]])
        for s, e in zip(starts, np.r_[starts[1:], len(Tn)]):
            seg = Cn[s:e]
            mask[s] = True
            mask[s + 1:e] = seg[1:] < np.minimum.accumulate(seg)[:-1] - 1e-12
        T, C, S = Tn[mask], Cn[mask], Sn[mask]
    out, best = [], math.inf
    for j in np.lexsort((C, T)):
        if C[j] < best - 1e-12:
            best = C[j]
            out.append((float(T[j]), float(C[j])))
    return out


def one_gpu_cloud():
    """Figure 12's cloud with one GPU per instance: a held count per GPU, so many states."""
    cloud = fig12().cloud
    return cloud.replace(gpus_per_instance=1, price_usd_per_hour=cloud.price_usd_per_hour / cloud.gpus_per_instance)


@cache
def tables():
    hyperband = ExperimentSpec.chain(ExperimentSpec.hyperband(1, 9, 3))
    sha = ExperimentSpec.sha(64, 4, 512, 2)
    cloud = fig12().cloud
    spot = cloud.replace(spot_price_usd_per_hour=0.3 * cloud.price_usd_per_hour)
    per_function = cloud.replace(billing=Billing(BillingModel.PER_FUNCTION))
    out = {
        "hyperband9-G4": StageTable(hyperband, wide_model(4), cloud, samples=20, seed=1),
        "hyperband9-G1": StageTable(hyperband, wide_model(8), one_gpu_cloud(), samples=20, seed=2),
        "sha64-G1": StageTable(sha, wide_model(16), one_gpu_cloud(), samples=20, seed=3),
        "sha64-per-function": StageTable(sha, wide_model(8), per_function, samples=20, seed=4),
        "hyperband9-held5": StageTable(hyperband, wide_model(4), cloud, samples=20, seed=5, held_at_start=5),
    }
    markets = tuple(Market.SPOT if i % 2 else Market.ON_DEMAND for i in range(hyperband.num_stages()))
    out["hyperband9-markets"] = StageTable(hyperband, wide_model(4), spot, samples=20, seed=6).for_markets(markets)
    return out


def points(table: StageTable, plans) -> list[tuple[float, float]]:
    return [table.evaluate(a, h) for a, h in plans]


@pytest.mark.parametrize("name", ["hyperband9-G4", "hyperband9-G1", "sha64-G1", "sha64-per-function",
                                  "hyperband9-held5", "hyperband9-markets"])
def test_the_front_is_the_whole_matrix_dps_point_for_point(name):
    table = tables()[name]
    graph = StageGraph(table)
    fastest = graph.fastest().jct_s
    cases = [(math.inf, math.inf, None)]
    for factor in (1.02, 1.3, 2.0):
        deadline = fastest * factor
        hull = graph.hull_plan(deadline)
        assert hull is not None
        plan, lam = hull
        cases += [(deadline, math.inf, None), (deadline, plan.cost_usd * 1.03, None),
                  (deadline, plan.cost_usd * 1.03, lam or None), (deadline, plan.cost_usd, lam or None),
                  (math.inf, plan.cost_usd * 1.1, None)]
    for deadline, cap, lam in cases:
        graph = StageGraph(table, deadline)
        expected = whole_matrix_front(graph, deadline, cap, lam)
        front = pareto_front(table, deadline, cap, graph=graph, lam=lam)
        got = points(table, front)
        assert len(got) == len(expected) and (not got or np.allclose(got, expected, rtol=1e-12, atol=0)), \
            (deadline, cap, lam)
        assert [t for t, _ in got] == sorted(t for t, _ in got)


def test_an_empty_front_when_the_cap_is_below_every_plan():
    table = tables()["hyperband9-G4"]
    graph = StageGraph(table)
    plan = graph.weighted_plan(0.0)      # the cheapest plan
    assert pareto_front(table, math.inf, plan.cost_usd * 0.99, graph=graph) == []
    assert whole_matrix_front(graph, math.inf, plan.cost_usd * 0.99, None) == []
