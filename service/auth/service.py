"""Tokens, teams and the audit log."""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from sqlalchemy import Row, Table, bindparam, event, select, update
from sqlalchemy.orm import Session

from service.auth.cache import principals
from service.auth.principal import Principal
from service.auth.tokens import hash_token, new_token
from service.errors import NotFound
from service.models import ApiToken, AuditEntry, Role, Team
from service.models.base import utcnow

_tokens = cast(Table, ApiToken.__table__)
_TOKEN_COLUMNS = "id user team role node_name run_id attempt_id expires_at revoked_at last_used_at"
# Built once, Core columns and no ORM object: every request whose principal is not cached
# runs it.
_TOKEN_BY_HASH = select(*(_tokens.c[name] for name in _TOKEN_COLUMNS.split())).where(
    _tokens.c.token_hash == bindparam("token_hash")
)


_TOUCH_TOKEN = (
    update(_tokens)
    .where(_tokens.c.id == bindparam("token_id"))
    .values(last_used_at=bindparam("now"))
)


def token_by_hash(session: Session, token_hash: str) -> Row[Any] | None:
    """The token's columns (not its hash) by the hash of its secret, or None."""
    return session.execute(_TOKEN_BY_HASH, {"token_hash": token_hash}).one_or_none()


def touch_token(session: Session, token_id: int, now: datetime) -> None:
    session.execute(_TOUCH_TOKEN, {"token_id": token_id, "now": now})


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
    run_id: int | None = None,
    attempt_id: int | None = None,
    expires_at: datetime | None = None,
) -> tuple[ApiToken, str]:
    """A new token row and the secret (returned once; only its hash is stored)."""
    ensure_team(session, team)
    secret = new_token()
    row = ApiToken(
        token_hash=hash_token(secret),
        prefix=secret[:10],
        user=user,
        team=team,
        role=role,
        node_name=node_name,
        run_id=run_id,
        attempt_id=attempt_id,
        expires_at=expires_at,
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
