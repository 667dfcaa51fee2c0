"""The driver on a fused stage (DESIGN §4.5) against the fakes: its trials start as members of
fused groups, ``F`` to a GPU, on only as many GPUs as it has groups; the instances warm one
worker per GPU; the times are the model's (one ``L_F`` per iteration of a group)."""

from __future__ import annotations

from rubberband import ExperimentSpec
from rubberband.executor.driver import Driver
from rubberband.plan import plan_allocation
from rubberband.testing.builders import fake_cloud, model_profile
from rubberband.testing.fakes import make_fakes

ITER_S = {1: 4.0}
FUSED_S = {4: 6.0}        # one iteration of a group of 4: 2.7x the throughput of one trial alone
GRID = {"lr": {"grid": [0.5, 0.1, 0.8, 0.3, 0.7, 0.2, 0.6, 0.4]}}


def test_a_fused_stage_starts_its_trials_four_to_a_gpu_and_takes_the_models_time():
    model = model_profile(ITER_S, name="fake", fused_iter_latency_s=FUSED_S)
    exp = ExperimentSpec.from_stages([(8, 3), (2, 4)])
    # Stage 0: 8 trials in 2 groups of 4 on 2 of the 4 GPUs given; stage 1 unfused on 2 GPUs.
    plan = plan_allocation(exp, (2, 2), model, fake_cloud(2), deadline_s=1e6, samples=2, fused_per_gpu=(4, 1))
    fakes = make_fakes(2, ITER_S, provision_s=10, init_s=5, fused_iter_s=FUSED_S)
    peak: dict = {}

    def watch(kind, data):
        for where, trials in fakes.runner.packed_on().items():
            peak[where] = max(peak.get(where, 0), len(trials))

    outcome = Driver(plan, fakes.cluster, fakes.runner, GRID, "loss", clock=fakes.clock, on_event=watch).run()
    first = [s for s in fakes.runner.starts if s.fused]
    assert len(first) == 8 and {s.share for s in first} == {4} and {(s.instances, s.gpus) for s in first} == {(("rb-instance-1",), (0,)),
                                                                         (("rb-instance-1",), (1,))}
    assert sorted(peak.values()) == [4, 4]
    # The stage's instances warm one worker per GPU: a group's worker holds its GPU whole.
    assert [c[1] for c in fakes.runner.called("warm")][0] == 1
    assert sorted(t.step for t in outcome.trials.values()) == [3] * 6 + [7] * 2
    # Stage 0 takes 15 s to scale, then 3 iterations of L_4 = 6 s: the model's time.
    assert plan.predicted.stages[0].mean_duration_s == outcome.stages[0].end_s - outcome.stages[0].start_s == 15 + 18
    assert outcome.ended_at - outcome.started_at == plan.predicted.jct_s[0]
