"""The spot notice watcher against a fake instance-metadata endpoint on localhost (IMDSv2)."""

from __future__ import annotations

import time

import pytest

from rubberband.executor.spot_notice import NoticeBoard, NoticeWatcher, instance_action, parse_time
from rubberband.providers.spot_emulation import MetadataServer


@pytest.fixture
def imds():
    server = MetadataServer().start()
    yield server
    server.stop()


def test_the_action_is_none_until_a_notice_then_ec2s_json(imds):
    url = imds.url_of("i-1")
    assert instance_action(url) is None
    imds.notify("i-1", parse_time("2026-11-26T12:00:00Z"))
    assert instance_action(url) == {"action": "terminate", "time": "2026-11-26T12:00:00Z"}
    assert instance_action(imds.url_of("i-2")) is None                   # another instance: no notice
    # IMDSv2: every GET came with a token from a PUT before it.
    assert [m for m, _ in imds.requests] == ["PUT", "GET"] * 3


def test_the_watcher_posts_the_notice_once_to_the_board(imds):
    board = NoticeBoard()
    watcher = NoticeWatcher("rb-instance-3", imds.url_of("rb-instance-3"), board, poll_s=0.05)
    time.sleep(0.2)
    assert board.take() == [] and watcher.errors == 0
    imds.notify("rb-instance-3", 1_800_000_000.0)
    deadline = time.time() + 5
    while watcher.posted is None and time.time() < deadline:
        time.sleep(0.02)
    assert board.take() == [{"instance": "rb-instance-3", "reclaim_at": 1_800_000_000.0, "action": "terminate"}]
    time.sleep(0.2)
    assert board.take() == []                                          # posted once, then the watcher stops
    watcher.stop()


def test_an_unreachable_endpoint_is_retried_not_fatal():
    board = NoticeBoard()
    watcher = NoticeWatcher("i-9", "http://127.0.0.1:9", board, poll_s=0.05)      # nothing listens on port 9
    deadline = time.time() + 5
    while watcher.errors < 2 and time.time() < deadline:
        time.sleep(0.02)
    watcher.stop()
    assert watcher.errors >= 2 and watcher.posted is None and board.take() == []


@pytest.mark.parametrize("action", [{"action": "terminate"}, {"action": "terminate", "time": "in two minutes"},
                                    {"time": None}, ["terminate"]])
def test_a_notice_without_a_readable_time_is_posted_as_imminent_not_lost(monkeypatch, caplog, action):
    monkeypatch.setattr("rubberband.executor.spot_notice.instance_action", lambda url: action)
    board = NoticeBoard()
    before = time.time()
    watcher = NoticeWatcher("rb-instance-4", "http://unused", board, poll_s=0.05)
    deadline = time.time() + 5
    posted: list = []
    while not posted and time.time() < deadline:
        posted = board.take()
        time.sleep(0.02)
    watcher.stop()
    (notice,) = posted
    assert notice["instance"] == "rb-instance-4" and notice["action"] == "terminate"
    assert before <= notice["reclaim_at"] <= time.time()
    assert "no readable time" in caplog.text
