"""An HTTP proxy in front of an EC2 emulator (moto) that answers some calls with EC2 errors.

moto has no capacity model, so tests put this proxy between boto3 and moto to make
``RunInstances`` fail the way EC2 does when a type is short (``InsufficientInstanceCapacity``,
HTTP 500 with EC2's XML error body). boto3 parses the real wire response, so the code under
test sees exactly what it would see from AWS.

    proxy = Ec2FaultProxy("http://127.0.0.1:5000", fail={"RunInstances": 2})
    proxy.start()          # AWS_ENDPOINT_URL=proxy.url
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ERROR_XML = ('<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}</Code>'
             '<Message>{message}</Message></Error></Errors><RequestID>rb-fault-{n}</RequestID></Response>')
MESSAGES = {
    "InsufficientInstanceCapacity": "We currently do not have sufficient capacity in the Availability Zone you requested. "
                                    "Our system will be working on provisioning additional capacity.",
}


class Ec2FaultProxy:
    """Forwards every request to ``target``; the first ``fail[action]`` calls of an action fail
    (with ``only``: of those whose form body contains it, e.g. ``"MarketType=spot"``: a zone
    out of spot capacity)."""

    def __init__(self, target: str, fail: dict[str, int] | None = None, code: str = "InsufficientInstanceCapacity",
                 only: str | None = None):
        self.target = target.rstrip("/")
        self.only = only
        self.fail = dict(fail or {})
        self.code = code
        self.calls: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):   # quiet
                pass

            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                action = urllib.parse.parse_qs(body.decode("utf-8", "replace")).get("Action", [""])[0]
                with proxy._lock:
                    proxy.calls[action] = proxy.calls.get(action, 0) + 1
                    inject = proxy.failed.get(action, 0) < proxy.fail.get(action, 0) and (
                        proxy.only is None or proxy.only in urllib.parse.unquote_plus(body.decode("utf-8", "replace")))
                    if inject:
                        proxy.failed[action] = proxy.failed.get(action, 0) + 1
                        n = proxy.failed[action]
                if inject:
                    data = ERROR_XML.format(code=proxy.code, message=MESSAGES.get(proxy.code, proxy.code), n=n).encode()
                    self.send_response(500)
                    self.send_header("Content-Type", "text/xml")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self._forward("POST", body)

            def do_GET(self):  # noqa: N802
                self._forward("GET", None)

            def _forward(self, method, body):
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                req = urllib.request.Request(proxy.target + self.path, data=body, method=method, headers=headers)
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        status, data, rheaders = resp.status, resp.read(), resp.headers
                except urllib.error.HTTPError as err:
                    status, data, rheaders = err.code, err.read(), err.headers
                self.send_response(status)
                for k, v in rheaders.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Ec2FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
