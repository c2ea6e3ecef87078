"""Whether anyone on this host reaches the service's database without a password.

Whoever connects as the service's role (or as `postgres`) can rewrite the links between
runyard's users and Unix users and the tokens, and so run as anyone (issue 38, finding 8).
A role's password does not help while pg_hba.conf trusts the connection, so the doctor
does what an attacker would: it connects, with no password and no password file, as this
process's user and, when it runs as root, as another local user too (`nobody`: peer and
ident logins depend on who asks), with the service's role and with `postgres`. Any
connection that gets in fails the check.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from dataclasses import dataclass

from sqlalchemy.engine import URL, make_url

from client.doctor.result import Area, Check, Status, failed, passed

PG = Area.POSTGRES
NAME = "local users refused"
OTHER_LOCAL_USERS = ("nobody",)  # on every Linux; stands for any user with a login here
SUPERUSER_ROLES = ("postgres",)  # the role every Postgres is made with, a superuser
PROBE_TIMEOUT_S = 30
# Connects as each role given, with an empty password and a password file that does not
# exist, so neither PGPASSWORD nor ~/.pgpass can supply one; prints the roles let in. Runs
# under the doctor's own interpreter, isolated (-I), with an environment of nothing but
# PATH, as the user it tries.
PROBE = """
import json, sys
import psycopg
conninfo, roles = sys.argv[1], sys.argv[2:]
let_in = []
for role in roles:
    try:
        psycopg.connect(
            conninfo, user=role, password="", passfile="/nonexistent", connect_timeout=5
        ).close()
    except psycopg.Error:
        continue
    let_in.append(role)
print(json.dumps(let_in))
"""


@dataclass(frozen=True)
class Attempt:
    """What one local user got: the roles it was let in as, or why it could not try."""

    user: str
    let_in: tuple[str, ...] = ()
    error: str = ""


def bare_conninfo(url: URL) -> str:
    """libpq's URI for the database at `url`, without anything that supplies a password
    (the password and a `passfile` the URL names)."""
    query = {k: v for k, v in url.query.items() if k != "passfile"}
    bare = url.set(drivername="postgresql", password=None, query=query)
    return bare.render_as_string(hide_password=False)


def attempt(conninfo: str, roles: list[str], user: str | None = None) -> Attempt:
    """Try `roles` at `conninfo` with no password, as `user` (None: as this process's)."""
    entry = pwd.getpwnam(user) if user is not None else pwd.getpwuid(os.getuid())
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", PROBE, conninfo, *roles],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            timeout=PROBE_TIMEOUT_S,
            user=entry.pw_uid if user is not None else None,
            group=entry.pw_gid if user is not None else None,
            extra_groups=[] if user is not None else None,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Attempt(entry.pw_name, error=str(exc))
    try:
        return Attempt(entry.pw_name, tuple(json.loads(done.stdout.strip().splitlines()[-1])))
    except (ValueError, IndexError):
        said = " ".join(done.stderr.split())[-200:]
        return Attempt(entry.pw_name, error=said or f"exit {done.returncode}")


def local_users(others: tuple[str, ...] = OTHER_LOCAL_USERS) -> list[str | None]:
    """This process's user (None), and the other local users when the doctor is root."""
    if os.geteuid() != 0:
        return [None]
    present = []
    for name in others:
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        present.append(name)
    return [None, *present]


def check_local_users_refused(
    database_url: str, others: tuple[str, ...] = OTHER_LOCAL_USERS
) -> Check:
    """FAIL when a local user gets into the service's database without a password."""
    url = make_url(database_url)
    where = f"{url.host or 'its socket'}:{url.port or 5432}/{url.database}"
    roles = sorted({url.username or "postgres", *SUPERUSER_ROLES})
    conninfo = bare_conninfo(url)
    attempts = [attempt(conninfo, roles, user) for user in local_users(others)]
    got_in = [f"{a.user} as {', '.join(a.let_in)}" for a in attempts if a.let_in]
    if got_in:
        return failed(
            PG,
            NAME,
            f"{where} let {'; '.join(got_in)} in without a password: they can change whom "
            "every run runs as",
            "give the service's role a password and make every pg_hba.conf line for it and "
            "postgres scram-sha-256, none trust (docs/install.md); on the dev cluster: "
            "`runyard dev down && runyard dev up` (its own Postgres)",
        )
    tried = ", ".join(a.user for a in attempts if not a.error)
    untried = [f"{a.user} ({a.error})" for a in attempts if a.error]
    if untried:
        return Check(
            PG,
            NAME,
            Status.WARN,
            f"could not try as {'; '.join(untried)}"
            + (f"; {tried} refused as {', '.join(roles)}" if tried else ""),
            "run `runyard doctor` as root from the service's virtualenv",
        )
    return passed(PG, NAME, f"{tried} refused as {', '.join(roles)} without a password")
