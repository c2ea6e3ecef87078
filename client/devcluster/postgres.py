"""Make sure the real Postgres runs and our database exists (install it if absent)."""

from __future__ import annotations

import shutil
import subprocess
import time

import psycopg
from sqlalchemy.engine import make_url


class PostgresUnavailable(RuntimeError):
    """Postgres could not be installed, started or reached."""


def _clusters() -> list[tuple[str, str, str]]:
    """(version, name, status) of each local cluster, from pg_lsclusters."""
    out = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True)
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    return [(r[0], r[1], r[3]) for r in rows]


def ensure_running() -> None:
    """Install Postgres with apt-get if missing, then start every stopped local cluster."""
    if shutil.which("pg_lsclusters") is None:
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "postgresql"],
            check=True,
            env={"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
    for version, name, status in _clusters():
        if status != "online":
            subprocess.run(
                ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "start"],
                check=True,
            )


def ensure_database(database_url: str, timeout_s: float = 30.0) -> None:
    """Create the database named in `database_url` if it does not exist yet."""
    url = make_url(database_url)
    admin = url.set(drivername="postgresql", database="postgres")
    conninfo = admin.render_as_string(hide_password=False)
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
