"""Which Unix user and Slurm account each runyard user runs as: linking (admins, or a
person's first `runyard login`), and the owner a run gets at submission.

An admin links a user once (`runyard admin user link ana --unix ana --account vision`); the
account defaults to the user's team. A run records the identity it was accepted with
(`runs.unix_user`, `runs.slurm_account`), so a later re-link changes new runs only. The
links' few queries are here too: they are all the SQL identity has.
"""

from __future__ import annotations

import grp
import os
import pwd
from pathlib import Path
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from contract.unix_groups import group_members
from service.config import Settings, get_settings
from service.errors import AppError, InvalidSpec, NotFound
from service.models import Run, Sweep, UserLink
from service.slurm.owner import RunOwner

# Unix and Slurm names: what useradd and sacctmgr accept, and nothing a shell would expand.
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_-.")


class Caller(Protocol):
    """Who asks: service/auth's Principal, of which identity needs the name and the team
    only (auth builds on identity: its bootstrap links users, so identity imports no auth)."""

    @property
    def user(self) -> str: ...

    @property
    def team(self) -> str: ...


class OwnerUnavailable(AppError):
    """The service could not act as the run's owner (sudo refused, no such user here): a
    site's setup to fix, not the spec."""

    status_code = 409
    code = "cannot_act_as_owner"


class NotLinked(AppError):
    """The caller has no Unix identity: nothing of theirs may run."""

    status_code = 403
    code = "not_linked"


def link_of(session: Session, user: str) -> UserLink | None:
    return session.get(UserLink, user)


def list_links(session: Session) -> list[UserLink]:
    return list(session.scalars(select(UserLink).order_by(UserLink.user)))


def links_to(session: Session, unix_user: str) -> list[UserLink]:
    """The runyard users whose runs run as `unix_user`."""
    stmt = select(UserLink).where(UserLink.unix_user == unix_user).order_by(UserLink.user)
    return list(session.scalars(stmt))


def owner_for(session: Session, principal: Caller, settings: Settings, priority: str) -> RunOwner:
    """The identity a run submitted by `principal` runs as; NotLinked if there is none."""
    link = link_of(session, principal.user)
    if link is None:
        raise NotLinked(
            f"user {principal.user} has no Unix user to run jobs as: an admin links one with "
            f"`runyard admin user link {principal.user} --unix <login> --account <account>`"
        )
    return RunOwner(
        unix_user=link.unix_user,
        slurm_account=link.slurm_account or principal.team,
        qos=settings.qos_by_priority.get(priority),
    )


def owner_of(run: Run | Sweep, settings: Settings | None = None) -> RunOwner:
    """The identity a run (or a sweep's array) was accepted with; its QoS from `settings`
    (what a submission needs; a step inside a running job does not)."""
    priority = run.priority if isinstance(run, Run) else str(run.spec.get("priority", ""))
    return RunOwner(
        unix_user=run.unix_user,
        slurm_account=run.slurm_account,
        qos=settings.qos_by_priority.get(priority) if settings else None,
    )


def adopt_owner(session: Session, run: Run) -> None:
    """A run accepted before owners existed (empty columns) takes its user's link, if any."""
    if run.unix_user:
        return
    link = link_of(session, run.owner)
    if link is not None:
        run.unix_user, run.slurm_account = link.unix_user, link.slurm_account or run.team


def link_user(
    session: Session, user: str, unix_user: str, slurm_account: str | None, principal: Caller
) -> UserLink:
    """Link (or re-link) `user`; the Unix user must exist here and must not be privileged."""
    check_unix_user(unix_user, get_settings().owner_group)
    if slurm_account is not None:
        check_name("account", slurm_account)
    link = link_of(session, user)
    if link is None:
        link = UserLink(user=user, unix_user=unix_user, linked_by=principal.user)
        session.add(link)
    link.unix_user, link.slurm_account, link.linked_by = unix_user, slurm_account, principal.user
    session.flush()
    return link


def link_at_login(session: Session, login: str, slurm_account: str) -> UserLink:
    """Link the runyard user named `login` to that login, charged to `slurm_account`: what a
    person's first `runyard login` does (service/auth/login.py), with the checks an admin's
    link gets."""
    check_unix_user(login, get_settings().owner_group)
    check_name("account", slurm_account)
    link = UserLink(user=login, unix_user=login, slurm_account=slurm_account, linked_by="login")
    session.add(link)
    session.flush()
    return link


def unlink_user(session: Session, user: str) -> None:
    link = link_of(session, user)
    if link is None:
        raise NotFound(f"user {user} is not linked; `runyard admin user list` shows the links")
    session.delete(link)


def check_name(field: str, name: str) -> None:
    if not name or len(name) > 64 or not set(name) <= NAME_CHARS or name[0] in "-.":
        raise InvalidSpec(
            f"{field}: '{name}' is not a valid name (lower-case letters, digits, '_', '-', "
            "'.'; at most 64 characters, not starting with '-' or '.')"
        )


def check_unix_user(unix_user: str, owner_group: str) -> None:
    """The login exists here, is a person's (not a system account: root, the service's own
    user, SlurmUser, munge all sit below UID_MIN) and is in the group the service may act
    as: running a team's code as anything else would give it the cluster or the service."""
    check_name("unix", unix_user)
    try:
        entry = pwd.getpwnam(unix_user)
    except KeyError:
        raise InvalidSpec(
            f"unix: no Unix user {unix_user} on the service's host; create it (with the same "
            "uid as on the compute nodes) first"
        ) from None
    if entry.pw_uid == 0:
        raise InvalidSpec("unix: runs never run as root; link the user to their own login")
    first_uid = first_user_uid()
    if entry.pw_uid < first_uid or entry.pw_uid == os.geteuid():
        raise InvalidSpec(
            f"unix: {unix_user} (uid {entry.pw_uid}) is a system account, not a person's "
            f"login (below UID_MIN {first_uid}); link the user to their own login"
        )
    if not in_group(unix_user, owner_group):
        raise InvalidSpec(
            f"unix: {unix_user} is not in {owner_group}, the group the service may act as: "
            f"`usermod -aG {owner_group} {unix_user}` first (docs/install.md)"
        )


def first_user_uid(login_defs: Path = Path("/etc/login.defs")) -> int:
    """UID_MIN of /etc/login.defs (1000 where it does not say): the first person's uid."""
    try:
        for line in login_defs.read_text().splitlines():
            fields = line.split()
            if len(fields) == 2 and fields[0] == "UID_MIN" and fields[1].isdigit():
                return int(fields[1])
    except OSError:
        pass
    return 1000


def in_group(unix_user: str, group: str) -> bool:
    """Whether `unix_user` is a member of `group`, as its primary group or a supplementary
    one."""
    try:
        return unix_user in group_members(group)
    except KeyError:
        return False


def primary_group(unix_user: str) -> str:
    """The user's primary group: who, besides them, reads their runs' files (mode 0750)."""
    return grp.getgrgid(pwd.getpwnam(unix_user).pw_gid).gr_name
