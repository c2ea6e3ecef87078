"""Slurm accounting for the dev cluster: a MariaDB of its own and slurmdbd, so `sacct`
lists every job. Started before slurmctld (which registers with slurmdbd on start) and only
where Debian's slurmdbd and mariadb-server are installed (scripts/bootstrap.sh installs
them); without them the dev cluster runs with no accounting, as many sites do."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

from client.devcluster.processes import Started, is_alive, spawn
from client.devcluster.render import DBD_PORT, MARIADB_PORT

ACCOUNTING_PACKAGES = ["slurmdbd", "mariadb-server"]
# Slurm's accounting guide recommends these InnoDB settings; slurmdbd logs an error without.
MARIADB_TUNING = ["--innodb-buffer-pool-size=128M", "--innodb-lock-wait-timeout=900"]


def available() -> bool:
    return all(shutil.which(b) for b in ("slurmdbd", "mariadbd", "mariadb-install-db", "sacct"))


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def ensure_running(
    state_dir: Path,
    table: dict[str, Started],
    env: dict[str, str],
    wait: Callable[[str, Callable[[], bool], float], None],
    port_offset: int = 0,
) -> None:
    """MariaDB, then slurmdbd, each started unless ours already runs (`port_offset`: a
    second cluster's, on ports of its own)."""
    mariadb_port, dbd_port = MARIADB_PORT + port_offset, DBD_PORT + port_offset
    datadir = state_dir / "mariadb"
    log_dir, run_dir = state_dir / "log", state_dir / "run"
    if not (datadir / "mysql").is_dir():
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={datadir}",
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            capture_output=True,
        )
    if not (p := table.get("mariadb")) or not is_alive(p):
        table["mariadb"] = spawn(
            "mariadb",
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={datadir}",
                f"--port={mariadb_port}",
                "--bind-address=127.0.0.1",
                f"--socket={run_dir / 'mariadb.sock'}",
                f"--pid-file={run_dir / 'mariadb.pid'}",
                "--user=root",
                "--skip-name-resolve",
                *MARIADB_TUNING,
            ],
            log_dir / "mariadb.out",
        )
        wait("mariadb", lambda: listening(mariadb_port), 60)
    (state_dir / "slurmdbd.conf").chmod(0o600)
    if not (p := table.get("slurmdbd")) or not is_alive(p):
        table["slurmdbd"] = spawn("slurmdbd", ["slurmdbd", "-D"], log_dir / "slurmdbd.out", env=env)
        wait("slurmdbd", lambda: listening(dbd_port), 60)


def ensure_cluster_registered(cluster_name: str, env: dict[str, str]) -> None:
    """The cluster row slurmctld's records hang off (`sacctmgr add cluster`), once."""
    listed = subprocess.run(
        ["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    if cluster_name not in listed.stdout.split():
        subprocess.run(
            ["sacctmgr", "-i", "add", "cluster", cluster_name],
            capture_output=True,
            env=env,
            timeout=30,
            check=True,
        )
