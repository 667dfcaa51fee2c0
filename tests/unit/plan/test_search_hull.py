"""``StageGraph.hull_plan`` (plan/search.py): the walk along the lower convex hull of (mean JCT,
cost) finds the hull plan a brute force over the whole Pareto front finds, in a few shortest
paths (a bisection on the weight took some forty)."""

from __future__ import annotations

import numpy as np
import pytest

from rubberband import ExperimentSpec
from rubberband.plan.search import StageGraph, pareto_front
from rubberband.plan.table import StageTable

from .test_search import fig12, wide_model


def lower_hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The lower convex hull of (time, cost) points, by time (Andrew's monotone chain)."""
    hull: list[tuple[float, float]] = []
    for p in sorted(set(points)):
        while len(hull) >= 2:
            (t1, c1), (t2, c2) = hull[-2], hull[-1]
            if (t2 - t1) * (p[1] - c1) - (c2 - c1) * (p[0] - t1) <= 0:
                hull.pop()
            else:
                break
        hull.append(p)
    # Keep the part that falls as time grows: the plans a weight on time can pick.
    return [p for i, p in enumerate(hull) if all(q[1] > p[1] for q in hull[:i])]


@pytest.mark.parametrize("spec", [ExperimentSpec.sha(64, 4, 512, 2), ExperimentSpec.chain(ExperimentSpec.hyperband(1, 9, 3))],
                         ids=["sha64", "hyperband9"])
def test_the_hull_walk_finds_the_brute_force_hull_plan_in_a_few_shortest_paths(spec, monkeypatch):
    table = StageTable(spec, wide_model(), fig12().cloud, samples=30, seed=3)
    graph = StageGraph(table)
    points = [table.evaluate(a, h) for a, h in pareto_front(table, graph=graph)]
    hull = lower_hull(points)
    assert len(hull) > 3
    calls = []
    weighted = StageGraph.weighted_plan
    monkeypatch.setattr(StageGraph, "weighted_plan", lambda self, lam: calls.append(lam) or weighted(self, lam))
    fastest = min(t for t, _ in points)
    for deadline in np.linspace(fastest, max(t for t, _ in hull) * 1.01, 9):
        calls.clear()
        plan, lam = graph.hull_plan(deadline)
        expected = min(c for t, c in hull if t <= deadline * (1 + 1e-9))
        assert plan.cost_usd == pytest.approx(expected, rel=1e-9) and plan.jct_s <= deadline * (1 + 1e-9)
        assert len(calls) <= 12
        # The weight makes the plan optimal: nothing on the front is below its line.
        assert all(c + lam * t >= plan.cost_usd + lam * plan.jct_s - 1e-6 * plan.cost_usd for t, c in points)
    assert graph.hull_plan(fastest * 0.99) is None
