"""Who is who on the dev cluster, as on a site (docs/install.md, "Who a run runs as").

- `runyard`: the service's own unprivileged user. A Slurm administrator (AdminLevel: drains
  need it; reservations and scancel an operator's rights), and allowed by one sudoers rule
  to run `service.identity.as_owner`, and nothing else, as the members of `runyard-users`.
- `alice` (team and Slurm account `vision`) and `bob` (`speech`): two users in two teams,
  members of `runyard-users`, each charged to their team's account. `ops` (account `ops`)
  is the dev admin's own login: the runs an admin submits run as `ops`.
- The roots that jobs write into (jobs/, checkpoints/, data/) hold one folder per user,
  made here as a site's admin makes them (the user's, mode 0750: their team reads); each
  run's folders are made inside by its owner. The service's own files live in service/,
  which only it can read.
Everything here is idempotent: `runyard dev up` runs it every time.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVICE_USER = "runyard"
RUNAS_GROUP = "runyard-users"  # whom the service may act as (the sudoers rule's Runas list)
SUDOERS_FILE = Path("/etc/sudoers.d/runyard-dev")
SHARED_ROOTS = ("jobs", "checkpoints", "data")  # one folder per user under each


@dataclass(frozen=True)
class DevUser:
    """A Unix user of the dev cluster and the team (group, Slurm account) it belongs to."""

    name: str
    team: str


DEV_USERS = (DevUser("alice", "vision"), DevUser("bob", "speech"), DevUser("ops", "ops"))
ADMIN_UNIX_USER = "ops"


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def ensure_users() -> None:
    """The service's user, the runas group and the dev users with their teams' groups."""
    for group in (RUNAS_GROUP, *{u.team for u in DEV_USERS}):
        if not _group_exists(group):
            _run(["groupadd", group]).check_returncode()
    if not _user_exists(SERVICE_USER):
        _run(
            ["useradd", "--system", "--user-group", "--create-home", "--shell", "/bin/sh",
             SERVICE_USER]
        ).check_returncode()  # fmt: skip
    for user in DEV_USERS:
        if not _user_exists(user.name):
            _run(
                ["useradd", "--create-home", "--shell", "/bin/bash", "--gid", user.team,
                 "--groups", RUNAS_GROUP, user.name]
            ).check_returncode()  # fmt: skip


def sudoers_rule(python: str) -> str:
    """The one rule that lets the service act as its users: this program, these users."""
    return (
        "# runyard dev cluster (client/devcluster/identity.py): the service runs one program,\n"
        "# with a JSON request on stdin, as the members of runyard-users; nothing else.\n"
        f"{SERVICE_USER} ALL=(%{RUNAS_GROUP}) NOPASSWD: {python} -I -m service.identity.as_owner\n"
    )


def ensure_sudoers(python: str) -> None:
    """Install the rule (checked by visudo first: a broken file would lock sudo out)."""
    if shutil.which("sudo") is None:
        raise RuntimeError("sudo is not installed: apt-get install sudo (scripts/bootstrap.sh)")
    text = sudoers_rule(python)
    if SUDOERS_FILE.exists() and SUDOERS_FILE.read_text() == text:
        return
    draft = SUDOERS_FILE.with_suffix(".new")
    draft.write_text(text)
    draft.chmod(0o440)
    checked = _run(["visudo", "-c", "-f", str(draft)])
    if checked.returncode != 0:
        draft.unlink()
        raise RuntimeError(f"the sudoers rule does not parse: {checked.stdout}{checked.stderr}")
    draft.rename(SUDOERS_FILE)


def ensure_slurm_accounts(env: dict[str, str], cluster: str | None = None) -> None:
    """Accounts for the teams, their users in them, and the service a Slurm administrator:
    slurmctld lets only root, SlurmUser and AdminLevel=Administrator update a node (drain,
    resume); an operator may manage reservations and cancel jobs, not drain. Neither level
    may start a step in another user's job or run anything as anyone. sacctmgr refuses what
    exists already: that is fine. With `cluster`, the associations on that cluster only (a
    further cluster of `dev up --clusters`, registered after the first's were made)."""
    on = [f"cluster={cluster}"] if cluster else []
    teams = sorted({u.team for u in DEV_USERS})
    _run(["sacctmgr", "-i", "add", "account", ",".join(teams), *on], env)
    for user in DEV_USERS:
        _run(["sacctmgr", "-i", "add", "user", user.name, f"account={user.team}", *on], env)
    _run(["sacctmgr", "-i", "add", "user", SERVICE_USER, "account=ops", *on], env)
    _run(["sacctmgr", "-i", "modify", "user", SERVICE_USER, "set", "adminlevel=admin"], env)


def prepare_state_dir(state_dir: Path) -> None:
    """The roots jobs write into, with a folder of each user's own under each (made here,
    by root, as a site's admin makes them: nobody can make another's first), and the
    service's own folder."""
    for name in SHARED_ROOTS:
        root = state_dir / name
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)
        for user in DEV_USERS:
            owned_folder(root / user.name, user.name)
    own = state_dir / "service"
    own.mkdir(parents=True, exist_ok=True)
    entry = pwd.getpwnam(SERVICE_USER)
    os.chown(own, entry.pw_uid, entry.pw_gid)
    own.chmod(0o700)


def owned_folder(path: Path, user: str) -> None:
    """`path` as `user`'s, readable by their primary group (their team), nobody else's."""
    path.mkdir(exist_ok=True)
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    path.chmod(0o750)


def reachable_python(python: str) -> list[Path]:
    """Make the interpreter the users run reachable by them: every folder above it gets
    the search bit (o+x, never read), as a site's Python on a shared filesystem has. A
    pyenv under /root (mode 0700) is the usual case on a fresh machine. Returns the
    folders changed, for `dev up` to say."""
    changed = []
    for folder in reversed(Path(os.path.realpath(python)).parents):
        mode = folder.stat().st_mode
        if not mode & 0o001:
            folder.chmod(mode | 0o001)
            changed.append(folder)
    return changed


def ensure(state_dir: Path, python: str, slurm_env: dict[str, str], accounting: bool) -> list[Path]:
    """Everything above, for `runyard dev up`; the folders made searchable for the users."""
    opened = reachable_python(python)
    ensure_users()
    ensure_sudoers(python)
    if accounting:
        ensure_slurm_accounts(slurm_env)
    prepare_state_dir(state_dir)
    return opened
