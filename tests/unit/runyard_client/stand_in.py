"""A stand-in for the service's worker endpoints over real HTTP: it records what it receives
and answers what a test sets (the real endpoints need Postgres and an attempt's token)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ATTEMPT_PATH = re.compile(r"^/v1/worker/attempts/\d+/(progress|checkpoints|finish|errors)$")


@dataclass
class StandIn:
    """The worker endpoints with the service's paths and bodies, recording every request.

    `protocol`: the answer to GET /v1/worker/protocol, or None for a 404 (a service older
    than the handshake)."""

    url: str = ""
    protocol: dict[str, int] | None = field(default_factory=lambda: {"oldest": 1, "newest": 1})
    stop_requested: bool = False
    received: list[tuple[str, str, Any, dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self, suffix: str) -> list[Any]:
        with self.lock:
            return [body for _, path, body, _ in self.received if path.endswith(suffix)]

    def requests(self) -> list[tuple[str, str]]:
        with self.lock:
            return [(method, path) for method, path, _, _ in self.received]

    def steps(self) -> list[int]:
        return [row["step"] for body in self.bodies("/progress") for row in body["metrics"]]


@contextmanager
def serve() -> Iterator[StandIn]:
    """A StandIn listening on 127.0.0.1 until the block ends."""
    service = StandIn()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep test output quiet
            pass

        def _reply(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _record(self, body: Any) -> None:
            with service.lock:
                service.received.append((self.command, self.path, body, dict(self.headers)))

        def do_GET(self) -> None:
            self._record(None)
            if self.path == "/v1/worker/protocol" and service.protocol is not None:
                return self._reply(200, service.protocol)
            return self._reply(404, {"error": "not_found", "detail": "Not Found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self._record(body)
            if not ATTEMPT_PATH.match(self.path):
                return self._reply(404, {"error": "not_found", "detail": "Not Found"})
            if self.path.endswith("/progress"):
                reply = {"run_state": "RUNNING", "stop_requested": service.stop_requested}
                return self._reply(200, reply)
            return self._reply(200, {})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    service.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield service
    server.shutdown()
    server.server_close()
