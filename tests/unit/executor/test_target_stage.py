"""A surrogate job's target stage in the executor (DESIGN §4.6): the surrogate winner's config
trains as a new trial at full width, from scratch; the rehearsal draws it from the target's
profile; the re-planner prices it by the target's profile and learns nothing from it."""

from __future__ import annotations

import math

import pytest

from rubberband import ExperimentSpec, SpecError
from rubberband.executor.driver import TARGET_KEY, Driver
from rubberband.executor.rehearse import rehearse
from rubberband.executor.report import RunResult
from rubberband.executor.sim import rehearse_once
from rubberband.plan import plan_allocation
from rubberband.profiles import Constant
from rubberband.scheduler import Replanner
from rubberband.simulator import simulate
from rubberband.testing.builders import fake_cloud, model_profile
from rubberband.testing.fakes import make_fakes

LRS = [0.5, 0.1, 0.8, 0.3]
SPACE = {"lr": {"grid": LRS}, "hidden": 128}
# The surrogate is fast; the full-width target 10x slower per iteration, with its own start-up and SYNC.
SURROGATE = model_profile({1: 1.0}, startup_s=Constant(2.0), sync_s=0.5, name="w/8")
TARGET = model_profile({1: 10.0}, startup_s=Constant(7.0), sync_s=3.0, name="full")


def job() -> ExperimentSpec:
    """SHA 4 x 2 -> 1 x 3 on surrogates, then the winner for 5 iterations at full width."""
    return ExperimentSpec.from_stages([(4, 2), (1, 3)]).with_target(5)


def plan(deadline_s: float = 1e6):
    return plan_allocation(job(), [4, 1, 1], SURROGATE, fake_cloud(1), deadline_s, samples=4, target_model=TARGET)


def test_the_winner_s_config_starts_a_new_trial_from_scratch_whose_workers_are_told_it_is_the_target():
    fakes = make_fakes(1, {1: 1.0}, provision_s=10, init_s=5)
    out = Driver(plan(), fakes.cluster, fakes.runner, SPACE, "loss", "min", clock=fakes.clock).run()
    winner = f"t{LRS.index(min(LRS)):03d}"            # the fakes' loss grows with lr
    target = f"target-{winner}"
    assert set(out.trials) == {f"t{j:03d}" for j in range(4)} | {target}
    assert out.trials[target].config == out.trials[winner].config == {"lr": 0.1, "hidden": 128}
    assert out.trials[target].target and not out.trials[winner].target
    # Trained 5 iterations from step 0 (no checkpoint carried), not 2 + 3 + 5 from the winner's.
    assert out.trials[target].step == 5 and out.trials[winner].step == 5
    assert out.trials[winner].eliminated_after is None
    assert out.best == target and out.stages[-1].trials == [target]
    assert out.stages[1].promoted == [winner]
    # Its workers (a new gang or the winner's, handed over) got the marked config, checkpoint None.
    gangs = [g for g in fakes.runner.starts if g.trial == target]
    handed = [c for c in fakes.runner.called("reassign") if c[1] == target]
    assert len(gangs) + len(handed) == 1
    assert all(g.checkpoint is None and g.from_step == 0 for g in gangs)
    for trial, state in out.trials.items():
        assert TARGET_KEY not in state.config, trial


def test_only_the_target_trial_s_workers_see_the_target_key():
    fakes = make_fakes(1, {1: 1.0}, provision_s=10, init_s=5)
    seen: dict[str, list[dict]] = {}
    start, reassign = fakes.runner.start, fakes.runner.reassign

    def spy_start(trial, config, *args, **kwargs):
        seen.setdefault(trial, []).append(dict(config))
        return start(trial, config, *args, **kwargs)

    def spy_reassign(gang, trial, config, checkpoint):
        seen.setdefault(trial, []).append(dict(config))
        assert checkpoint is None or trial[:7] != "target-"
        return reassign(gang, trial, config, checkpoint)

    fakes.runner.start, fakes.runner.reassign = spy_start, spy_reassign
    Driver(plan(), fakes.cluster, fakes.runner, SPACE, "loss", "min", clock=fakes.clock).run()
    for trial, configs in seen.items():
        assert all(c.get(TARGET_KEY) is (True if trial.startswith("target-") else None) for c in configs), trial
    assert any(t.startswith("target-") for t in seen)


def test_a_rehearsal_draws_the_target_stage_from_the_target_profile():
    """Constant profiles: the target TRAIN takes the target's start-up + 5 x 10 s, its SYNC 3 s."""
    run = rehearse_once(plan(), SURROGATE, seed=0, target_model=TARGET)
    (train,) = [r for r in run.train_runs if r["stage"] == 2]
    assert train["trial"].startswith("target-") and train["iters"] == 5
    assert train["end_s"] - train["start_s"] == pytest.approx(7.0 + 5 * 10.0)
    assert run.stage_windows[2][1] - train["end_s"] == pytest.approx(3.0)
    tuning = [r for r in run.train_runs if r["stage"] < 2]
    assert all(r["iter_s"] == [1.0] * r["iters"] for r in tuning)
    # Exactly simulate's job (constants: every sample is the same run).
    assert run.jct_s == pytest.approx(simulate(job(), [4, 1, 1], SURROGATE, fake_cloud(1), samples=4,
                                               target_model=TARGET).mean_jct_s)


def test_a_rehearsal_of_a_target_stage_needs_its_profile_and_only_then():
    with pytest.raises(SpecError, match="target_model"):
        rehearse_once(plan(), SURROGATE, seed=0)
    other = plan_allocation(ExperimentSpec.from_stages([(4, 2), (1, 3)]), [4, 1], SURROGATE, fake_cloud(1), 1e6,
                            samples=4)
    with pytest.raises(SpecError, match="target_model"):
        rehearse_once(other, SURROGATE, seed=0, target_model=TARGET)


def test_the_run_result_names_the_winner_the_target_and_the_cost_of_each_part():
    p = plan()
    result = rehearse(p, SURROGATE, seed=0, metric="loss", target_model=TARGET, width_ratio=8,
                      search_space=SPACE)
    s = result.to_dict()["surrogate"]
    winner, target = s["winner"]["trial"], s["target"]["trial"]
    assert target == f"target-{winner}" and result.best["trial"] == target
    assert s["target"]["config"] == s["winner"]["config"] == result.trials[winner]["config"]
    assert s["target"]["step"] == 5 and s["target"]["iters"] == 5 and s["width_ratio"] == 8 and s["target_stage"] == 2
    assert math.isfinite(s["winner"]["metric"]) and math.isfinite(s["target"]["metric"])
    stages = result.stages
    assert s["cost"]["target"]["actual_cost_usd"] == pytest.approx(stages[2]["actual"]["cost_usd"])
    assert s["cost"]["tuning"]["predicted_cost_usd"] == pytest.approx(sum(x["predicted"]["cost_usd"] for x in stages[:2]))
    assert s["cost"]["target"]["predicted_duration_s"] == pytest.approx(p.predicted.stages[2].mean_duration_s)
    assert stages[1]["promoted"] == [winner]
    table = result.table()
    assert f"surrogate winner {winner} (width / 8)" in table and f"target trial {target} (full width" in table
    assert "tuning   predicted" in table and "target   predicted" in table
    # result.json round trip keeps it (``report RUN_DIR`` prints the same table).
    assert RunResult.from_dict(result.to_dict()).table() == table


def test_the_replanner_prices_the_target_stage_by_the_target_profile():
    """At the SYNC of stage 0, the remaining stages (1 and the target) are simulated with the
    target's profile: a deadline the surrogate's pace would meet but the target's cannot makes
    the current plan miss (before: ``simulate`` refused a target stage without its profile)."""
    p = plan(deadline_s=120.0)
    r = Replanner(p, SURROGATE, samples=4, target_model=TARGET)
    found = r.replan(0, 60.0, list(p.allocation), list(p.instances), list(p.spot_counts))
    # 60 s left: stage 1 (~2 + 3 + 0.5) and the target (7 + 50 + 3) do not fit; nothing is faster.
    assert found is None
    remaining = ExperimentSpec(job().stages[1:])
    old = simulate(remaining, [1, 1], SURROGATE, fake_cloud(1), samples=4, target_model=TARGET)
    assert old.mean_jct_s > 60.0
    fakes = make_fakes(1, {1: 1.0})
    with pytest.raises(SpecError, match="target_model"):
        Driver(p, fakes.cluster, fakes.runner, SPACE, "loss", clock=fakes.clock, replan_with=SURROGATE)


def test_a_target_train_is_not_observed_as_the_surrogate_s_pace(monkeypatch):
    seen = []
    observe = Replanner.observe

    def spy(self, gpus, iters, *args, **kwargs):
        seen.append(iters)
        return observe(self, gpus, iters, *args, **kwargs)

    monkeypatch.setattr(Replanner, "observe", spy)
    fakes = make_fakes(1, {1: 1.0}, provision_s=10, init_s=5)
    driver = Driver(plan(deadline_s=1e5), fakes.cluster, fakes.runner, SPACE, "loss", "min", clock=fakes.clock,
                    replan_with=SURROGATE, target_model=TARGET)
    out = driver.run()
    assert driver.sched._replanner is not None and driver.sched._replanner.target_model is TARGET
    assert sum(len(t.history) for t in out.trials.values()) == 4 + 1 + 1
    assert sorted(seen) == [2, 2, 2, 2, 3]        # the tuning's TRAINs; the target's is another model's


def test_execute_refuses_a_target_stage_without_the_surrogate_s_trainer_before_anything_starts(tmp_path, monkeypatch):
    import rubberband.providers.local as local
    from rubberband.executor.run import execute

    monkeypatch.setattr(local, "STATE_ROOT", tmp_path / "state")
    monkeypatch.setattr("rubberband.providers.local.LocalCluster.start", lambda *a, **k: pytest.fail("started"))
    trainer = "rubberband.examples.digits:DigitsMLP"
    with pytest.raises(SpecError, match="surrogate.width_ratio: a plan that ends in a target stage"):
        execute(plan(), trainer, SPACE, provider="local", runs_dir=tmp_path / "runs")
    with pytest.raises(SpecError, match=r"^trainer: .*SurrogateJob\(trainer, 8\)"):
        execute(plan(), trainer, SPACE, provider="local", runs_dir=tmp_path / "runs", surrogate_ratio=8)
    # A bare surrogate_trainer / target_trainer has the ratio too, but would build the target
    # narrow (or the surrogates wide): only SurrogateJob serves both.
    from rubberband.examples.digits import DigitsMLP
    from rubberband.surrogate import surrogate_trainer, target_trainer

    for bare in (surrogate_trainer(DigitsMLP(), 8), target_trainer(DigitsMLP(), 8)):
        with pytest.raises(SpecError, match=r"^trainer: .*SurrogateJob\(trainer, 8\)"):
            execute(plan(), bare, SPACE, provider="local", runs_dir=tmp_path / "runs", surrogate_ratio=8)
    with pytest.raises(SpecError, match="has no target stage"):
        execute(plan_allocation(ExperimentSpec.from_stages([(4, 2)]), [4], SURROGATE, fake_cloud(1), 1e6, samples=2),
                trainer, SPACE, provider="local", runs_dir=tmp_path / "runs", surrogate_ratio=8)
    assert not (tmp_path / "runs").exists()


def test_hyperband_s_target_trains_the_best_config_of_every_bracket_not_the_last_bracket_s():
    spec = ExperimentSpec.chain(ExperimentSpec.hyperband(1, 4, 2)).with_target(3)
    p = plan_allocation(spec, [s.num_trials for s in spec.stages], SURROGATE, fake_cloud(1), 1e6, samples=2,
                        target_model=TARGET)
    fakes = make_fakes(1, {1: 1.0})
    out = Driver(p, fakes.cluster, fakes.runner, {"lr": {"uniform": [0.0, 1.0]}}, "loss", "min",
                 clock=fakes.clock).run()
    longest = max(t.step for t in out.trials.values() if not t.target)
    finalists = {t.id: t.metric for t in out.trials.values() if not t.target and t.step == longest}
    best = min(finalists, key=finalists.__getitem__)
    assert len({f.split("-")[0] for f in finalists}) > 1      # the brackets' winners compete
    assert not best.startswith(f"b{len(spec.bracket_starts) - 1}-")      # seed 0: an earlier bracket's wins
    assert out.best == f"target-{best}" and out.stages[-2].promoted == [best]
    assert out.trials[f"target-{best}"].config == out.trials[best].config


def test_a_run_stopped_before_its_target_still_shows_what_the_target_was_planned_to_cost():
    from rubberband.executor.report import surrogate_summary

    p = plan()
    ran = [{"index": i, "predicted": {"cost_usd": 0.0, "duration_s": 0.0}, "actual": {"cost_usd": 0.5, "duration_s": 9.0}}
           for i in (0, 1)]
    out = surrogate_summary(p, {}, ran, "loss", width_ratio=8)
    assert out["target"] is None
    target, tuning = out["cost"]["target"], out["cost"]["tuning"]
    assert target["predicted_cost_usd"] == p.predicted.stages[2].mean_cost_usd > 0
    assert target["predicted_duration_s"] == p.predicted.stages[2].mean_duration_s > 0
    assert target["actual_cost_usd"] == target["actual_duration_s"] == 0
    assert tuning["predicted_cost_usd"] == pytest.approx(sum(s.mean_cost_usd for s in p.predicted.stages[:2]))
    assert tuning["actual_cost_usd"] == 1.0 and tuning["actual_duration_s"] == 18.0
