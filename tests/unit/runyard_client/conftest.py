"""Fixtures for runyard-client's tests: services over real HTTP on 127.0.0.1, a stand-in
that records what it receives and answers what a test sets, and the real service app (no
database: the protocol handshake needs none)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import uvicorn
from runyard_client import http_reporter

from service.app import create_app
from tests.unit.runyard_client.stand_in import StandIn, serve


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    monkeypatch.setattr(http_reporter, "FIRST_RETRY_WAIT_S", 0.02)  # retries in ms
    with serve() as service:
        yield service


@pytest.fixture
def real_service() -> Iterator[str]:
    """The service's own app (service.app.create_app) under uvicorn, without its lifespan
    (no reconciler, no database): its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # connections wait in the backlog until uvicorn accepts: no start-up race
    server = uvicorn.Server(uvicorn.Config(create_app(), lifespan="off", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()
