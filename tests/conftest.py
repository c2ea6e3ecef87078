"""Fixtures on the real parts: a migrated Postgres database, the local Slurm cluster, and
the service running as its own process (so tests can stop and restart it)."""

from __future__ import annotations

import os
import random
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session

REPO_ROOT = Path(__file__).resolve().parents[1]
# One database per test session, so two sessions (two developers, or CI beside a developer)
# never drop each other's data; its name also prefixes the session's Slurm job names.
TEST_DATABASE = f"runyard_test_{os.getpid()}"
TEST_DATABASE_URL = f"postgresql+psycopg://postgres@127.0.0.1:5432/{TEST_DATABASE}"

# The environment as the session found it: what the dev cluster's own service and agents,
# paused for the integration tests, are started again with (not the tests' settings below).
ENVIRONMENT_AT_START = dict(os.environ)

# Settings are read from the environment: point everything in-process at the test database
# before any service module caches them.
os.environ["RUNYARD_DATABASE_URL"] = TEST_DATABASE_URL
os.environ["RUNYARD_RUN_RECONCILER"] = "false"

T = TypeVar("T")


# Ports for the tests' own listeners come from below Linux's default ephemeral range
# (32768-60999, /proc/sys/net/ipv4/ip_local_port_range). A port the kernel hands out for
# "any free port" is an ephemeral one, and between the test's pick and its server's bind
# any outgoing connection on the machine (an agent's heartbeat, a worker's report) may take
# it: the tp 2 layouts test failed once with EADDRINUSE so. Below the range only another
# explicit bind can.
LISTEN_PORTS = (20_000, 32_000)


def free_port() -> int:
    """A port below the ephemeral range that nothing listens on now."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(*LISTEN_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {LISTEN_PORTS}")


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout_s: float = 60.0,
    interval_s: float = 0.25,
    context: Callable[[], object] | None = None,
) -> T:
    """Poll a state until it holds (returns something truthy); fail naming what never came."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(
        f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})"
        + (f"; {context()}" if context else "")
    )


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A fresh database migrated by Alembic, as `alembic upgrade head` does in production."""
    from client.devcluster import postgres

    postgres.ensure_running()
    postgres.fresh_database(TEST_DATABASE_URL)
    yield TEST_DATABASE_URL
    postgres.drop_database(TEST_DATABASE_URL)


# The Unix user the tests' admin submits as (made by `runyard dev up`, as on the dev
# cluster: client/devcluster/identity.py), and the one the in-process tests' rows name.
ADMIN_UNIX_USER = "ops"


def mint_token(
    database_url: str,
    path: Path,
    *,
    user: str,
    team: str,
    role: str,
    node: str | None = None,
    unix: str | None = None,
) -> str:
    """A real token, committed to the test database, as `runyard dev up` mints them; with
    `unix`, its user is linked to that Unix user (whom their runs run as)."""
    from service.auth.bootstrap import link_unix_user, mint_token_file
    from service.models import Role

    mint_token_file(database_url, path, user=user, team=team, role=Role(role), node_name=node)
    if unix is not None:
        link_unix_user(database_url, user, unix, None)
    return path.read_text().strip()


@pytest.fixture(scope="session")
def admin_token(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    return mint_token(
        database_url,
        tmp_path_factory.mktemp("tokens") / "admin.token",
        user="admin",
        team="ops",
        role="admin",
        unix=ADMIN_UNIX_USER,
    )


@pytest.fixture
def shared_path(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh folder on the tests' stand-in for a site's shared filesystem: the runs'
    owners can reach it (pytest's own temporary root is root's, mode 0700, and the service
    reads a run's inputs as the run's owner: service/identity/)."""
    name = "".join(c if c.isalnum() else "-" for c in request.node.name)[:80]
    path = Path(f"/tmp/runyard-tests/{TEST_DATABASE}-shared") / name
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    for folder in (path, path.parent, path.parent.parent):
        folder.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def database_engine(database_url: str) -> Iterator[Engine]:
    """One engine for the session's rolled-back tests, as the service keeps one: SQLAlchemy
    caches each statement's compiled SQL per engine, and an engine per test compiled every
    statement of every reconcile tick again (a fifth of the reconciler tests' time). Pinged
    at checkout: the integration tests restart Postgres under this session."""
    engine = create_engine(database_url, pool_pre_ping=True)
    yield engine
    engine.dispose()


@pytest.fixture
def db_session(database_engine: Engine) -> Iterator[Session]:
    """A session inside a transaction that is rolled back after the test."""
    with database_engine.connect() as conn:
        outer = conn.begin()
        session = Session(bind=conn, join_transaction_mode="create_savepoint")
        try:
            yield session
        finally:
            session.close()
            outer.rollback()


@pytest.fixture
def api(db_session: Session, admin_token: str) -> Iterator[Any]:
    """The FastAPI app in-process (no reconciler), on the rolled-back session, as an admin."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.db import get_session

    app = create_app()
    app.dependency_overrides[get_session] = lambda: db_session
    yield TestClient(app, headers={"Authorization": f"Bearer {admin_token}"})
