"""Tokens, teams and the audit log."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import Integer, Row, String, Table, bindparam, event, func, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from service.auth.cache import principals
from service.auth.principal import Principal
from service.auth.tokens import hash_token, new_token
from service.errors import NotFound
from service.models import (
    ApiToken,
    Attempt,
    AttemptState,
    AuditEntry,
    Role,
    Team,
    TokenOrigin,
)
from service.models.base import utcnow

_tokens = cast(Table, ApiToken.__table__)
_attempts = cast(Table, Attempt.__table__)
_TOKEN_COLUMNS = (
    "id token_hash user team role node_name node_cluster run_id attempt_id origin expires_at "
    "revoked_at "
    "last_used_at"
)
# Built once, Core columns and no ORM objects: they run for every group of tokens that the
# principal cache does not hold, one statement per group whatever its size.
_TOKENS_BY_HASH = select(*(_tokens.c[name] for name in _TOKEN_COLUMNS.split())).where(
    _tokens.c.token_hash == func.any(bindparam("token_hashes", type_=ARRAY(String)))
)
_TOUCH_TOKENS = (
    update(_tokens)
    .where(_tokens.c.id == func.any(bindparam("token_ids", type_=ARRAY(Integer))))
    .values(last_used_at=bindparam("now"))
)
_ATTEMPT_STATES = select(_attempts.c.id, _attempts.c.state).where(
    _attempts.c.id == func.any(bindparam("attempt_ids", type_=ARRAY(Integer)))
)


def tokens_by_hash(session: Session, token_hashes: list[str]) -> dict[str, Row[Any]]:
    """The tokens whose secrets hash to `token_hashes`, by hash (unknown ones are absent)."""
    rows = session.execute(_TOKENS_BY_HASH, {"token_hashes": token_hashes})
    return {row.token_hash: row for row in rows}


def touch_tokens(session: Session, token_ids: list[int], now: datetime) -> None:
    if token_ids:
        session.execute(_TOUCH_TOKENS, {"token_ids": token_ids, "now": now})


def attempt_states(session: Session, attempt_ids: list[int]) -> dict[int, AttemptState]:
    """The states of the attempts that exist among `attempt_ids`."""
    if not attempt_ids:
        return {}
    rows = session.execute(_ATTEMPT_STATES, {"attempt_ids": attempt_ids})
    return {row.id: AttemptState(row.state) for row in rows}


def revoked_since(session: Session, since: datetime) -> list[int]:
    """Ids of the tokens revoked at or after `since`."""
    stmt = select(ApiToken.id).where(ApiToken.revoked_at >= since)
    return list(session.scalars(stmt).all())


def ensure_team(session: Session, name: str) -> Team:
    team = session.get(Team, name)
    if team is None:
        team = Team(name=name, gpu_quota=None)
        session.add(team)
        session.flush()
    return team


def create_token(
    session: Session,
    *,
    user: str,
    team: str,
    role: Role,
    node_name: str | None = None,
    node_cluster: str | None = None,
    run_id: int | None = None,
    attempt_id: int | None = None,
    expires_at: datetime | None = None,
    origin: TokenOrigin = TokenOrigin.ADMIN,
) -> tuple[ApiToken, str]:
    """A new token row and the secret (returned once; only its hash is stored). `origin`
    says how it was made: an admin's unless the caller says otherwise."""
    ensure_team(session, team)
    secret = new_token()
    row = ApiToken(
        token_hash=hash_token(secret),
        prefix=secret[:10],
        user=user,
        team=team,
        role=role,
        node_name=node_name,
        node_cluster=node_cluster,
        run_id=run_id,
        attempt_id=attempt_id,
        expires_at=expires_at,
        origin=origin,
    )
    session.add(row)
    session.flush()
    return row, secret


def revoke_token(session: Session, token_id: int) -> ApiToken:
    row = session.get(ApiToken, token_id, with_for_update=True)
    if row is None:
        raise NotFound(f"no token with id {token_id}")
    row.revoked_at = row.revoked_at or utcnow()
    # Forgotten once the revocation is committed: forgetting earlier would let a request
    # still reading the unrevoked row cache it again.
    event.listen(session, "after_commit", lambda _: principals.forget_token(token_id), once=True)
    return row


def tokens_of(session: Session, user: str | None, limit: int) -> list[ApiToken]:
    """Tokens, newest first: `user`'s own, or everyone's (None); never a worker's (they
    die with their attempt, and nobody holds one to revoke)."""
    stmt = select(ApiToken).where(ApiToken.role != Role.WORKER)
    if user is not None:
        stmt = stmt.where(ApiToken.user == user)  # is_own, in SQL
    return list(session.scalars(stmt.order_by(ApiToken.id.desc()).limit(limit)))


def token(session: Session, token_id: int) -> ApiToken | None:
    return session.get(ApiToken, token_id)


def is_own(row: ApiToken, user: str) -> bool:
    """Whether `user` holds `row` as theirs to list and revoke (a worker token is the
    service's, whoever's run it serves)."""
    return row.user == user and row.role != Role.WORKER


def team_of(session: Session, user: str) -> str | None:
    """The team of `user`'s newest user-role token (an admin's or an earlier login's), if
    they ever had one: the team their runs belong to."""
    stmt = (
        select(ApiToken.team)
        .where(ApiToken.user == user, ApiToken.role == Role.USER)
        .order_by(ApiToken.id.desc())
        .limit(1)
    )
    return session.scalars(stmt).first()


def audit(
    session: Session,
    actor: Principal,
    action: str,
    target: str,
    detail: dict[str, Any] | None = None,
) -> None:
    session.add(
        AuditEntry(
            actor=actor.user,
            actor_team=actor.team,
            action=action,
            target=target,
            detail=detail or {},
        )
    )


def audit_entries(session: Session, after_id: int, limit: int) -> list[AuditEntry]:
    stmt = select(AuditEntry).where(AuditEntry.id > after_id).order_by(AuditEntry.id).limit(limit)
    return list(session.scalars(stmt).all())
