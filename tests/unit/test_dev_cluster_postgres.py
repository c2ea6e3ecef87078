"""The dev cluster's own Postgres (issue 38, finding 8): on this machine's Postgres every
local user could connect as `postgres` over 127.0.0.1 and rewrite whom runs run as.

A scratch instance is made here by the very function `runyard dev up` uses
(pg_instance.ensure), in a folder of its own on a free port, run by the service's user;
the dev cluster itself (.runyard/dev, port 15432) is never touched. `runyard doctor`'s
check is tried against it and against this machine's trusting Postgres."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from client.devcluster import cluster, pg_instance, postgres
from client.devcluster.cluster import DevCluster, database_in_use, down
from client.devcluster.identity import SERVICE_USER
from client.devcluster.processes import ProcessTable, Started, is_alive, spawn, stop
from client.devcluster.render import (
    CONTROLLER_PORT,
    DBD_PORT,
    FIRST_SLURMD_PORT,
    MARIADB_PORT,
    MAX_NODES,
)
from client.doctor.database import check_local_users_refused
from tests.conftest import free_port, wait_for


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


needs_root = pytest.mark.skipif(
    os.geteuid() != 0
    or not _user_exists(SERVICE_USER)
    or not list(pg_instance.POSTGRES_LIB.glob("*/bin/initdb"))
    or shutil.which("runuser") is None,
    reason="needs root, the service's user (`runyard dev up` makes it), Debian's Postgres "
    "server and runuser",
)
SYSTEM_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def scratch_instance(root: Path, port: int) -> pg_instance.Instance:
    return pg_instance.Instance(
        root=root / "postgres",
        port=port,
        owner=SERVICE_USER,
        database="runyard",
        role=SERVICE_USER,
        log=root / "log" / "postgres.out",
    )


@pytest.fixture(scope="module")
def scratch_root() -> Iterator[Path]:
    """A folder the service's user can reach (pytest's own is root's, mode 0700)."""
    root = Path(tempfile.mkdtemp(prefix="runyard-test-pg-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def instance(scratch_root: Path) -> Iterator[tuple[pg_instance.Instance, dict[str, Started]]]:
    made = scratch_instance(scratch_root, free_port())
    table: dict[str, Started] = {}
    pg_instance.ensure(made, table, wait_for)
    yield made, table
    pg_instance.shut_down(table[pg_instance.PROCESS_NAME])


def try_connect(made: pg_instance.Instance, user: str, password: str) -> str:
    """'in' or the first line of libpq's refusal, over 127.0.0.1 (never with a password
    from a password file)."""
    conninfo = f"host=127.0.0.1 port={made.port} dbname={made.database} user={user}"
    try:
        psycopg.connect(
            conninfo, password=password, passfile="/nonexistent", connect_timeout=5
        ).close()
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0]
    return "in"


def as_user(user: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runuser", "-u", user, "--", *argv], capture_output=True, text=True, cwd="/", timeout=60
    )


def psql(instance: pg_instance.Instance, role: str) -> list[str]:
    """psql over the instance's socket as `role`, asking who it is."""
    argv = [str(pg_instance.bin_dir(instance) / "psql"), "-X", "-At", "-d", "postgres"]
    argv += ["-h", str(instance.socket_dir), "-p", str(instance.port), "-U", role]
    return [*argv, "-c", "SELECT current_user"]


def test_every_host_line_asks_for_a_password_and_only_the_owner_is_trusted_by_peer() -> None:
    lines = [ln.split() for ln in pg_instance.hba_conf().splitlines() if not ln.startswith("#")]
    assert lines, "pg_hba.conf has no rules"
    for rule in lines:
        assert "trust" not in rule, rule
        if rule[0] == "host":
            assert rule[3] == "127.0.0.1/32" and rule[4] == "scram-sha-256", rule
        else:
            assert rule[:3] == ["local", "all", pg_instance.SUPERUSER], rule
            assert rule[3:] == ["peer", "map=owner"], rule
    ident = pg_instance.ident_conf(scratch_instance(Path("/x"), 1)).splitlines()[-1].split()
    assert ident == ["owner", SERVICE_USER, pg_instance.SUPERUSER]


def test_the_dev_clusters_postgres_ports_collide_with_none_of_its_other_ports() -> None:
    """15432 and, for a cluster on a Slurm prefix, 16432: clear of MariaDB, slurmctld,
    slurmdbd, every possible slurmd and the services of both clusters."""
    offset = cluster.PREFIX_PORT_OFFSET
    taken: set[int] = set()
    for o in (0, offset):
        taken |= {MARIADB_PORT + o, CONTROLLER_PORT + o, DBD_PORT + o}
        taken |= set(range(FIRST_SLURMD_PORT + o, FIRST_SLURMD_PORT + o + MAX_NODES))
        taken |= set(range(8000 + o, 8000 + o + 9))  # the service, its replicas
    ours = {pg_instance.DEV_PORT, pg_instance.DEV_PORT + offset}
    assert not ours & taken
    assert all(p < 32768 for p in ours)  # below Linux's ephemeral ports


def test_the_service_gets_a_url_that_names_its_password_file_and_holds_no_password(
    tmp_path: Path,
) -> None:
    dev = DevCluster(tmp_path, slurm_prefix=None)
    url = make_url(dev.service_env()["RUNYARD_DATABASE_URL"])
    assert url.password is None and url.username == SERVICE_USER
    assert (url.host, url.port, url.database) == ("127.0.0.1", 15432, "runyard")
    assert url.query["passfile"] == str(tmp_path / "postgres" / "service.pgpass")
    prefixed = DevCluster(tmp_path, slurm_prefix=Path("/opt/slurm-24.11"))
    assert make_url(prefixed.database_url).port == 16432
    assert make_url(prefixed.database_url).database == "runyard_slurm_24_11"


@needs_root
def test_a_connection_without_the_password_is_refused_and_with_it_accepted(
    instance: tuple[pg_instance.Instance, dict[str, Started]],
) -> None:
    made, _ = instance
    for role in (made.role, pg_instance.SUPERUSER):
        said = try_connect(made, role, password="")
        assert "no password supplied" in said, (role, said)
        said = try_connect(made, role, password="not-it")
        assert "password authentication failed" in said, (role, said)
    # What the service does: its URL names the password file, libpq reads it.
    engine = create_engine(made.url)
    with engine.connect() as conn:
        who = conn.execute(text("SELECT current_user, rolsuper FROM pg_roles "
                                "WHERE rolname = current_user")).one()  # fmt: skip
    engine.dispose()
    assert tuple(who) == (made.role, False)


@needs_root
def test_the_password_file_and_the_folders_are_the_owners_alone(
    instance: tuple[pg_instance.Instance, dict[str, Started]],
) -> None:
    made, _ = instance
    owner = pwd.getpwnam(made.owner).pw_uid
    for path, mode in ((made.root, 0o700), (made.socket_dir, 0o700), (made.passfile, 0o600)):
        info = path.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (owner, mode), path


@needs_root
def test_another_user_cannot_reach_the_socket_and_root_is_no_superuser_there(
    instance: tuple[pg_instance.Instance, dict[str, Started]],
) -> None:
    made, _ = instance
    listed = as_user("nobody", ["ls", str(made.socket_dir)])
    assert listed.returncode != 0 and "Permission denied" in listed.stderr, listed
    by_nobody = as_user("nobody", psql(made, pg_instance.SUPERUSER))
    assert by_nobody.returncode != 0 and "Permission denied" in by_nobody.stderr, by_nobody
    # Root may enter any folder, but peer maps only the owner's login to the superuser.
    by_root = subprocess.run(psql(made, pg_instance.SUPERUSER), capture_output=True, text=True)
    assert "Peer authentication failed" in by_root.stderr, by_root
    by_owner = as_user(made.owner, psql(made, pg_instance.SUPERUSER))
    assert by_owner.stdout.strip() == pg_instance.SUPERUSER, by_owner


@needs_root
def test_ensure_again_adopts_the_running_server_and_keeps_the_password(
    instance: tuple[pg_instance.Instance, dict[str, Started]],
) -> None:
    """`dev up` on a cluster that runs, even with its process table lost."""
    made, table = instance
    before = made.passfile.read_text()
    lost: dict[str, Started] = {}
    pg_instance.ensure(made, lost, wait_for)
    assert lost[pg_instance.PROCESS_NAME].pid == table[pg_instance.PROCESS_NAME].pid
    assert made.passfile.read_text() == before
    with create_engine(made.url).connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1


@needs_root
def test_down_stops_it_cleanly_after_the_service_and_up_brings_back_the_same_data(
    scratch_root: Path,
) -> None:
    """`dev down` shuts the server down (fast: a checkpoint, no recovery at the next start)
    only after the service, and `dev up`'s ensure starts it on the same data."""
    state = scratch_root / "down-up"
    state.mkdir()
    made = scratch_instance(state, free_port())
    table: dict[str, Started] = {}
    pg_instance.ensure(made, table, wait_for)
    engine = create_engine(made.url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE kept (v int)"))
        conn.execute(text("INSERT INTO kept VALUES (7)"))
    # A client still connected (the service's pool): a smart shutdown would wait for it.
    held = engine.connect()
    service = spawn(
        "service",
        [sys.executable, "-c", "import time; time.sleep(600)"],
        state / "log" / "service.out",
    )
    wait_for("the stand-in service", lambda: is_alive(service))
    table["service"] = service
    ProcessTable(state / "processes.json").save(table)
    stopped = down(DevCluster(state), say=lambda _: None)
    held.close()
    engine.dispose()
    assert stopped == ["service", pg_instance.PROCESS_NAME]
    log = made.log.read_text()
    assert "fast shutdown request" in log and "database system is shut down" in log
    table = {}
    pg_instance.ensure(made, table, wait_for)
    try:
        assert "database system was shut down at" in made.log.read_text().split("fast")[-1]
        with create_engine(made.url).connect() as conn:
            assert conn.execute(text("SELECT v FROM kept")).scalar() == 7
    finally:
        pg_instance.shut_down(table[pg_instance.PROCESS_NAME])


@needs_root
def test_doctor_fails_a_trusting_postgres_and_passes_the_dev_clusters(
    instance: tuple[pg_instance.Instance, dict[str, Started]],
) -> None:
    postgres.ensure_running()
    trusting = check_local_users_refused(SYSTEM_POSTGRES)
    assert trusting.status == "FAIL", trusting
    assert "root as postgres" in trusting.detail and "nobody as postgres" in trusting.detail
    assert "scram-sha-256" in trusting.fix and "runyard dev down && runyard dev up" in trusting.fix
    made, _ = instance
    guarded = check_local_users_refused(made.url)
    assert guarded.status == "ok", guarded
    assert "root, nobody refused as postgres, runyard" in guarded.detail


def test_a_running_service_keeps_the_database_it_was_started_with(tmp_path: Path) -> None:
    """`dev up` on a cluster whose service still runs on this machine's Postgres (started
    before the dev cluster had one of its own) keeps it there, tokens and migrations
    included, until `dev down && dev up`; a cluster with no service moves at once."""
    dev = DevCluster(tmp_path, slurm_prefix=None)
    said: list[str] = []
    assert database_in_use(dev, {}, said.append) == dev and not said
    old = "postgresql+psycopg://postgres@127.0.0.1:5432/runyard"
    proc = spawn(
        "service",
        [sys.executable, "-c", "import time; time.sleep(600)"],
        tmp_path / "service.out",
        env={**os.environ, "RUNYARD_DATABASE_URL": old},
    )
    try:
        wait_for("the stand-in service", lambda: is_alive(proc))
        kept = database_in_use(dev, {"service": proc}, said.append)
        assert kept.database_url == old and kept.state_dir == dev.state_dir
        assert "runyard dev down && runyard dev up" in said[0]
        same = spawn(
            "service:2",
            [sys.executable, "-c", "import time; time.sleep(600)"],
            tmp_path / "service-2.out",
            env={**os.environ, "RUNYARD_DATABASE_URL": dev.database_url},
        )
        try:
            assert database_in_use(dev, {"service:2": same}, said.append) == dev
        finally:
            stop(same)
    finally:
        stop(proc)
