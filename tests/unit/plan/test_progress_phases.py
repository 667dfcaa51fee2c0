"""Progress stays truthful (issue #22): whatever the planner spends its time on — a stage's queues
list scheduled while the search space is laid out, the full simulations of the candidates —
the last progress event before it names that work, so a progress line never sits on a stage
that is done while the time goes elsewhere."""

from __future__ import annotations

from rubberband import ExperimentSpec
from rubberband.plan.compile import plan_on_table
from rubberband.plan.search import BOUNDS, FRONT, LAYOUT, SIMULATING, PlanProgress
from rubberband.plan.table import StageTable

from .test_search import fig12, wide_model


class Watched(StageTable):
    """A table that notes, at each costly step, the progress event last heard."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events: list[PlanProgress] = []
        self.steps: list[tuple[str, int, PlanProgress | None]] = []

    def hear(self, event: PlanProgress) -> None:
        self.events.append(event)

    def entry(self, i, allocation):
        costly = not self._optimistic and not self.simulated_cheaply(i, allocation)
        if costly:      # a queue to list schedule
            self.steps.append(("list schedule", i, self.events[-1] if self.events else None))
        return super().entry(i, allocation)

    def simulate(self, allocation, held):
        if self.simulated(allocation, held) is None:
            self.steps.append(("simulate", -1, self.events[-1] if self.events else None))
        return super().simulate(allocation, held)


def test_each_costly_step_is_named_by_the_last_progress_event():
    exp = fig12()
    table = Watched(ExperimentSpec.sha(64, 4, 512, 2), wide_model(8), exp.cloud, samples=30, seed=2)
    plan = plan_on_table(table, 1500.0, "optimal", progress=table.hear)
    assert plan is not None
    kinds = {kind for kind, _, _ in table.steps}
    assert kinds == {"list schedule", "simulate"}      # both kinds of costly work happened
    for kind, stage, event in table.steps:
        assert event is not None
        if kind == "list schedule":
            assert (event.phase, event.stage) == (LAYOUT, stage + 1), (kind, stage, event)
        else:
            assert event.phase == SIMULATING, (kind, event)
    assert {LAYOUT, BOUNDS, FRONT, SIMULATING} <= {e.phase for e in table.events}


def test_the_progress_text_names_the_work():
    assert PlanProgress(3, 10, 1204, phase=LAYOUT).describe() == "stage 3 of 10, 1,204 candidates kept (laying out options)"
    assert PlanProgress(2, 7, 0, phase=SIMULATING, scenario=1, scenarios=2).describe() == \
        "scenario 1 of 2, simulating plan 2 of at most 7 in full"
    assert PlanProgress(1, 4, 9).describe() == "stage 1 of 4, 9 candidates kept"
