"""Spot reclaims on the `local` provider (``rubberband run --spot-emulation``), and a fake
instance-metadata endpoint that serves each node's interruption notice.

The emulator draws when each spot instance is reclaimed from the plan's preemption model
(DESIGN §4.1), or from an override given on the command line:

* ``rate_per_hour`` — an exponential lifetime per instance, from its RUNNING;
* ``life_s`` — a fixed lifetime per instance (a forced schedule, for rehearsals and tests);
* ``trace`` — a zone's availability replayed from a seeded random offset: a spot request
  waits while the zone has no capacity, and when it loses capacity every spot instance is
  reclaimed together.

``notice_s`` before a reclaim the instance's metadata answers
``/latest/meta-data/spot/instance-action`` as EC2's does (404 before, then
``{"action": "terminate", "time": ...}``; IMDSv2 tokens included), so the executor's notice
watcher runs the same code against the emulator as against EC2. At the reclaim the node's Ray
processes are killed and it is logged ``terminated`` with reason ``interrupted``.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from rubberband.errors import SpecError
from rubberband.providers.base import (
    METADATA_ACTION_PATH,
    METADATA_TOKEN_PATH,
    SPOT_EMULATION_FLAG,
    SPOT_EMULATION_FROM_PLAN,
)
from rubberband.schema import did_you_mean
from rubberband.units import parse_duration

FLAG = SPOT_EMULATION_FLAG
OVERRIDE_KEYS = ("rate", "life", "zone", "notice", "max")
EXAMPLE = "e.g. --spot-emulation rate=2/h,notice=20s"
SHIPPED_TRACES = Path(__file__).resolve().parents[2] / "cloud_profiles" / "aws" / "spot_traces" / "p3.2xlarge.json"


@dataclass(frozen=True)
class SpotEmulation:
    """How the local provider reclaims spot instances (see the module docstring).

    Exactly one of ``rate_per_hour``, ``life_s`` and ``trace_file``/``zone`` says when;
    ``max_reclaims`` caps how many reclaims the run sees (``None``: no cap).
    """

    rate_per_hour: float | None = None
    life_s: float | None = None
    trace_file: str | None = None
    zone: str | None = None
    notice_s: float = 0.0
    max_reclaims: int | None = None
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpotEmulation:
        return cls(**data)

    def describe(self) -> str:
        if self.trace_file:
            when = f"zone {self.zone} replayed"
        elif self.life_s is not None:
            when = f"each spot instance reclaimed {self.life_s:g}s after it runs"
        else:
            when = f"{self.rate_per_hour:g} reclaims per instance-hour"
        cap = f", at most {self.max_reclaims} reclaim(s)" if self.max_reclaims is not None else ""
        return f"spot emulation: {when}, {self.notice_s:g}s notice{cap}"


def _rate(value: str) -> float:
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e-?\d+)?)\s*(?:/\s*(h|hour|m|min))?", value.strip())
    if not m:
        raise SpecError(f"{FLAG}: rate: expected reclaims per instance-hour such as 2/h, got {value!r}")
    per = {"h": 1.0, "hour": 1.0, "m": 60.0, "min": 60.0}[m.group(2) or "h"]
    return float(m.group(1)) * per


def _duration(value: str, key: str, zero: bool = False) -> float:
    if zero and value.strip() in ("0", "0s"):
        return 0.0
    return parse_duration(value, f"{FLAG}: {key}")


def spot_emulation(override: str | None, cloud: Any, spot_instances: tuple[int, ...], seed: int = 0) -> SpotEmulation:
    """The emulation for a plan: its cloud's spot model, with ``override`` (``key=value,...``:
    ``rate=2/h``, ``life=30s``, ``zone=us-east-1a``, ``notice=20s``, ``max=1``) applied
    (``None``, ``""`` or ``"model"``: none).

    Raises:
        SpecError: one line naming ``--spot-emulation`` and the fix, for a plan without spot
            instances, a malformed override, or a plan whose model cannot be emulated.
    """
    if not any(spot_instances):
        raise SpecError(f"{FLAG}: the plan holds no spot instances, so there is nothing to reclaim; plan on spot "
                        "(--market spot or auto, or `market: spot` in the experiment) or drop the flag")
    given: dict[str, str] = {}
    for part in ("" if override == SPOT_EMULATION_FROM_PLAN else override or "").split(","):
        if not part.strip():
            continue
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not value.strip():
            raise SpecError(f"{FLAG}: expected key=value pairs, got {part.strip()!r}; {EXAMPLE}")
        if key not in OVERRIDE_KEYS:
            raise SpecError(f"{FLAG}: unknown key {key!r}{did_you_mean(key, OVERRIDE_KEYS)}; use "
                            f"{', '.join(OVERRIDE_KEYS)}, {EXAMPLE}")
        if key in given:
            raise SpecError(f"{FLAG}: {key} given twice; give it once")
        given[key] = value.strip()
    models = [k for k in ("rate", "life", "zone") if k in given]
    if len(models) > 1:
        raise SpecError(f"{FLAG}: give one of rate, life or zone, not {' and '.join(models)}")
    spot = cloud.spot
    notice = _duration(given["notice"], "notice", zero=True) if "notice" in given else float(spot.notice_s)
    cap = None
    if "max" in given:
        if not given["max"].isdigit():
            raise SpecError(f"{FLAG}: max: expected a whole number of reclaims such as 1, got {given['max']!r}")
        cap = int(given["max"])
    common = SpotEmulation(notice_s=notice, max_reclaims=cap, seed=seed)      # and when, below
    if "rate" in given:
        return replace(common, rate_per_hour=_rate(given["rate"]))
    if "life" in given:
        return replace(common, life_s=_duration(given["life"], "life"))
    if "zone" in given:
        from rubberband.profiles.spot import load_trace

        file = spot.trace_file or str(SHIPPED_TRACES)
        load_trace(file, given["zone"], where=f"{FLAG}: zone")      # the zone must exist
        return replace(common, trace_file=file, zone=given["zone"])
    if spot.trace is not None:
        return replace(common, trace_file=spot.trace_file, zone=spot.trace.zone)
    if spot.modelled:
        return replace(common, rate_per_hour=float(spot.rate_per_hour))
    raise SpecError(f"{FLAG}: {cloud.instance_type} has no preemption model in the cloud profile; give one in "
                    f"the experiment (`spot: {{preemption: {{rate_per_hour: 0.3}}}}` in cloud.overrides) or here, {EXAMPLE}")


class Reclaimer:
    """Draws reclaim times (wall-clock seconds) for spot instances; pure apart from its generator."""

    def __init__(self, emulation: SpotEmulation, started_at: float):
        self.emu, self.started_at = emulation, started_at
        self.rng = np.random.default_rng(emulation.seed)
        self.trace = None
        self.offset = 0.0
        if emulation.trace_file:
            from rubberband.profiles.spot import load_trace

            self.trace = load_trace(emulation.trace_file, str(emulation.zone))
            self.offset = float(self.rng.uniform(0.0, self.trace.duration_s))
        self.reclaims = 0

    def _trace_time(self, wall: float) -> float:
        return self.offset + (wall - self.started_at)

    def capacity_at(self, wall: float) -> float:
        """When a spot request made at ``wall`` can be served (now, unless the zone has none)."""
        if self.trace is None:
            return wall
        return wall + float(self.trace.next_change(self._trace_time(wall), up=True)) - self._trace_time(wall)

    def reclaim_at(self, running_at: float) -> float:
        """When an instance running from ``running_at`` is reclaimed (``inf``: never)."""
        if self.trace is not None:
            t = self._trace_time(running_at)
            return running_at + float(self.trace.next_change(t, up=False)) - t
        if self.emu.life_s is not None:
            return running_at + self.emu.life_s
        rate = self.emu.rate_per_hour or 0.0
        return running_at + float(self.rng.exponential(3600.0 / rate)) if rate > 0 else math.inf

    def take(self) -> bool:
        """Count one reclaim; False once the cap is reached (the instance is then spared)."""
        if self.emu.max_reclaims is not None and self.reclaims >= self.emu.max_reclaims:
            return False
        self.reclaims += 1
        return True


def iso_time(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class MetadataServer:
    """A fake EC2 instance-metadata endpoint for many instances, on localhost.

    Instance ``name`` is served under ``<url>/<name>``: ``PUT /latest/api/token`` returns a
    token (IMDSv2), and ``GET /latest/meta-data/spot/instance-action`` with that token answers
    404 until ``notify(name, reclaim_at)``, then EC2's JSON. A GET without a valid token is
    refused with 401, as EC2 does when IMDSv2 is required.
    """

    def __init__(self) -> None:
        self.actions: dict[str, dict[str, str]] = {}
        self.tokens: set[str] = set()
        self.requests: list[tuple[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):   # quiet
                pass

            def _answer(self, status: int, body: str = "", kind: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _split(self) -> tuple[str, str]:
                name, _, rest = self.path.lstrip("/").partition("/")
                return name, "/" + rest

            def do_PUT(self):  # noqa: N802 - http.server's name
                name, path = self._split()
                server.requests.append(("PUT", self.path))
                if path != METADATA_TOKEN_PATH or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._answer(400)
                token = secrets.token_hex(16)
                server.tokens.add(token)
                self._answer(200, token)

            def do_GET(self):  # noqa: N802
                name, path = self._split()
                server.requests.append(("GET", self.path))
                if self.headers.get("X-aws-ec2-metadata-token") not in server.tokens:
                    return self._answer(401)
                action = server.actions.get(name)
                if path != METADATA_ACTION_PATH or action is None:
                    return self._answer(404, "Not Found")
                self._answer(200, json.dumps(action), "application/json")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}"

    def url_of(self, name: str) -> str:
        return f"{self.url}/{name}"

    def start(self) -> MetadataServer:
        self._thread.start()
        return self

    def notify(self, name: str, reclaim_at: float, action: str = "terminate") -> None:
        self.actions[name] = {"action": action, "time": iso_time(reclaim_at)}

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def schedule(at: float, fn: Callable[[], None]) -> threading.Timer:
    """Run ``fn`` on a daemon thread at wall-clock time ``at``."""
    timer = threading.Timer(max(0.0, at - time.time()), fn)
    timer.daemon = True
    timer.start()
    return timer
