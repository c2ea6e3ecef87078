"""Fixtures for the worker tests: a shared data cache and a stand-in service."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
from worker_helpers import FakeService

# The tiny test models gain nothing from intra-op threads, and on a busy two-core machine
# OpenMP's spinning threads made a 60-step run four times slower (16 s against 4 s).
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def data_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One packed builtin corpus for the whole session (packing takes ~0.1 s, reading 8 MB)."""
    from worker.data import ensure_builtin_corpus

    cache = tmp_path_factory.mktemp("data-cache")
    ensure_builtin_corpus(cache)
    return cache


@pytest.fixture
def fake_service(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeService]:
    from runyard_client import http_reporter

    monkeypatch.setattr(http_reporter, "FIRST_RETRY_WAIT_S", 0.02)  # retries in ms, not seconds
    service = FakeService()

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

        def do_GET(self) -> None:
            if service._should_fail(self.path):
                return self._reply(service.failure_status, {"error": "failed"})
            if self.path.endswith("/config") and service.config is not None:
                return self._reply(200, service.config)
            return self._reply(404, {"error": "not_found", "detail": self.path})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            if service._should_fail(self.path):
                return self._reply(service.failure_status, {"error": "failed"})
            with service.lock:
                service.received.append((self.path, body, dict(self.headers)))
            if self.path.endswith("/progress"):
                return self._reply(200, {"run_state": service.run_state, **service.progress_reply})
            return self._reply(200, {})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    service.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield service
    server.shutdown()
    server.server_close()
