"""Function trainables in a worker, and Ray Tune's own calls reaching rubberband's session
through Ray's private hook (this file fails when Ray moves it: pyproject pins Ray's minor
version for that reason). No Ray cluster: the worker runs in this process."""

import re
import textwrap
from pathlib import Path

import pytest

from rubberband import function_api as fa

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[3]

# Written as Ray Tune's docs write a function trainable: nothing of rubberband in it.
RAY_TUNE_FUNCTION = '''
import os, tempfile
from ray import tune

def train_fn(config):
    step = 0
    ckpt = tune.get_checkpoint()
    if ckpt:
        assert isinstance(ckpt, tune.Checkpoint)
        with ckpt.as_directory() as d:
            step = int(open(os.path.join(d, "step")).read())
    ctx = tune.get_context()
    for _ in range(50):                 # a Tune user's own bound; rubberband stops it before
        step += 1
        metrics = {"step": step, "trial": ctx.get_trial_id(), "loss": 1.0 / step}
        if step % config["every"] == 0:
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "step"), "w") as fh:
                    fh.write(str(step))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
        else:
            tune.report(metrics)
'''

TORCH_FUNCTION = '''
import torch
import rubberband as rb

def fit(config):
    model = torch.nn.Linear(4, 2)
    ckpt = rb.get_checkpoint()
    if ckpt:
        with ckpt.as_directory() as d:
            model.load_state_dict(torch.load(d + "/m.pt"))
    model = rb.prepare_model(model)
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    loader = rb.prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=8, shuffle=True))
    while True:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            torch.save(model.state_dict(), d + "/m.pt")
            rb.report({"loss": 0.5}, checkpoint=rb.Checkpoint.from_directory(d))
'''


@pytest.fixture(autouse=True)
def _denormals_back():
    """A ``DDPWorker`` flushes denormal floats for its whole process (a Ray worker's own); built
    here, in the test process, it must not leave that on for the tests after (hypothesis
    refuses to run with subnormals flushed)."""
    yield
    import torch

    torch.set_flush_denormal(False)


def _module(tmp_path, name: str, source: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


def _load(path: str, attr: str):
    from rubberband.executor.worker import load_trainer

    return load_trainer(f"{path}:{attr}")


def test_ray_tune_calls_reach_the_session_through_rays_hook(tmp_path):
    pytest.importorskip("ray.tune")
    fn = _load(_module(tmp_path, "tune_fn", RAY_TUNE_FUNCTION), "train_fn")
    s = fa.FunctionSession(fn, {"every": 2}, fa.TrialContext("t005"))
    assert fa.install_ray_hook(s)
    try:
        _, counted = s.advance(3)
        assert [r.metrics["step"] for r in counted] == [1, 2, 3] and counted[0].metrics["trial"] == "t005"
        blob = fa.pack_state(s.state())
        s.stop()
        s = fa.FunctionSession(fn, {"every": 2}, fa.TrialContext("t005"), fa.unpack_state(blob))
        fa.install_ray_hook(s)
        redone, counted = s.advance(2)
        # Checkpointed at step 2: step 3 is trained again, then 4 and 5 count.
        assert [r.metrics["step"] for r in redone] == [3] and [r.metrics["step"] for r in counted] == [4, 5]
        s.stop()
    finally:
        fa.install_ray_hook(None)
    import ray.train._internal.session as ray_session

    assert ray_session.get_session() is None


def test_pyproject_pins_the_ray_minor_version_installed():
    ray = pytest.importorskip("ray")
    pin = re.search(r'"ray\[[^\]]*\]>=(\d+)\.(\d+),<(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert pin, "pyproject.toml must pin Ray's minor version (the session hook is private)"
    lo, hi = (int(pin[1]), int(pin[2])), (int(pin[3]), int(pin[4]))
    installed = tuple(int(x) for x in ray.__version__.split(".")[:2])
    assert lo <= installed < hi and hi == (lo[0], lo[1] + 1)


def test_a_worker_trains_a_function_pauses_it_and_resumes_it_elsewhere(tmp_path):
    pytest.importorskip("ray.tune")
    from rubberband.executor.worker import DDPWorker

    path = _module(tmp_path, "tune_fn2", RAY_TUNE_FUNCTION) + ":train_fn"
    w = DDPWorker(path, seed=0)
    w.warmup()
    assert w.ray_hook, "the function's module names ray: the hook is installed"
    w.assign({"every": 3}, None, trial="t002")
    out = w.train(2)
    assert out["step"] == 2 and len(out["iter_times"]) == 2 and out["redone"] == 0
    assert out["metrics"]["step"] == 2 and out["metrics"]["trial"] == "t002"
    out = w.train(2)
    blob = w.checkpoint()
    w.leave()
    assert w.session is None
    fresh = DDPWorker(path, seed=0)              # the next stage: another process, maybe more GPUs
    fresh.warmup()
    fresh.assign({"every": 3}, blob, trial="t002")
    out = fresh.train(1)
    assert out["step"] == 5 and out["redone"] == 1 and out["metrics"]["step"] == 5 and len(out["iter_times"]) == 1
    fresh.leave()


def test_a_worker_digests_the_prepared_model_and_restores_it(tmp_path):
    from rubberband.executor.worker import DDPWorker

    path = _module(tmp_path, "torch_fn", TORCH_FUNCTION) + ":fit"
    w = DDPWorker(path, seed=0)
    w.warmup()
    assert not w.ray_hook
    w.assign({"lr": 0.1}, None, trial="t000")
    digest = w.train(2)["digest"]
    assert len(digest) == 3 and digest[2] == 2
    blob = w.checkpoint()
    w.leave()
    w.assign({"lr": 0.1}, blob, trial="t000")
    assert w.session is not None and w.session.loaded_checkpoint_dir() is not None
    w.train(1)
    w.leave()


def test_prepare_data_loader_shards_a_global_batch_over_the_gang():
    import torch

    data = torch.utils.data.TensorDataset(torch.arange(40).float())
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    seen = []
    for rank in range(2):
        s = fa.FunctionSession(lambda c: None, {}, fa.TrialContext("t", world_size=2, world_rank=rank))
        fa._current = s
        try:
            shard = fa.prepare_data_loader(loader)
            batches = [b[0] for b in shard]
        finally:
            fa._current = None
        assert all(len(b) == 4 for b in batches) and len(batches) == 5
        seen.append(torch.cat(batches))
    assert sorted(torch.cat(seen).tolist()) == list(range(40)), "the two ranks split the data between them"
    s = fa.FunctionSession(lambda c: None, {}, fa.TrialContext("t", world_size=3))
    fa._current = s
    try:
        with pytest.raises(ValueError, match="batch_size 8 does not split over 3 workers"):
            fa.prepare_data_loader(loader)
    finally:
        fa._current = None


def test_prepare_model_alone_moves_to_the_device_without_wrapping():
    import torch

    model = torch.nn.Linear(2, 2)
    assert fa.prepare_model(model) is model.to(fa.get_device())


# Reports every 2 epochs under `epoch`, checkpointing every other report (epochs 4, 8, ...).
EPOCH_FUNCTION = '''
import os, tempfile
import rubberband as rb

def by_epoch(config):
    epoch = 0
    ckpt = rb.get_checkpoint()
    if ckpt:
        with ckpt.as_directory() as d:
            epoch = int(open(os.path.join(d, "epoch")).read())
    while True:
        epoch += 2
        if epoch % 4 == 0:
            with tempfile.TemporaryDirectory() as d:
                with open(os.path.join(d, "epoch"), "w") as fh:
                    fh.write(str(epoch))
                rb.report({"epoch": epoch, "loss": 1.0 / epoch}, checkpoint=rb.Checkpoint.from_directory(d))
        else:
            rb.report({"epoch": epoch, "loss": 1.0 / epoch})
'''


def test_a_worker_counts_a_functions_iterations_by_its_time_attr(tmp_path):
    """The Ray runner's chunks are one iteration each: with ``time_attr: epoch`` a report of 2
    epochs ends one chunk and the next chunk, already passed, trains nothing."""
    from rubberband.executor.worker import DDPWorker

    path = _module(tmp_path, "epoch_fn", EPOCH_FUNCTION) + ":by_epoch"
    w = DDPWorker(path, seed=0, time_attr="epoch")
    w.warmup()
    w.assign({}, None, trial="t003")
    outs = [w.train(1) for _ in range(3)]            # a stage of 3 epochs: reports at epochs 2 and 4
    assert [o["metrics"]["epoch"] for o in outs] == [2, 2, 4] and [o["step"] for o in outs] == [2, 2, 4]
    assert [len(o["iter_times"]) for o in outs] == [1, 1, 1] and outs[1]["iter_times"] == [0.0]
    outs.append(w.train(2))                          # target 5: epoch 6 (checkpoint at 4)
    blob = w.checkpoint()
    w.leave()
    fresh = DDPWorker(path, seed=0, time_attr="epoch")
    fresh.warmup()
    fresh.assign({}, blob, trial="t003")
    out = fresh.train(1)                             # target 6: epoch 6 again, a redone report reaches it
    assert out["redone"] == 1 and out["metrics"]["epoch"] == 6 and out["step"] == 6
    out = fresh.train(1)                             # target 7: epoch 8
    assert out["redone"] == 0 and out["metrics"]["epoch"] == 8 and out["step"] == 8
    fresh.leave()
