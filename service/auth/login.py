"""`runyard login`: a person who already is someone on the cluster gets a token as themself.

The CLI makes a MUNGE credential on a host of the cluster (it proves the caller's uid, as it
does to Slurm) and posts it; the service decodes it (munge.py), maps the uid to the Unix
login on its own host (a site keeps uids the same on every host), and answers with a `user`
token that expires (login_token_ttl_s), for the runyard user linked to that login. A person
of the owner group not linked yet is linked on their first login, to the Slurm account
accounting names as theirs (DefaultAccount), as `runyard admin user link` would. Nobody
hands out a long-lived secret, and the people who may log in are those the service may act
as: never root, never a system account.
"""

from __future__ import annotations

import pwd
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy.orm import Session

from service.auth.munge import MungeProof, decode
from service.auth.principal import Principal
from service.auth.service import audit, create_token, team_of
from service.config import Settings
from service.errors import AppError
from service.identity.service import in_group, link_at_login, link_of, links_to
from service.models import ApiToken, Role, TokenOrigin, UserLink
from service.models.base import utcnow

# A login's default Slurm account (service/slurm/accounts.py: sacctmgr); None: accounting
# has no such user. Handed in, so the endpoint decides where it comes from.
DefaultAccount = Callable[[str], str | None]


class LoginRefusal(StrEnum):
    """Why a proven uid gets no token. The values are the API's error codes' tails."""

    ROOT = "root"  # uid 0: the cluster itself, never a person's runs
    SYSTEM_ACCOUNT = "system_account"  # below login_min_uid: a daemon's, the service's own
    UNKNOWN_UID = "unknown_uid"  # no login with that uid on the service's host
    NOT_IN_OWNER_GROUP = "not_in_owner_group"  # the service may not act as them
    NO_SLURM_ACCOUNT = "no_slurm_account"  # first login, and accounting names no account
    NAME_TAKEN = "name_taken"  # first login, but a runyard user of that name is another's
    AMBIGUOUS_LINK = "ambiguous_link"  # several runyard users run as this login
    NO_TEAM = "no_team"  # linked, but nothing says which team their runs belong to


class LoginRefused(AppError):
    """A valid credential whose owner may not log in: 403, a code per reason
    (`login_not_in_owner_group`), and what would let them."""

    status_code = 403

    def __init__(self, reason: LoginRefusal, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.code = f"login_{reason.value}"


@dataclass(frozen=True)
class Login:
    """What a login produced: the token (its secret shown once) and whom it is for."""

    token: ApiToken
    secret: str
    link: UserLink
    linked_now: bool  # this login made the link
    expires_at: datetime


def log_in(
    session: Session, credential: str, settings: Settings, default_account: DefaultAccount
) -> Login:
    """A `user` token for whoever made `credential`; CredentialRefused or LoginRefused if
    it proves no one who may log in."""
    proof = decode(credential, settings.login_credential_max_age_s)  # before any SQL
    login = login_of(proof, settings)
    link, linked_now = link_of_login(session, login, default_account)
    team = team_of(session, link.user) or link.slurm_account
    if team is None:
        raise LoginRefused(
            LoginRefusal.NO_TEAM,
            f"runyard user {link.user} (Unix user {login}) has no team: an admin names it "
            f"with `runyard admin user link {link.user} --unix {login} --account <account>`",
        )
    expires_at = utcnow() + timedelta(seconds=settings.login_token_ttl_s)
    token, secret = create_token(
        session,
        user=link.user,
        team=team,
        role=Role.USER,
        expires_at=expires_at,
        origin=TokenOrigin.LOGIN,
    )
    actor = Principal(token_id=token.id, user=link.user, team=team, role=Role.USER)
    if linked_now:
        detail = {"unix_user": login, "slurm_account": link.slurm_account, "by": "login"}
        audit(session, actor, "user.link", link.user, detail)
    audit(
        session,
        actor,
        "token.login",
        f"token {token.id}",
        {"unix_user": login, "uid": proof.uid, "encode_host": proof.encode_host},
    )
    return Login(token, secret, link, linked_now, expires_at)


def login_of(proof: MungeProof, settings: Settings) -> str:
    """The Unix login the proven uid is on the service's host, if it may log in."""
    if proof.uid == 0:
        raise LoginRefused(
            LoginRefusal.ROOT, "root never logs in to runyard: log in as yourself, not with sudo"
        )
    if proof.uid < settings.login_min_uid:
        raise LoginRefused(
            LoginRefusal.SYSTEM_ACCOUNT,
            f"uid {proof.uid} is a system account's (below RUNYARD_LOGIN_MIN_UID "
            f"{settings.login_min_uid}), not a person's: log in as yourself",
        )
    try:
        login = pwd.getpwuid(proof.uid).pw_name
    except KeyError:
        raise LoginRefused(
            LoginRefusal.UNKNOWN_UID,
            f"no login has uid {proof.uid} on the service's host: a site keeps every "
            "person's uid the same on every host (ask the site's admins)",
        ) from None
    if not in_group(login, settings.owner_group):
        raise LoginRefused(
            LoginRefusal.NOT_IN_OWNER_GROUP,
            f"{login} is not in {settings.owner_group}, the group of the people runyard "
            f"runs jobs as: an admin adds you (`usermod -aG {settings.owner_group} {login}`)",
        )
    return login


def link_of_login(
    session: Session, login: str, default_account: DefaultAccount
) -> tuple[UserLink, bool]:
    """The runyard user whose runs run as `login`, linked now if there is none yet (and
    whether it was)."""
    links = links_to(session, login)
    if links:
        return one_link(links, login), False
    taken = link_of(session, login)
    if taken is not None:
        raise name_taken(taken, login)
    session.rollback()  # no transaction stays open across sacctmgr
    account = default_account(login)
    if account is None:
        raise LoginRefused(
            LoginRefusal.NO_SLURM_ACCOUNT,
            f"Slurm accounting names no default account for {login}: an admin adds you to "
            f"one (`sacctmgr add user {login} account=<account>`) or links you "
            f"(`runyard admin user link {login} --unix {login} --account <account>`)",
        )
    # Another login of the same person may have linked it meanwhile.
    raced = link_of(session, login)
    if raced is not None:
        if raced.unix_user != login:
            raise name_taken(raced, login)
        return raced, False
    return link_at_login(session, login, account), True


def name_taken(taken: UserLink, login: str) -> LoginRefused:
    return LoginRefused(
        LoginRefusal.NAME_TAKEN,
        f"runyard user {login} runs as Unix user {taken.unix_user}, not as you: an admin "
        f"links you under another name (`runyard admin user link <name> --unix {login}`)",
    )


def one_link(links: list[UserLink], login: str) -> UserLink:
    """The link a login gets among those to it: the runyard user of the same name, or
    the only one."""
    same_name = [link for link in links if link.user == login]
    if same_name or len(links) == 1:
        return (same_name or links)[0]
    names = ", ".join(link.user for link in links)
    raise LoginRefused(
        LoginRefusal.AMBIGUOUS_LINK,
        f"several runyard users run as {login} ({names}): an admin unlinks all but yours "
        "(`runyard admin user unlink <name>`)",
    )
