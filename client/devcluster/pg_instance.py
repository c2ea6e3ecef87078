"""The dev cluster's own Postgres server, as it runs its own MariaDB for slurmdbd.

The service's database used to live on this machine's Postgres (Debian's cluster on 5432),
which trusts every role over 127.0.0.1: any local user, a job of alice's included, could
connect as `postgres` and rewrite whom runs run as (issue 38, finding 8). This server is
the dev cluster's alone:

- it runs as the service's Unix user (`runyard`), its data, socket and password file in a
  folder only that user may enter. Not as `postgres`: a superuser of the system's trusting
  server can run programs as `postgres` (COPY ... TO PROGRAM), so any local user could then
  read this server's files or use its socket;
- it listens on 127.0.0.1 only, where every role needs its password (SCRAM); the instance's
  superuser is reachable only by its owner, over that private socket (peer);
- the service connects as a role of its own (no superuser) whose random password, made at
  the first `runyard dev up`, sits in a libpq password file (mode 0600, the owner's). The
  database URL names that file (`?passfile=`), so the URL itself holds no secret.

`ensure` is idempotent: it initialises once, adopts a server that already runs, starts
one otherwise, and makes the role and database exist with the file's password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import pwd
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from client.devcluster import postgres
from client.devcluster.errors import DevClusterError
from client.devcluster.processes import (
    Started,
    cmdline_of,
    is_alive,
    listening_sockets,
    running,
    spawn,
    stop,
)

# 5432 + 10000, below Linux's ephemeral ports (32768-60999) and clear of the dev cluster's
# others (MariaDB 16306, slurmctld 16817, slurmdbd 16819, slurmd 17001-18280); a cluster on
# a Slurm prefix adds its offset of 1000 (16432), clear of that one's ports too.
DEV_PORT = 15432
SUPERUSER = "postgres"  # the instance's bootstrap superuser: only its owner, over the socket
POSTGRES_LIB = Path("/usr/lib/postgresql")  # Debian's server binaries, one folder a version
SCRAM_ITERATIONS = 4096  # Postgres' own default (scram_iterations, RFC 7677's minimum)
PROCESS_NAME = "postgres"  # its key in the dev cluster's process table
STOP_TIMEOUT_S = 60.0  # a fast shutdown ends with a checkpoint: seconds on a busy disk

OWNER_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}  # all the server and its tools need

Wait = Callable[[str, Callable[[], bool], float], object]


@dataclass(frozen=True)
class Instance:
    """One Postgres server of the dev cluster's own and the service's database on it."""

    root: Path  # the owner's folder, mode 0700: data/, socket/, the password file
    port: int
    owner: str  # the Unix user the server runs as (and the only one reaching its superuser)
    database: str
    role: str  # the service's role: owns `database`, no superuser, password only
    log: Path  # the server's stderr (its log)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        """Where the server's Unix socket lives; only the owner may enter."""
        return self.root / "socket"

    @property
    def passfile(self) -> Path:
        """The service role's password, as a libpq password file (mode 0600, the owner's)."""
        return self.root / "service.pgpass"

    @property
    def url(self) -> str:
        """The service's SQLAlchemy URL: host, port, role and database, and where the
        password is (libpq reads it; the URL can be shown, logged or put in a process's
        environment without giving it away)."""
        return (
            f"postgresql+psycopg://{self.role}@127.0.0.1:{self.port}/{self.database}"
            f"?passfile={self.passfile}"
        )


def hba_conf() -> str:
    """pg_hba.conf: the owner's peer login as the superuser over the private socket, and
    a password (SCRAM) for everyone over 127.0.0.1. Nothing else gets in."""
    return (
        "# The dev cluster's own Postgres (client/devcluster/pg_instance.py); rewritten by\n"
        "# every `runyard dev up`. No trust anywhere, peer only for the instance's owner.\n"
        "# TYPE  DATABASE  USER        ADDRESS        METHOD\n"
        f"local   all       {SUPERUSER:<11} {'':<14} peer map=owner\n"
        "host    all       all         127.0.0.1/32   scram-sha-256\n"
    )


def ident_conf(instance: Instance) -> str:
    """pg_ident.conf: the owner's Unix login maps to the superuser, and nobody else's does."""
    return f"# MAPNAME  SYSTEM-USERNAME  PG-USERNAME\nowner  {instance.owner}  {SUPERUSER}\n"


def scram_verifier(password: str, salt: bytes | None = None) -> str:
    """The SCRAM-SHA-256 verifier Postgres stores for `password` (RFC 5802, 7677), made
    here so the password itself never reaches the server, its log or psql's input."""
    salt = salt or secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, SCRAM_ITERATIONS)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    return f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def bin_dir(instance: Instance) -> Path:
    """The server binaries for the instance's data: the version that made it, or the
    newest one installed for a new instance (installing Postgres if none is)."""
    made_by = instance.data_dir / "PG_VERSION"
    if made_by.exists():
        version = made_by.read_text().strip()
        found = POSTGRES_LIB / version / "bin"
        if not (found / "postgres").exists():
            raise DevClusterError(
                f"the dev cluster's Postgres in {instance.data_dir} is version {version}, "
                f"whose server is not installed: apt-get install postgresql-{version}, or "
                f"`runyard dev down` and remove {instance.root} for a new, empty database"
            )
        return found
    if not list(POSTGRES_LIB.glob("*/bin/initdb")):
        postgres.ensure_installed()
    versions = sorted(
        (p.parent.parent.name for p in POSTGRES_LIB.glob("*/bin/initdb")),
        key=lambda v: [int(part) for part in v.split(".") if part.isdigit()],
    )
    if not versions:
        raise DevClusterError(f"no Postgres under {POSTGRES_LIB}: apt-get install postgresql")
    return POSTGRES_LIB / versions[-1] / "bin"


def _as_owner(
    instance: Instance, argv: list[str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `argv` as the instance's owner (its uid and group, no other groups), with a
    minimal environment: nothing of ours (PGPASSWORD, a root's HOME) leaks in."""
    entry = pwd.getpwnam(instance.owner)
    return subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        user=entry.pw_uid,
        group=entry.pw_gid,
        extra_groups=[],
        env={**OWNER_ENV, "HOME": str(instance.root)},
        cwd=instance.root,
        timeout=120,
    )


def _owned(path: Path, owner: str, mode: int) -> None:
    entry = pwd.getpwnam(owner)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(mode)


def _write_owned(path: Path, text: str, owner: str) -> bool:
    """Write `path` (mode 0600, the owner's) unless it already says `text`; True if written.
    Written beside and renamed, so a reader never sees half of it."""
    if path.exists() and path.read_text() == text:
        return False
    draft = path.with_name(path.name + ".new")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    _owned(draft, owner, 0o600)
    os.replace(draft, path)
    return True


def _prepare(instance: Instance, bins: Path) -> None:
    """The owner's folders and, the first time, the data folder (initdb)."""
    for folder in (instance.root, instance.socket_dir):
        folder.mkdir(parents=True, exist_ok=True)
        _owned(folder, instance.owner, 0o700)
    if (instance.data_dir / "PG_VERSION").exists():
        return
    done = _as_owner(
        instance,
        [
            str(bins / "initdb"),
            f"--pgdata={instance.data_dir}",
            f"--username={SUPERUSER}",
            "--auth-local=peer",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        ],
    )
    if done.returncode != 0:
        raise DevClusterError(f"initdb failed in {instance.data_dir}: {done.stderr.strip()}")


def password(instance: Instance) -> str:
    """The service role's password from its file, made (random, 256 bits) if missing."""
    if instance.passfile.exists():
        return instance.passfile.read_text().strip().rsplit(":", 1)[-1]
    made = secrets.token_urlsafe(32)  # letters, digits, - and _: nothing libpq escapes
    # Any database of the server (`*`): the role reaches only what its grants allow, and a
    # site's install step asks the maintenance database whether its own exists yet.
    line = f"127.0.0.1:{instance.port}:*:{instance.role}:{made}\n"
    _write_owned(instance.passfile, line, instance.owner)
    return made


def server_argv(instance: Instance, bins: Path) -> list[str]:
    """The server in the foreground (its PID is the one recorded); these settings on the
    command line win over anything in postgresql.conf or ALTER SYSTEM."""
    return [
        str(bins / "postgres"),
        "-D",
        str(instance.data_dir),
        "-c",
        "listen_addresses=127.0.0.1",
        "-c",
        f"port={instance.port}",
        "-c",
        f"unix_socket_directories={instance.socket_dir}",
        "-c",
        "unix_socket_permissions=0700",
        "-c",
        "password_encryption=scram-sha-256",
    ]


def running_server(instance: Instance) -> int | None:
    """The PID of a server that runs on this instance's data (its postmaster.pid), if any:
    a `dev up` whose process table was lost adopts it."""
    try:
        pid = int((instance.data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    argv = cmdline_of(pid)
    ours = bool(argv) and Path(argv[0]).name == "postgres" and str(instance.data_dir) in argv
    return pid if running(pid) and ours else None


def _ready(instance: Instance, bins: Path) -> Callable[[], bool]:
    """pg_isready over TCP: the server accepts connections (it asks for no password)."""
    argv = [str(bins / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(instance.port)]
    return lambda: subprocess.run(argv, capture_output=True, timeout=10).returncode == 0


def _start(
    instance: Instance, bins: Path, table: dict[str, Started], wait: Wait, hba_changed: bool
) -> None:
    """Adopt the server that runs (recorded or not), else start one, then wait for it."""
    pid = running_server(instance)
    recorded = table.get(PROCESS_NAME)
    if pid is not None and (recorded is None or recorded.pid != pid):
        table[PROCESS_NAME] = Started(PROCESS_NAME, pid, PROCESS_NAME, str(instance.log))
    if pid is not None:
        if hba_changed:
            os.kill(pid, signal.SIGHUP)  # the server reads pg_hba.conf again on SIGHUP
    elif listening_sockets(instance.port):
        raise DevClusterError(
            f"port {instance.port} already serves something that is not the dev cluster's "
            f"Postgres ({instance.data_dir}); stop it first"
        )
    else:
        table[PROCESS_NAME] = spawn(
            PROCESS_NAME,
            server_argv(instance, bins),
            instance.log,
            env=OWNER_ENV,  # nothing of `dev up`'s own environment
            user=instance.owner,
        )
    wait(f"Postgres on 127.0.0.1:{instance.port}", _ready(instance, bins), 60)


def _bootstrap_sql(instance: Instance, verifier: str) -> str:
    """The role (password: the verifier) and its database, made if missing; run by psql,
    whose :'name' and :"name" quote each value as a literal and an identifier."""
    return (
        f"\\set role '{instance.role}'\n"
        f"\\set db '{instance.database}'\n"
        f"\\set verifier '{verifier}'\n"
        "SELECT format('CREATE ROLE %I', :'role')\n"
        "  WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') \\gexec\n"
        'ALTER ROLE :"role" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION\n'
        "  PASSWORD :'verifier';\n"
        "SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'role')\n"
        "  WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db') \\gexec\n"
        # Only the service's role may connect to its database (no other role exists today;
        # one added later gets nothing by default).
        'REVOKE ALL ON DATABASE :"db" FROM PUBLIC;\n'
    )


def _bootstrap(instance: Instance, bins: Path) -> None:
    """As the owner, over the private socket: the service's role and database."""
    sql = _bootstrap_sql(instance, scram_verifier(password(instance)))
    argv = [str(bins / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1"]
    argv += ["-h", str(instance.socket_dir), "-p", str(instance.port)]
    argv += ["-U", SUPERUSER, "-d", "postgres"]
    done = _as_owner(instance, argv, stdin=sql)
    if done.returncode != 0:
        raise DevClusterError(
            f"could not make the role {instance.role} and database {instance.database} in "
            f"the dev cluster's Postgres: {done.stderr.strip()} (log: {instance.log})"
        )


def ensure(instance: Instance, table: dict[str, Started], wait: Wait) -> None:
    """The instance initialised, configured, running (recorded in `table` under
    "postgres"), and the service's role and database in it with the file's password."""
    bins = bin_dir(instance)
    _prepare(instance, bins)
    hba_changed = _write_owned(instance.data_dir / "pg_hba.conf", hba_conf(), instance.owner)
    hba_changed |= _write_owned(
        instance.data_dir / "pg_ident.conf", ident_conf(instance), instance.owner
    )
    instance.log.parent.mkdir(parents=True, exist_ok=True)
    _start(instance, bins, table, wait, hba_changed)
    _bootstrap(instance, bins)


def shut_down(proc: Started) -> bool:
    """Stop the server with a fast shutdown (SIGINT: clients disconnected, a checkpoint,
    a clean exit), waiting for it; True if it was running. Not the process group's SIGTERM
    other daemons get: that is Postgres' smart shutdown, which waits for every client, and
    its backends are not in its group (each calls setsid), so a client still connected
    held it until the SIGKILL, and the next start had to recover."""
    if not is_alive(proc):
        return False
    os.kill(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while is_alive(proc):
        if time.monotonic() > deadline:
            return stop(proc)  # SIGTERM, then SIGKILL: the next start recovers from WAL
        time.sleep(0.1)
    return True
