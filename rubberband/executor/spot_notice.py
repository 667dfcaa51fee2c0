"""Spot interruption notices: each spot node watches its own instance metadata and tells the driver.

EC2 shows the two-minute notice only from inside the instance, at
``http://169.254.169.254/latest/meta-data/spot/instance-action`` (404 until a notice, then
``{"action": "terminate", "time": "2026-11-26T12:00:00Z"}``; IMDSv2 wants a token from
``PUT /latest/api/token`` first). ``NoticeWatcher`` runs on the node (the runner makes it a
Ray actor pinned there), polls every few seconds, and posts the notice to the driver's
``NoticeBoard`` (a Ray actor the cluster port creates and hands to each watcher); the port
reads the board. The metadata URL is
configurable: a provider that emulates reclaims serves each node's notice on an endpoint of
its own, so the same watcher runs there.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

from rubberband.providers.base import METADATA_ACTION_PATH, METADATA_TOKEN_PATH

log = logging.getLogger("rubberband.executor")

EC2_METADATA_URL = "http://169.254.169.254"
TOKEN_TTL_S = 300


def parse_time(text: str) -> float:
    """EC2's notice time (``2026-11-26T12:00:00Z``) as a Unix timestamp."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def instance_action(base_url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The instance's pending spot action (``{"action", "time"}``), or ``None`` while there is
    none. Asks for an IMDSv2 token first.

    Raises:
        OSError: the metadata service cannot be reached or answers an error other than 404.
    """
    base = base_url.rstrip("/")
    put = urllib.request.Request(base + METADATA_TOKEN_PATH, method="PUT",
                                 headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
    with urllib.request.urlopen(put, timeout=timeout_s) as resp:
        token = resp.read().decode()
    get = urllib.request.Request(base + METADATA_ACTION_PATH, headers={"X-aws-ec2-metadata-token": token})
    try:
        with urllib.request.urlopen(get, timeout=timeout_s) as resp:
            return json.loads(resp.read().decode())
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise


class NoticeBoard:
    """Where watchers post notices and the driver takes them (an unnamed Ray actor: the port
    passes its handle to each watcher)."""

    def __init__(self) -> None:
        self._posted: list[dict[str, Any]] = []

    def post(self, instance: str, reclaim_at: float, action: str) -> None:
        self._posted.append({"instance": instance, "reclaim_at": reclaim_at, "action": action})

    def take(self) -> list[dict[str, Any]]:
        out, self._posted = self._posted, []
        return out


class NoticeWatcher:
    """Polls one instance's metadata every ``poll_s`` and posts its first notice to ``board``.

    ``board`` has ``post(instance, reclaim_at, action)``: a ``NoticeBoard``, or a Ray actor
    handle of one (then ``post.remote`` is called). Errors reaching the metadata service are
    retried on the next poll (a node's network can blink).
    """

    def __init__(self, instance: str, metadata_url: str, board: Any, poll_s: float = 2.0):
        self.instance, self.url, self.board, self.poll_s = instance, metadata_url, board, poll_s
        self.posted: dict[str, Any] | None = None
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self.check():
                return
            self._stop.wait(self.poll_s)

    def check(self) -> bool:
        """Poll once; True once a notice was posted."""
        try:
            action = instance_action(self.url)
        except (OSError, ValueError):
            self.errors += 1
            return False
        if action is None:
            return False
        self.posted = action
        try:
            reclaim_at = parse_time(action["time"])
            kind = str(action.get("action", "terminate"))
        except (KeyError, TypeError, ValueError, AttributeError):
            # A notice we cannot read is still a notice: losing it (and this thread) would let
            # the instance die unannounced, so take the reclaim as imminent.
            log.warning("spot notice for %s has no readable time (%r): taking the reclaim as imminent",
                        self.instance, action)
            reclaim_at, kind = time.time(), "terminate"
        post = getattr(self.board.post, "remote", self.board.post)
        post(self.instance, reclaim_at, kind)
        return True

    def status(self) -> dict[str, Any]:
        return {"instance": self.instance, "posted": self.posted, "errors": self.errors}

    def stop(self) -> None:
        self._stop.set()
