"""Make sure the real Postgres runs and our database exists (install it if absent)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping

import psycopg
from sqlalchemy.engine import URL, make_url

from client.devcluster.paths import REPO_ROOT

# This machine's own Postgres (Debian's cluster), as its superuser: the tests', the benches'
# and MLflow's databases. It trusts every role over 127.0.0.1, so nothing that guards whom
# runs run as lives there: the dev cluster's service has a Postgres of its own
# (client/devcluster/pg_instance.py).
SYSTEM_SERVER_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


class PostgresUnavailable(RuntimeError):
    """Postgres could not be installed, started or reached."""


def _clusters() -> list[tuple[str, str, str]]:
    """(version, name, status) of each local cluster, from pg_lsclusters."""
    out = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True)
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    return [(r[0], r[1], r[3]) for r in rows]


def ensure_installed() -> None:
    """Install Debian's Postgres (server and client) with apt-get if it is missing."""
    if shutil.which("pg_lsclusters") is None:
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "postgresql"],
            check=True,
            env={"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )


def ensure_running() -> None:
    """Install Postgres with apt-get if missing, then start every stopped local cluster."""
    ensure_installed()
    for version, name, status in _clusters():
        if status != "online":
            subprocess.run(
                ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "start"],
                check=True,
            )


def _admin_conninfo(url: URL) -> str:
    """The server's maintenance database, reached as `url`'s user: where CREATE DATABASE runs."""
    return url.set(drivername="postgresql", database="postgres").render_as_string(
        hide_password=False
    )


def ensure_database(database_url: str, timeout_s: float = 30.0) -> None:
    """Create the database named in `database_url` if it does not exist yet."""
    url = make_url(database_url)
    conninfo = _admin_conninfo(url)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                exists = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (url.database,)
                ).fetchone()
                if not exists:
                    conn.execute(f'CREATE DATABASE "{url.database}"')
                return
        except psycopg.OperationalError as exc:
            if time.monotonic() > deadline:
                raise PostgresUnavailable(
                    f"cannot reach Postgres at {url.host}:{url.port}: {exc}"
                ) from exc
            time.sleep(0.5)


def migrate(database_url: str, env: Mapping[str, str] | None = None) -> None:
    """`alembic upgrade head` on `database_url`, exactly as a production deploy runs it."""
    subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(REPO_ROOT / "alembic.ini"), "upgrade", "head"],
        check=True,
        cwd=REPO_ROOT,
        capture_output=True,
        env={**os.environ, **(env or {}), "RUNYARD_DATABASE_URL": database_url},
    )


def drop_database(database_url: str) -> None:
    """Drop the database named in `database_url`, closing any sessions still on it."""
    url = make_url(database_url)
    with psycopg.connect(_admin_conninfo(url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)')


def fresh_database(database_url: str) -> None:
    """An empty, migrated database at `database_url`: what tests and benches start from."""
    drop_database(database_url)
    url = make_url(database_url)
    with psycopg.connect(_admin_conninfo(url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{url.database}"')
    migrate(database_url)
