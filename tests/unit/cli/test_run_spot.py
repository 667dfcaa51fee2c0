"""`rubberband run` plans with the planning flags of `plan` (--market, --confidence,
--instance-type) and checks --spot-emulation before anything starts."""

from __future__ import annotations

import pytest

from rubberband.errors import SpecError

from .helpers import ROOT, assert_one_line_error, run

DEMO = str(ROOT / "experiments" / "demo.yaml")


def local_spot_experiment(tmp_path, market="spot") -> str:
    """The demo job on local.2gpu with a spot price and a preemption model."""
    path = tmp_path / "spot-demo.yaml"
    path.write_text(f"""
name: demo-spot
sha: {{num_trials: 4, min_iters: 2, max_iters: 8, eta: 2}}
model_profile: {ROOT / 'profiles' / 'demo_digits_local.yaml'}
cloud:
  profile: {ROOT / 'cloud_profiles' / 'local' / 'local.yaml'}
  instance_type: local.2gpu
  market: {market}
  overrides: {{spot_price_usd_per_hour: 0.6, spot: {{notice_s: 20, preemption: {{rate_per_hour: 2}}}}}}
deadline: 10m
samples: 20
trainer: rubberband.examples.digits:DigitsMLP
search_space: {{lr: [0.01, 0.1]}}
""")
    return str(path)


@pytest.fixture
def executed(monkeypatch):
    """Stop `run` where it would start the cluster, keeping what it was about to run."""
    seen = []

    def execute(plan, *args, **kwargs):
        seen.append((plan, kwargs))
        raise SpecError("stopped before execution")

    monkeypatch.setattr("rubberband.executor.run.execute", execute)
    return seen


def test_run_plans_with_the_market_confidence_and_instance_type_given(tmp_path, capsys, executed):
    exp = local_spot_experiment(tmp_path, market="on-demand")
    code, _, _ = run(capsys, "run", exp, "--market", "spot", "--confidence", "0.9", "--instance-type", "local.4gpu",
                     "--spot-emulation", "rate=30/h,notice=5s")
    assert code != 0
    ((plan, kwargs),) = executed
    assert plan.instance_type == "local.4gpu" and plan.confidence == 0.9
    assert plan.spot_counts == plan.instances                       # planned on spot, as asked
    assert kwargs["spot_emulation"] == "rate=30/h,notice=5s"


def test_without_the_flag_run_runs_no_emulation(tmp_path, capsys, executed):
    run(capsys, "run", local_spot_experiment(tmp_path))
    ((plan, kwargs),) = executed
    assert kwargs["spot_emulation"] is None and all(plan.spot_counts)


@pytest.mark.parametrize(("argv", "needles"), [
    (["--spot-emulation"], ["--spot-emulation: the plan holds no spot instances", "--market spot or auto"]),
    (["--market", "spot", "--spot-emulation", "rat=2/h"], ["--spot-emulation: unknown key 'rat' (did you mean `rate`?)"]),
    (["--market", "spot", "--spot-emulation", "notice"], ["--spot-emulation: expected key=value pairs, got 'notice'"]),
    (["--market", "spot", "--allocation", "4,2,2"], ["--market: only used when run plans the job", "--allocation"]),
])
def test_bad_spot_input_to_run_is_one_line_before_anything_starts(tmp_path, capsys, monkeypatch, argv, needles):
    import rubberband.providers.local as local

    def no_cluster(*args, **kwargs):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(local.LocalCluster, "start", no_cluster)
    exp = local_spot_experiment(tmp_path, market="on-demand")
    code, _, err = run(capsys, "run", exp, *argv)
    assert code != 0
    assert_one_line_error(err, *needles)


def test_spot_emulation_is_for_the_local_provider_only(tmp_path, capsys, monkeypatch):
    from rubberband.executor.run import execute

    monkeypatch.setattr("rubberband.providers.aws_cluster.start", lambda *a, **k: pytest.fail("started"))
    import rubberband as rb
    from rubberband.plan import plan_allocation

    cloud = rb.CloudProfile.load(ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml", "g5.xlarge", market="spot")
    model = rb.ModelProfile.load(ROOT / "profiles" / "demo_digits_local.yaml")
    plan = plan_allocation(rb.ExperimentSpec.from_stages([(2, 1)]), (2,), model.replace(iter_latency_s={1: model.iter_latency_s[1]}),
                           cloud, deadline_s=600, samples=5)
    with pytest.raises(SpecError, match=r"^--spot-emulation: only the local provider emulates reclaims \(the aws "
                                        r"provider's spot instances are reclaimed by the cloud, or by its own model\); "
                                        r"drop the flag"):
        execute(plan, "x:Y", {}, provider="aws", spot_emulation="rate=1/h", runs_dir=tmp_path)


def test_spot_emulation_with_a_rehearsal_is_one_line_not_ignored(tmp_path, capsys):
    code, _, err = run(capsys, "run", local_spot_experiment(tmp_path), "--provider", "sim", "--spot-emulation")
    assert code != 0
    assert_one_line_error(err, "--spot-emulation: only the local provider emulates reclaims (the sim provider")
