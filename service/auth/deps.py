"""FastAPI dependencies: who is calling, and which roles a router admits."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from functools import lru_cache
from typing import Annotated

from fastapi import Depends, Header
from sqlalchemy.orm import Session

from service.auth.cache import principals
from service.auth.principal import Principal, Unauthenticated
from service.auth.service import token_by_hash, touch_token
from service.auth.tokens import hash_token
from service.config import get_settings
from service.db import run_in_transaction
from service.limits import RateLimiter
from service.models import Attempt, Role
from service.models.base import utcnow


def authenticate(session: Session, token_hash: str) -> tuple[Principal, datetime | None]:
    """Resolve a bearer token; revoked, expired and ended-attempt tokens are refused.

    Returns the principal and the token's own expiry (for the principal cache).
    """
    row = token_by_hash(session, token_hash)
    if row is None:
        raise Unauthenticated("unknown token; ask an admin for one (`runyard admin token create`)")
    if row.revoked_at is not None:
        raise Unauthenticated("this token was revoked; ask an admin for a new one")
    now = utcnow()
    if row.expires_at is not None and row.expires_at <= now:
        raise Unauthenticated("this token expired; ask an admin for a new one")
    if row.attempt_id is not None:
        attempt = session.get(Attempt, row.attempt_id)
        if attempt is None or attempt.state.is_terminal:
            raise Unauthenticated("this worker token expired with its attempt")
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() > 60:
        # Coarse on purpose: one write a minute per token, not one per request.
        touch_token(session, row.id, now)
    principal = Principal(
        token_id=row.id,
        user=row.user,
        team=row.team,
        role=row.role,
        node_name=row.node_name,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
    )
    return principal, row.expires_at


async def current_principal(authorization: Annotated[str | None, Header()] = None) -> Principal:
    """The caller, from the principal cache or else from `api_tokens`."""
    if not authorization:
        raise Unauthenticated(
            "missing Authorization: Bearer <token> header (the CLI reads RUNYARD_TOKEN)"
        )
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
    token_hash = hash_token(token.strip())
    cached = principals.get(token_hash)
    if cached is not None:
        return cached
    generation = principals.generation()  # before the read: see PrincipalCache.put
    principal, expires_at = await run_in_transaction(authenticate, token_hash)
    principals.put(token_hash, principal, expires_at, get_settings().auth_cache_ttl_s, generation)
    return principal


PrincipalDep = Annotated[Principal, Depends(current_principal)]


def roles(*allowed: Role) -> Callable[[Principal], Awaitable[Principal]]:
    """A dependency admitting only `allowed` roles; put it on a router or an endpoint."""

    # async: a check that does no I/O runs on the event loop, not through the thread pool.
    async def check(principal: PrincipalDep) -> Principal:
        principal.require(*allowed)
        return principal

    return check


USERS = Depends(roles(Role.USER, Role.ADMIN))
ADMINS = Depends(roles(Role.ADMIN))


@lru_cache
def agent_limiter() -> RateLimiter:
    settings = get_settings()
    return RateLimiter(settings.agent_requests_per_s, settings.agent_burst)


async def agent(principal: PrincipalDep) -> Principal:
    """Agents (or admins), rate-limited per token so one agent cannot starve recovery."""
    principal.require(Role.AGENT, Role.ADMIN)
    if principal.role == Role.AGENT:
        agent_limiter().check(principal.token_id)
    return principal


AGENTS = Depends(agent)
WORKERS = Depends(roles(Role.WORKER, Role.ADMIN))


async def worker_of_attempt(attempt_id: int, principal: PrincipalDep) -> Principal:
    """Worker routes: a worker token for this very attempt (or an admin)."""
    principal.require(Role.WORKER, Role.ADMIN)
    principal.require_attempt(attempt_id)
    return principal


WORKER_OF_ATTEMPT = Depends(worker_of_attempt)
