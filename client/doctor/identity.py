"""Who the service runs as and whom it can act as (docs/install.md, "Who a run runs as"):
never root, its secrets its own, no test fault hooks in a site service's environment, and
through the one sudoers rule, each linked user and nobody else. The doctor asks the service
who it is, then (when run as root, as the install steps are) runs the owner's program as
the service's user, the way the service does."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from client.api import ApiError, RunyardClient
from client.doctor.result import Area, Check, SiteSettings, Status, failed, passed, skipped
from contract.unix_groups import group_members

ID = Area.IDENTITY
OWNER_PROGRAM = ["-I", "-m", "service.identity.as_owner"]


def owner_python(settings: SiteSettings) -> str:
    """The interpreter the sudoers rule names: RUNYARD_OWNER_PYTHON, else the service's own
    environment's bin/python3 (the doctor runs from the same virtualenv)."""
    named = settings.extra.get("RUNYARD_OWNER_PYTHON")
    return named or str(Path(sys.prefix) / "bin" / "python3")


def act_as(service_user: str, owner: str, python: str) -> tuple[int | None, str]:
    """As `service_user`, run the owner's program as `owner` through sudo, as the service
    does: the uid it ran as, or None and what sudo or the program said."""
    argv = [shutil.which("sudo") or "sudo", "-n", "-u", owner, "--", python, *OWNER_PROGRAM]
    try:
        done = subprocess.run(
            argv,
            input=json.dumps({"op": "whoami", "args": {}}),
            capture_output=True,
            text=True,
            timeout=30,
            user=service_user,
            extra_groups=[],
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        return int(answer["result"]["uid"]), ""
    except (ValueError, IndexError, KeyError, TypeError):
        return None, " ".join(done.stderr.split())[-300:] or f"exit {done.returncode}"


def check_identity(settings: SiteSettings, client: RunyardClient | None = None) -> list[Check]:
    client = client or settings.client()
    try:
        me = client.service_identity()
        links = client.list_users()
    except ApiError as exc:
        why = f"cannot ask the service: {exc.message}"
        return [
            skipped(ID, "service user", why),
            skipped(ID, "acts as its users", why),
        ]
    checks = [_service_user(me), check_fault_hooks(me)]
    checks.append(_secrets(settings, me["unix_user"]))
    checks.append(check_owner_group(settings, me["unix_user"]))
    if os.geteuid() != 0:
        checks.append(
            Check(ID, "acts as its users", Status.WARN, "not checked: run the doctor as root")
        )
        return checks
    if me["is_root"]:
        checks.append(skipped(ID, "acts as its users", "the service runs as root"))
        return checks
    checks.append(_acts_as_its_users(settings, me["unix_user"], [u["unix_user"] for u in links]))
    return checks


def _service_user(me: dict[str, object]) -> Check:
    if me["is_root"]:
        return failed(
            ID,
            "service user",
            "the service runs as root: it could run any team's code, and a bug in it could "
            "do anything to the cluster",
            "run it as its own user: `User=runyard` in runyard.service (docs/install.md, "
            "steps 3 and 5)",
        )
    return passed(ID, "service user", f"{me['unix_user']} (uid {me['uid']}), not root")


def check_fault_hooks(me: dict[str, Any]) -> Check:
    """The tests' fault hooks (RUNYARD_FAULT*: a crash at step N, slowed steps, flipped
    values) reach jobs only from a service in dev mode (service/identity/gate.py). On a site
    one set in the service's environment is a mistake waiting for a restart in dev mode, or
    for a version that forwards it: fail it. In dev mode that is what the hooks are for."""
    if "environment" not in me:
        return skipped(ID, "fault hooks", "the service does not say: older than this doctor")
    hooks = ", ".join(me["fault_hooks"])
    if me["environment"] == "dev":
        if not hooks:
            return passed(ID, "fault hooks", "dev mode, no fault hooks set")
        return Check(
            ID,
            "fault hooks",
            Status.WARN,
            f"dev mode: {hooks} reach every job the service submits (crashes, slowed "
            "steps): for the dev cluster and the tests only",
            "where users run real jobs, remove RUNYARD_ENVIRONMENT=dev and the hooks from "
            "runyard.env and restart the service",
        )
    if hooks:
        return failed(
            ID,
            "fault hooks",
            f"{hooks} set in the environment of a site service: test hooks that crash or "
            "slow training (worker/faults.py); not handed to jobs outside dev mode",
            f"remove {hooks} from runyard.env (and the unit's Environment=), then restart "
            "the service",
        )
    return passed(ID, "fault hooks", "site mode: no fault hooks set, none handed to jobs")


def _secrets(settings: SiteSettings, service_user: str) -> Check:
    """The settings file holds the database URL: the service's alone."""
    path = settings.settings_file
    if path is None or not path.exists():
        return Check(ID, "secrets", Status.SKIP, "no settings file to check")
    found = path.stat()
    owner = pwd.getpwuid(found.st_uid).pw_name
    if found.st_mode & 0o077 or owner != service_user:
        return failed(
            ID,
            "secrets",
            f"{path} is {found.st_mode & 0o777:04o} and {owner}'s: others may read the "
            "database URL",
            f"chown {service_user} {path} && chmod 0600 {path}",
        )
    return passed(ID, "secrets", f"{path} readable by {service_user} only")


# Groups whose members may become root (Debian's sudo, Red Hat's wheel, Ubuntu's old admin).
ADMIN_GROUPS = ("sudo", "wheel", "admin")


def check_owner_group(settings: SiteSettings, service_user: str) -> Check:
    """The sudoers rule lets the service act as any member of the owner group: a member who
    may become root (or root, or the service itself) makes the service as strong as them.
    Linking refuses such users (service/identity/service.py); the group is the site's to
    keep clean, and this says who should not be in it."""
    name = settings.extra.get("RUNYARD_OWNER_GROUP") or "runyard-users"
    try:
        members = group_members(name)
    except KeyError:
        return failed(
            ID,
            "owner group",
            f"no group {name}: the sudoers rule's Runas list names it",
            f"groupadd {name}, then usermod -aG {name} for each user (docs/install.md step 3)",
        )
    admins: set[str] = set()
    for admin_group in ADMIN_GROUPS:
        try:
            admins |= set(grp.getgrnam(admin_group).gr_mem)
        except KeyError:
            continue
    privileged = sorted(m for m in members if m == service_user or m in admins or _uid(m) == 0)
    if privileged:
        return Check(
            ID,
            "owner group",
            Status.WARN,
            f"{name} holds {', '.join(privileged)}: the service may act as them, and they "
            "may become root or are the service itself",
            "; ".join(f"gpasswd -d {m} {name}" for m in privileged),
        )
    return passed(ID, "owner group", f"{name}: {len(members)} users, none privileged")


def _uid(user: str) -> int | None:
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def _acts_as_its_users(settings: SiteSettings, service_user: str, owners: list[str]) -> Check:
    python = owner_python(settings)
    uid, said = act_as(service_user, "root", python)
    if uid is not None:
        return failed(
            ID,
            "acts as its users",
            f"{service_user} may run the owner's program as root: a run could be root",
            "the sudoers rule's Runas list must be the group of runyard's users only, "
            "without root (docs/install.md step 3)",
        )
    broken = []
    for owner in sorted(set(owners)):
        uid, said = act_as(service_user, owner, python)
        if uid is None or uid != pwd.getpwnam(owner).pw_uid:
            broken.append(f"{owner}: {said or f'ran as uid {uid}'}")
    if broken:
        return failed(
            ID,
            "acts as its users",
            "; ".join(broken),
            "add the sudoers rule and put each linked user in the runyard-users group "
            f"(docs/install.md step 3): {service_user} ALL=(%runyard-users) NOPASSWD: "
            f"{python} {' '.join(OWNER_PROGRAM)}",
        )
    if not owners:
        return Check(ID, "acts as its users", Status.WARN, "no user is linked yet")
    return passed(ID, "acts as its users", f"as {', '.join(sorted(set(owners)))}; never as root")
