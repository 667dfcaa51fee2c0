"""The run's progress lines, including what the provider reports while the driver waits."""

import io

import pytest

from rubberband import CloudProfile, ExperimentSpec, ModelProfile
from rubberband.executor.run import live_spend, progress_printer
from rubberband.plan import plan_allocation


def test_provider_events_are_printed_as_they_happen():
    out = io.StringIO()
    show = progress_printer(out)
    show("provider", {"event": "launch_error", "instance_type": "g5.xlarge", "region": "us-east-1", "attempt": 1,
                      "code": "InsufficientInstanceCapacity", "retry_in_s": 2.0})
    show("provider", {"event": "launch_error", "instance_type": "g5.xlarge", "region": "us-east-1", "attempt": 6,
                      "code": "InsufficientInstanceCapacity", "retry_in_s": None})
    show("provider", {"event": "terminated", "reason": "interrupted", "instance": "rb-instance-2", "ec2_id": "i-abc"})
    lines = out.getvalue().splitlines()
    assert "g5.xlarge in us-east-1 failed (attempt 1): InsufficientInstanceCapacity; retrying in 2.0s" in lines[0]
    assert lines[1].endswith("giving up")
    assert "rb-instance-2 i-abc was interrupted (spot reclaim); a replacement is on its way" in lines[2]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_status_line_counts_the_instance_a_stage_runs_on():
    cloud = CloudProfile.from_dict({"instance_type": "fake.gpu", "gpus_per_instance": 2, "price_usd_per_hour": 3.6,
                                    "billing": {"model": "per_instance", "granularity_s": 1, "minimum_s": 0},
                                    "provision_latency_s": 2, "init_latency_s": 1})
    plan = plan_allocation(ExperimentSpec.from_stages([(2, 1)]), (2,),
                           ModelProfile.from_dict({"iter_latency_s": {1: 1.0}}), cloud, 1e6, samples=1)
    t0 = 1000.0
    events = [{"event": "request", "instance": "rb-instance-1", "t": t0},
              {"event": "running", "instance": "rb-instance-1", "t": t0 + 2},
              {"event": "ready", "instance": "rb-instance-1", "t": t0 + 3},
              {"event": "request", "instance": "rb-instance-2", "t": t0 + 4}]       # not launched yet
    live = live_spend(plan, events, t0, now=t0 + 10)
    assert live == {"instances_up": 1, "spend_usd": pytest.approx(8 * 0.001)}      # billed since running
    out = Terminal()
    progress_printer(out)("stage", {"index": 0, "trials": 2, "iters": 1, "gpus_per_trial": 1, "instances": 1, **live})
    assert "| instances 1 |" in out.getvalue()
    gone = events + [{"event": "terminated", "instance": "rb-instance-1", "reason": "released", "t": t0 + 12}]
    assert live_spend(plan, gone, t0, now=t0 + 20)["instances_up"] == 0


def test_the_status_line_shows_the_budget_left_and_the_loop_prints_its_lines():
    out = Terminal()
    show = progress_printer(out)
    show("stage", {"index": 1, "trials": 2, "iters": 1, "gpus_per_trial": 1, "instances": 1, "budget_left_usd": 0.4})
    assert "| budget left $0.4000 |" in out.getvalue()
    show("replan", {"line": "sync 0: 2.10x slower than profiled; stage 1 re-planned 2→4 GPUs"})
    show("stopped", {"reason": "budget: $0.4000 left of $1.00 cannot pay ...", "best": "t001"})
    text = out.getvalue()
    assert "sync 0: 2.10x slower than profiled; stage 1 re-planned 2→4 GPUs\n" in text
    assert "stopped: budget: $0.4000 left of $1.00 cannot pay ... (best so far: t001)\n" in text
    assert text.rstrip().endswith("s") and "| budget left $0.4000 |" in text.splitlines()[-1]


def test_a_re_planning_run_gets_a_cluster_with_room_to_grow_within_its_max_workers():

    from rubberband.executor.run import REPLAN_GROWTH, _cluster_room

    cloud = CloudProfile.from_dict({"instance_type": "fake.gpu", "gpus_per_instance": 2, "price_usd_per_hour": 3.6,
                                    "provision_latency_s": 2, "init_latency_s": 1})
    plan = plan_allocation(ExperimentSpec.from_stages([(4, 1), (2, 1)]), (4, 2),
                           ModelProfile.from_dict({"iter_latency_s": {1: 1.0}}), cloud, 1e6, samples=1)
    assert max(plan.instances) == 2
    assert _cluster_room(plan, {}, replans=False) == {"fake.gpu": 2}
    assert _cluster_room(plan, {"fake.gpu": None}, replans=True) == {"fake.gpu": 2 * REPLAN_GROWTH}
    assert _cluster_room(plan, {"fake.gpu": 3}, replans=True) == {"fake.gpu": 3}
    assert _cluster_room(plan, {"fake.gpu": 1}, replans=True) == {"fake.gpu": 2}   # the plan's own need stands


def test_a_two_type_plan_gets_room_per_type_within_each_worker_types_max_workers():
    import dataclasses

    from rubberband.executor.run import REPLAN_GROWTH, _cluster_room, plan_clouds
    from rubberband.plan.plan import check_plan
    from rubberband.profiles.cloud import CloudCatalog

    catalog = CloudCatalog.load("cloud_profiles/local/local.yaml")
    one, two = catalog.get("local.1gpu"), catalog.get("local.2gpu")
    spec = ExperimentSpec.from_stages([(4, 1), (2, 1), (1, 1)])
    model = ModelProfile.from_dict({"iter_latency_s": {1: 1.0, 2: 0.6}})
    plan = plan_allocation(spec, (4, 2, 2), model, one, 1e6, samples=1)
    plan = check_plan(dataclasses.replace(plan, instances=(4, 2, 1), instance_types=("local.1gpu", "local.1gpu", "local.2gpu"),
                                          type_clouds={"local.1gpu": one, "local.2gpu": two}), spec, model, catalog, samples=1)
    assert [c.instance_type for c in plan_clouds(plan)] == ["local.1gpu", "local.2gpu"]
    assert _cluster_room(plan, {}, replans=False) == {"local.1gpu": 4, "local.2gpu": 1}
    assert _cluster_room(plan, {}, replans=True) == {"local.1gpu": 4 * REPLAN_GROWTH, "local.2gpu": REPLAN_GROWTH}
    assert _cluster_room(plan, {"local.1gpu": 5, "local.2gpu": 1}, replans=True) == {"local.1gpu": 5, "local.2gpu": 1}


def test_a_packed_train_billed_per_function_costs_its_share_of_the_gpu_as_the_model_says():
    """docs/model.md: per-function billing charges a packed TRAIN ``duration * price / (k * G)``;
    the real run's ledger billed it a whole GPU (k times the model and the sim backend)."""
    import dataclasses
    import tempfile

    from rubberband.executor.driver import Driver
    from rubberband.executor.run import _report
    from rubberband.testing.fakes import make_fakes

    iter_s = {1: 4.0, 2: 2.5}
    cloud = CloudProfile.from_dict({"instance_type": "fake.gpu", "gpus_per_instance": 2, "price_usd_per_hour": 3.6,
                                    "billing": {"model": "per_function", "granularity_s": 1, "minimum_s": 0},
                                    "provision_latency_s": 10, "init_latency_s": 5})
    model = ModelProfile.from_dict({"name": "fake", "iter_latency_s": dict(iter_s), "packed_iter_latency_s": {2: 6.0}})
    spec = ExperimentSpec.from_stages([(4, 2), (1, 2)])
    plan = dataclasses.replace(plan_allocation(spec, (2, 1), model, cloud, deadline_s=1e6, samples=2),
                               trials_per_gpu=(2, 1))
    fakes = make_fakes(2, iter_s, provision_s=10, init_s=5, packed_iter_s={2: 6.0})
    out = Driver(plan, fakes.cluster, fakes.runner, {"lr": {"grid": [0.5, 0.1, 0.8, 0.3]}}, "loss",
                 clock=fakes.clock).run()
    res = _report(plan, out, fakes.cluster.events(), fakes.clock(), "r", tempfile.mkdtemp(), "loss", "min")
    packed = [r for r in out.train_runs if r["stage"] == 0]
    assert len(packed) == 4 and all(r["trials_per_gpu"] == 2 for r in packed)
    expected = sum(r["end_s"] - r["start_s"] for r in packed) * 3.6 / 3600 / (2 * 2)
    assert res.stages[0]["actual"]["cost_usd"] == pytest.approx(expected)


def test_a_spot_plan_s_room_for_replacements_is_checked_before_anything_is_written(tmp_path, monkeypatch):
    """Each spot instance needs room for its replacement (launched while it is still up): a
    cluster YAML whose max_workers holds the plan's instances but not the replacements is refused
    before the run directory exists (it was refused only when the cluster started)."""
    import rubberband.providers.local as local
    from rubberband.errors import SpecError
    from rubberband.executor.run import execute
    from tests.conftest import write_cluster_yaml

    monkeypatch.setattr(local, "STATE_ROOT", tmp_path / "state")
    monkeypatch.setattr("rubberband.providers.local.LocalCluster.start", lambda *a, **k: pytest.fail("started"))
    cloud = CloudProfile.load("cloud_profiles/aws/us-east-1.yaml", "g5.xlarge", market="spot")
    plan = plan_allocation(ExperimentSpec.from_stages([(2, 2), (1, 2)]), (2, 1),
                           ModelProfile.from_dict({"iter_latency_s": {1: 1.0}}), cloud, deadline_s=3600, samples=2)
    assert plan.spot_counts == (2, 1) and max(plan.instances) == 2
    path = write_cluster_yaml(tmp_path / "c.yaml", max_workers=2, spot=True, credentials=True)
    with pytest.raises(SpecError, match="max_workers"):
        execute(plan, "rubberband.examples.digits:DigitsMLP", {}, provider="aws", cluster_config=str(path),
                runs_dir=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


class _Seen(Exception):
    """Raised by ``_stop_at_the_driver``'s driver with the room its re-planner was given."""


def _stop_at_the_driver(monkeypatch) -> list:
    """``execute`` up to the driver: the cluster session is a stand-in that records the room it
    was given (the list returned), and the driver raises ``_Seen(its max_instances)``."""
    import contextlib
    from types import SimpleNamespace

    import rubberband.executor.run as run

    class Driver(run.Driver):
        def run(self):
            raise _Seen(self.max_instances)

    rooms: list = []

    @contextlib.contextmanager
    def session(prov, clouds, room, run_dir, **kw):
        rooms.append(room)
        yield SimpleNamespace(provider=prov, port=None, runner=None, config=kw["config"], read_events=lambda: [],
                              stopped_at=None)

    monkeypatch.setattr(run, "Driver", Driver)
    monkeypatch.setattr(run, "cluster_session", session)
    return rooms


def test_a_re_planning_run_re_plans_within_the_room_its_cluster_was_given(tmp_path, monkeypatch):
    """``execute`` hands the driver's re-planner the room ``_cluster_room`` gave the cluster
    (the YAML's max_workers caps it): a re-plan above it would wait for instances that never
    come."""
    import rubberband.executor.run as run
    from tests.conftest import write_cluster_yaml

    rooms = _stop_at_the_driver(monkeypatch)
    cloud = CloudProfile.load("cloud_profiles/aws/us-east-1.yaml", "g5.xlarge")
    model = ModelProfile.from_dict({"iter_latency_s": {1: 1.0}})
    plan = plan_allocation(ExperimentSpec.from_stages([(4, 1), (2, 1)]), (2, 2), model, cloud, 3600, samples=2)
    assert max(plan.instances) == 2
    path = write_cluster_yaml(tmp_path / "c.yaml", max_workers=3, credentials=True)
    with pytest.raises(_Seen) as seen:
        run.execute(plan, "rubberband.examples.digits:DigitsMLP", {}, provider="aws", cluster_config=str(path),
                    runs_dir=tmp_path / "runs", replan_with=model)
    assert rooms == [{"g5.xlarge": 3}]
    assert seen.value.args[0] == {"g5.xlarge": 3}


def test_a_plan_made_within_max_instances_re_plans_within_it(tmp_path, monkeypatch):
    """The ``max_instances`` a plan was made within (``plan.info``) caps the room its run's
    re-planner has, below the cluster's: a re-plan that grows past a quota could never run."""
    import rubberband.executor.run as run
    from rubberband.executor.run import REPLAN_GROWTH
    from rubberband.plan import compile_plan

    rooms = _stop_at_the_driver(monkeypatch)
    cloud = CloudProfile.load("cloud_profiles/local/local.yaml", "local.1gpu")
    model = ModelProfile.from_dict({"iter_latency_s": {1: 10.0}})
    spec = ExperimentSpec.from_stages([(4, 2), (2, 2)])
    plan = compile_plan(spec, model, cloud, 3600, samples=2, max_instances=3)
    assert plan.info["max_instances"] == 3 and max(plan.instances) == 1
    with pytest.raises(_Seen) as seen:
        run.execute(plan, "rubberband.examples.digits:DigitsMLP", {}, provider="local", runs_dir=tmp_path / "runs",
                    replan_with=model)
    assert rooms == [{"local.1gpu": REPLAN_GROWTH}] and REPLAN_GROWTH < 3     # the cluster's room, as before
    assert seen.value.args[0] == {"local.1gpu": REPLAN_GROWTH}
    tight = compile_plan(spec, model, cloud, 3600, samples=2, max_instances=1)
    with pytest.raises(_Seen) as seen:
        run.execute(tight, "rubberband.examples.digits:DigitsMLP", {}, provider="local", runs_dir=tmp_path / "runs",
                    replan_with=model)
    assert rooms[-1] == {"local.1gpu": 1} and seen.value.args[0] == {"local.1gpu": 1}


def test_a_rehearsal_re_plans_within_the_plan_s_max_instances(monkeypatch):
    import rubberband.executor.sim as sim
    from rubberband.plan import compile_plan

    seen = []

    class Driver(sim.Driver):
        def run(self):
            seen.append(self.max_instances)
            raise RuntimeError("seen")

    monkeypatch.setattr(sim, "Driver", Driver)
    cloud = CloudProfile.load("cloud_profiles/local/local.yaml", "local.1gpu")
    model = ModelProfile.from_dict({"iter_latency_s": {1: 10.0}})
    plan = compile_plan(ExperimentSpec.from_stages([(4, 2), (2, 2)]), model, cloud, 3600, samples=2, max_instances=2)
    with pytest.raises(RuntimeError, match="seen"):
        sim.rehearse_once(plan, model, replan_with=model)
    assert seen == [2]
