"""The cluster session's lifecycle edges that need no Ray: signals around the head's start,
and a sweep that fails without hiding the run's own outcome."""

import logging
import os
import signal
from pathlib import Path

import pytest

from rubberband.errors import ProviderError
from rubberband.executor.session import Session, cluster_session, raise_interrupt, sweep
from rubberband.testing.builders import fake_cloud

CLOUD = fake_cloud(2, price_usd_per_hour=1.0, provision_s=1, init_s=1)


class SignalledWhileStarting:
    """A provider whose head receives SIGTERM while it starts (``kill`` during ``ray start``)."""

    name, cluster_yaml = "fake", False

    def __init__(self):
        self.handler_at_start = None

    def start(self, run_id, run_dir, cloud, max_instances, config, *, seed, latency_scale, launch_attempts,
              launch_backoff_s):
        self.handler_at_start = signal.getsignal(signal.SIGTERM)
        if self.handler_at_start is raise_interrupt:     # else SIGTERM would kill the test run
            os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM would not interrupt the head's start")


def test_sigterm_while_the_head_starts_interrupts_like_ctrl_c_and_the_handler_is_restored(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    provider = SignalledWhileStarting()
    with pytest.raises(KeyboardInterrupt):
        with cluster_session(provider, CLOUD, 1, tmp_path, run_id="r", trainer=None):
            pass
    assert provider.handler_at_start is raise_interrupt
    assert signal.getsignal(signal.SIGTERM) is before


class FailingSweep:
    name, cluster_yaml = "fake", False

    def sweep(self, cluster, config):
        raise ProviderError("could not check EC2 in us-east-1 for instances left running: throttled")


class StoppedCluster:
    run_id, run_dir = "run-7", Path("/nonexistent")


def test_a_failing_sweep_is_one_log_line_saying_how_to_finish_never_an_exception(caplog):
    with caplog.at_level(logging.ERROR, logger="rubberband.executor"):
        sweep(Session(FailingSweep(), StoppedCluster()))
    (record,) = caplog.records
    assert "throttled" in record.getMessage()
    assert "`rubberband down --provider fake --run-id run-7`" in record.getMessage()
