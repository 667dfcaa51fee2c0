"""Shared set-up of the integration tests: they start real Ray clusters, one at a time."""

import os
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path, monkeypatch):
    """Each test records its clusters in its own state directory, and must leave none running."""
    state = tmp_path / "state"
    monkeypatch.setenv("RUBBERBAND_STATE_DIR", str(state))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    import rubberband.providers.local as local

    monkeypatch.setattr(local, "STATE_ROOT", state / "local")
    yield state
    leftovers = local.LocalCluster.known()
    running = [c.run_id for c in leftovers if c.processes()]
    for c in leftovers:
        c.stop()
    assert not running, f"clusters left running: {running}"


def after_checkpoint(run_dir, trial: str, action, timeout_s: float = 60.0) -> None:
    """Call ``action()`` on a thread once ``trial`` has written its first checkpoint (so a
    test can pull a node from under a trial that has something to resume from)."""
    def wait():
        ckpt = Path(run_dir) / "checkpoints" / f"{trial}.pt"
        deadline = time.time() + timeout_s
        while not ckpt.exists() and time.time() < deadline:
            time.sleep(0.05)
        action()

    threading.Thread(target=wait, daemon=True).start()


def trainer(name: str) -> str:
    return f"{HERE / 'tiny_trainer.py'}:{name}"


def paced_model():
    """The profile the aws closed-loop tests plan ``tiny_trainer.Paced`` by (one GPU per trial):
    about 0.6 s an iteration, a 1 s start-up, a 0.5 s SYNC."""
    from rubberband.profiles.distributions import Normal
    from rubberband.testing.builders import model_profile

    return model_profile({1: Normal(0.6, 0.05)}, startup_s=Normal(1.0, 0.3), sync_s=0.5, name="paced")


@pytest.fixture
def cloud():
    import rubberband as rb

    return rb.CloudProfile.load(ROOT / "cloud_profiles" / "local" / "local.yaml", "local.2gpu")


@pytest.fixture
def model():
    import rubberband as rb

    return rb.ModelProfile.load(ROOT / "profiles" / "demo_digits_local.yaml")


os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
