"""DDPWorker's fused mode, without Ray: assign_group, train, checkpoint_group, leave."""

from __future__ import annotations

import pytest

from rubberband.errors import SpecError
from tests.unit.fusion.toys import Toy, ToyConfigData

torch = pytest.importorskip("torch")

from rubberband.executor.worker import DDPWorker  # noqa: E402


@pytest.fixture(autouse=True)
def _worker_process_settings_back():
    threads = torch.get_num_threads()
    yield
    torch.set_flush_denormal(False)
    torch.set_num_threads(threads)


def test_a_group_trains_reports_per_member_checkpoints_and_leaves():
    w = DDPWorker(Toy(), seed=3)
    w.warmup()
    w.assign_group(["a", "b", "c"], [{"lr": 0.1}, {"lr": 0.05, "momentum": 0.9}, {"lr": 0.01}], None)
    out = w.train(2)
    assert [r["trial"] for r in out] == ["a", "b", "c"]
    assert all(r["step"] == 20 and len(r["iter_times"]) == 2 and r["gpu_ids"] == [] for r in out)
    assert out[0]["iter_times"] == out[1]["iter_times"]           # one program: the group's times
    assert len({r["metrics"]["val_loss"] for r in out}) == 3
    assert len({r["digest"][0] for r in out}) == 3 and all(r["digest"][2] == 20 for r in out)
    with pytest.raises(SpecError, match="checkpoint_group"):
        w.checkpoint()
    blobs = w.checkpoint_group()
    assert len(blobs) == 3
    w.leave()
    assert w.group is None and w.trials == []
    with pytest.raises(SpecError, match="assign_group"):
        w.checkpoint_group()
    # The same warm worker takes member b alone and goes on from its checkpoint.
    w.assign({"lr": 0.05, "momentum": 0.9}, blobs[1])
    assert w.group is None
    assert w.train(1)["step"] == 30


def test_a_solo_trial_trains_outside_ray():
    w = DDPWorker(Toy(), seed=0)
    w.warmup()
    w.assign({"lr": 0.1}, None)
    out = w.train(1)
    assert out["step"] == 10 and out["gpu_ids"] == [] and "metrics" in out


def test_what_cannot_fuse_is_refused_in_one_line():
    w = DDPWorker(ToyConfigData(), seed=0)
    w.warmup()
    with pytest.raises(SpecError, match="data_depends_on_config"):
        w.assign_group(["a", "b"], [{"lr": 0.1}, {"lr": 0.2}])
    w = DDPWorker(Toy(), seed=0)
    with pytest.raises(SpecError, match="2 trials but 1 configs"):
        w.assign_group(["a", "b"], [{"lr": 0.1}])
    with pytest.raises(SpecError, match="group_by_shape"):
        w.assign_group(["a", "b"], [{"hidden": 4}, {"hidden": 8}])


def test_a_function_trainable_is_refused(tmp_path):
    path = tmp_path / "fn_mod.py"
    path.write_text("def fit(config):\n    pass\n")
    w = DDPWorker(f"{path}:fit", seed=0)
    with pytest.raises(SpecError, match="function trainable"):
        w.assign_group(["a"], [{}])


def test_the_worker_groups_configs_by_shape_and_names_why_not():
    w = DDPWorker(Toy(), seed=0)
    w.warmup()
    groups, reason = w.fusable([{"hidden": 8}, {"hidden": 16, "lr": 0.1}, {"hidden": 16}])
    assert groups == [[1, 2], [0]] and reason is None
    groups, reason = w.fusable([{"opt": "lbfgs"}, {"opt": "lbfgs"}])
    assert groups == [[0, 1]] and reason is not None and "LBFGS" in reason
