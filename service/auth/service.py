"""Tokens, teams and the audit log."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.auth.principal import Principal
from service.auth.tokens import hash_token, new_token
from service.errors import NotFound
from service.models import ApiToken, AuditEntry, Role, Team
from service.models.base import utcnow


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
