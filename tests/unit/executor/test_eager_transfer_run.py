"""Eager transfer in the executor (DESIGN §4.6): the leader's config starts at full width on
instances of its own at the hand-over, trains while the tuning goes on, and is kept or restarted
with the winner's config at the tuning's end; rehearsals agree with the model branch by branch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rubberband import ExperimentSpec, SpecError
from rubberband.executor.driver import Driver
from rubberband.executor.rehearse import rehearse
from rubberband.executor.sim import rehearse_once
from rubberband.plan import plan_allocation
from rubberband.profiles import Constant
from rubberband.scheduler import Scheduler
from rubberband.simulator import simulate
from rubberband.spec.experiment import EagerTransfer
from rubberband.testing.builders import fake_cloud, model_profile
from rubberband.testing.fakes import FakeRunner, default_metrics, make_fakes

LRS = [0.5, 0.1, 0.8, 0.3]
SPACE = {"lr": {"grid": LRS}, "hidden": 128}
SURROGATE = model_profile({1: 1.0}, startup_s=Constant(2.0), sync_s=0.5, name="w/8")
TARGET = model_profile({1: 10.0}, startup_s=Constant(7.0), sync_s=3.0, name="full")


def job(p: float = 0.5) -> ExperimentSpec:
    """SHA 4x2 -> 2x10 -> 1x10 on surrogates; the target (5 iterations) handed over at the first SYNC."""
    return ExperimentSpec.from_stages([(4, 2), (2, 10), (1, 10)]).with_target(5, EagerTransfer(0, p))


def plan(spec: ExperimentSpec | None = None):
    return plan_allocation(spec or job(), [4, 2, 1, 1], SURROGATE, fake_cloud(1), 1e6, samples=4,
                           target_model=TARGET)


def turning(config, step: int) -> dict[str, float]:
    """Ranks by ``lr`` up to step 2 (the hand-over), then the other way round: the leader loses."""
    loss = float(config["lr"]) if step <= 2 else 1.0 - float(config["lr"])
    return {"loss": loss}


def run(metrics=default_metrics, spec: ExperimentSpec | None = None, provision_s: float = 10,
        lose: tuple[str, float] | None = None):
    """The job on the fakes; ``lose``: the instance to lose and when (seconds into the run)."""
    fakes = make_fakes(1, {1: 1.0}, provision_s=provision_s, init_s=5)
    fakes.runner = FakeRunner(fakes.clock, {1: 1.0}, 1, metrics=metrics, cluster=fakes.cluster,
                              calls=fakes.cluster.calls)
    if lose is not None:
        name, at = lose
        fakes.clock.call_at(fakes.clock.now() + at, lambda: fakes.cluster.lose(name))
    return Driver(plan(spec), fakes.cluster, fakes.runner, SPACE, "loss", "min", clock=fakes.clock).run()


def times(out, event: str, key: str) -> dict:
    return {e[key]: e["t"] for e in out.timeline if e["event"] == event}


def test_the_leader_starts_at_the_hand_over_on_its_own_instance_and_is_kept_when_it_wins():
    out = run()
    leader = f"t{LRS.index(0.1):03d}"                  # the fakes' loss grows with lr: 0.1 leads and wins
    target = f"target-{leader}"
    assert set(out.trials) == {f"t{j:03d}" for j in range(4)} | {target}
    assert out.best == target and out.trials[target].step == 5
    starts = {e["trial"]: e["t"] for e in out.timeline if e["event"] == "start"}
    syncs = {e["index"]: e["t"] for e in out.timeline if e["event"] == "sync"}
    # It starts after the first SYNC and before the tuning's end, 10 s SCALE + 5 s INIT later.
    assert starts[target] == pytest.approx(syncs[0] + 15.0) and starts[target] < syncs[2]
    owned = [e for e in out.timeline if e["event"] == "owned"]
    assert len(owned) == 1 and owned[0]["stage"] == 3
    tuning_instances = {i for t in out.trials.values() if not t.target for h in t.history for i in h["instances"]}
    assert owned[0]["instance"] not in tuning_instances
    assert out.trials[target].history[-1]["instances"] == [owned[0]["instance"]]
    assert out.stages[-1].trials == [target]


def test_a_leader_that_loses_is_superseded_by_the_winner_on_the_same_instance():
    out = run(turning)
    leader, winner = f"t{LRS.index(0.1):03d}", f"t{LRS.index(0.3):03d}"
    assert set(out.trials) == {f"t{j:03d}" for j in range(4)} | {f"target-{leader}", f"target-{winner}"}
    assert out.best == f"target-{winner}"
    assert out.trials[f"target-{leader}"].eliminated_after == 2          # superseded at the tuning's end
    assert out.trials[f"target-{winner}"].config == out.trials[winner].config
    assert out.trials[f"target-{winner}"].step == 5
    # The winner's config trained from scratch on the instance the leader's had.
    assert out.trials[f"target-{winner}"].history[-1]["instances"] == \
        [e["instance"] for e in out.timeline if e["event"] == "owned"]
    starts = {e["trial"]: e["t"] for e in out.timeline if e["event"] == "start"}
    syncs = {e["index"]: e["t"] for e in out.timeline if e["event"] == "sync"}
    assert starts[f"target-{winner}"] == pytest.approx(syncs[2])


def test_a_lost_target_instance_is_replaced_for_the_target_and_the_tuning_does_not_wait():
    base = run()
    (owned,) = [e for e in base.timeline if e["event"] == "owned"]
    target = "target-t001"
    began = times(base, "start", "trial")[target]
    out = run(lose=(owned["instance"], began + 2.5))     # two of its five iterations checkpointed
    assert times(out, "sync", "index") == pytest.approx(times(base, "sync", "index") | {
        3: times(out, "sync", "index")[3]})                                   # the tuning's SYNCs as before
    again = [e for e in out.timeline if e["event"] == "owned"]
    assert [e["stage"] for e in again] == [3, 3] and again[1]["instance"] != owned["instance"]
    # It resumed from its checkpoint on the replacement and trained its five iterations, no more.
    assert out.best == target and out.trials[target].step == 5
    assert out.trials[target].history[-1]["instances"] == [again[1]["instance"]]


def test_a_target_whose_instance_is_up_after_the_tuning_is_kept_or_superseded_there():
    kept = run(provision_s=30)           # its instance is up at 17 + 35, after the tuning's end (37)
    syncs = times(kept, "sync", "index")
    assert kept.best == "target-t001" and kept.trials["target-t001"].step == 5
    assert times(kept, "start", "trial")["target-t001"] > syncs[2]
    turned = run(turning, provision_s=30)
    assert turned.best == "target-t003" and turned.trials["target-t003"].step == 5
    # The leader's target never trained: the driver never saw it, the scheduler superseded it.
    assert "target-t001" not in turned.trials
    assert turned.report.trials["target-t001"].eliminated_after == 2


def test_the_run_report_says_which_target_was_handed_over_and_whether_it_restarted():
    from rubberband.executor.report import surrogate_summary

    p = plan()
    stages = [{"index": i, "actual": {"cost_usd": 0.0, "duration_s": 0.0}} for i in range(4)]
    config = {"lr": 0.1}
    common = {"config": config, "metric": 0.5, "step": 5, "history": []}
    kept = {"t001": {**common, "eliminated_after": None}, "target-t001": {**common, "eliminated_after": 3}}
    restarted = {**kept, "t003": {**common, "eliminated_after": None},
                 "target-t003": {**common, "eliminated_after": 3}, "target-t001": {**common, "eliminated_after": 2}}
    for trials, handed, target, again in ((kept, "target-t001", "target-t001", False),
                                          (restarted, "target-t001", "target-t003", True)):
        s = surrogate_summary(p, trials, stages, "loss")
        assert s["eager_transfer"]["handed_over"] == handed and s["eager_transfer"]["restarted"] is again
        assert s["target"]["trial"] == target


def test_a_spot_plan_is_refused_before_anything_starts():
    cloud = fake_cloud(1, spot_price_usd_per_hour=1.0)
    spot = replace(plan(), cloud=cloud, type_clouds={cloud.instance_type: cloud}, spot_instances=(1, 0, 0, 0))
    with pytest.raises(SpecError, match=r"eager_transfer: a job whose target starts early runs on on-demand"):
        Scheduler(spot)


# --- rehearsals against the model, branch by branch ----------------------------------------------------
def test_each_rehearsal_ends_and_costs_as_the_model_branch_it_took():
    spec = job()
    p = plan(spec)
    kept = simulate(job(0.0), p.allocation, SURROGATE, fake_cloud(1), samples=2, target_model=TARGET,
                    instances=p.instances)
    again = simulate(job(1.0), p.allocation, SURROGATE, fake_cloud(1), samples=2, target_model=TARGET,
                     instances=p.instances)
    assert again.jct_s[0] > kept.jct_s[0]
    seen = set()
    for seed in range(12):
        sim = rehearse_once(p, SURROGATE, seed=seed, target_model=TARGET)
        restarted = sum(1 for t in sim.report.trials if t.startswith("target-")) > 1
        branch = again if restarted else kept
        assert sim.jct_s == pytest.approx(branch.jct_s[0]), (seed, restarted)
        seen.add(restarted)
    assert seen == {True, False}


def test_a_rehearsal_reports_the_target_s_cost_in_its_own_stage():
    p = plan()
    result = rehearse(p, SURROGATE, seed=0, target_model=TARGET)
    model = simulate(job(0.0), p.allocation, SURROGATE, fake_cloud(1), samples=2, target_model=TARGET,
                     instances=p.instances)
    restarted = result.surrogate["eager_transfer"]["restarted"]
    if not restarted:
        for got, want in zip(result.stages, model.stages):
            assert got["actual"]["cost_usd"] == pytest.approx(want.mean_cost_usd, abs=1e-9), got["index"]
    assert result.surrogate["eager_transfer"]["after_stage"] == 0
