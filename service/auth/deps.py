"""FastAPI dependencies: who is calling, and which roles a router admits."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Annotated, Any

import anyio
import anyio.to_thread
from fastapi import Depends, Header
from sqlalchemy import Row
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from service.auth.cache import principals
from service.auth.principal import Principal, TokenExpired, Unauthenticated
from service.auth.service import attempt_states, revoked_since, tokens_by_hash, touch_tokens
from service.auth.tokens import hash_token
from service.config import get_settings
from service.db import LIVENESS, in_transaction
from service.errors import first_line
from service.group_commit import GroupCommit
from service.limits import RateLimiter
from service.models import AttemptState, Role, TokenOrigin
from service.models.base import utcnow

log = logging.getLogger(__name__)


def authenticate(
    session: Session, token_hashes: list[str]
) -> dict[str, tuple[Principal, datetime | None] | Unauthenticated]:
    """Resolve bearer tokens; revoked, expired and ended-attempt tokens are refused.

    For each token hash: its principal and the token's own expiry (for the principal
    cache), or why it is refused (which fails only that token's request). A few statements
    whatever the number of tokens: a fleet's first requests after a restart all come here.
    """
    rows = tokens_by_hash(session, token_hashes)
    attempts = attempt_states(
        session, [row.attempt_id for row in rows.values() if row.attempt_id is not None]
    )
    now = utcnow()
    results: dict[str, tuple[Principal, datetime | None] | Unauthenticated] = {}
    stale: list[int] = []
    for token_hash in token_hashes:
        row = rows.get(token_hash)
        try:
            if row is None:
                raise Unauthenticated(
                    "unknown token; ask an admin for one (`runyard admin token create`)"
                )
            results[token_hash] = (_principal(row, attempts, now), row.expires_at)
        except Unauthenticated as refused:
            results[token_hash] = refused
            continue
        if row.last_used_at is None or (now - row.last_used_at).total_seconds() > 60:
            stale.append(row.id)  # coarse on purpose: one write a minute per token
    touch_tokens(session, stale, now)
    return results


def _principal(row: Row[Any], attempts: dict[int, AttemptState], now: datetime) -> Principal:
    if row.revoked_at is not None:
        raise Unauthenticated("this token was revoked; ask an admin for a new one")
    if row.expires_at is not None and row.expires_at <= now:
        raise TokenExpired(expired_because(row.origin, row.expires_at))
    if row.attempt_id is not None:
        state = attempts.get(row.attempt_id)
        if state is None or state.is_terminal:
            raise Unauthenticated("this worker token expired with its attempt")
    return Principal(
        token_id=row.id,
        user=row.user,
        team=row.team,
        role=row.role,
        node_name=row.node_name,
        node_cluster=row.node_cluster,
        run_id=row.run_id,
        attempt_id=row.attempt_id,
    )


def expired_because(origin: TokenOrigin, expires_at: datetime) -> str:
    """What the holder of a token that expired at `expires_at` should do next."""
    when = expires_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    if origin == TokenOrigin.LOGIN:
        return f"your login expired at {when}; run `runyard login` again"
    return f"this token expired at {when}; ask an admin for a new one"


# Tokens not in the principal cache are looked up together (a fleet's first requests after
# a restart all miss it at once): one transaction per group, see service/group_commit.py.
TOKEN_LOOKUPS = GroupCommit("token lookups", LIVENESS, authenticate)


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
    principal, expires_at = await TOKEN_LOOKUPS.submit(token_hash)
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


# Revocations are read back over this window before the last read that worked, so a
# revoking process whose clock is behind ours still has its revocations seen.
REVOCATION_WINDOW = timedelta(minutes=1)


async def watch_revocations() -> None:
    """Forget, every `auth_revocation_poll_s`, the principals of tokens revoked anywhere.

    Each read starts where the last one that worked started, so a token revoked while the
    reads failed (Postgres down for longer than the window) is still forgotten when the
    database answers again, not only when its cache entry expires (auth_cache_ttl_s).
    Runs for the life of the service process (started by the app's lifespan).
    """
    every_s = get_settings().auth_revocation_poll_s
    read_from = utcnow()  # the cache starts empty: nothing revoked before now is cached
    while True:
        await anyio.sleep(every_s)
        started = utcnow()
        since = read_from - REVOCATION_WINDOW
        try:
            revoked = await anyio.to_thread.run_sync(in_transaction, revoked_since, since)
        except OperationalError as exc:  # the database down a while: expected, one line
            log.warning(
                "reading revoked tokens failed (%s); retrying in %.0f s", first_line(exc), every_s
            )
            continue
        except Exception:
            log.exception("reading revoked tokens failed; retrying in %.0f s", every_s)
            continue
        principals.forget_revoked(revoked)
        read_from = started


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
# The agent itself, for endpoints that need it: one dependency where AGENTS plus
# PrincipalDep resolve two (the agents' hot path counts them).
AgentDep = Annotated[Principal, AGENTS]
WORKERS = Depends(roles(Role.WORKER, Role.ADMIN))


async def worker_of_attempt(attempt_id: int, principal: PrincipalDep) -> Principal:
    """Worker routes: a worker token for this very attempt (or an admin)."""
    principal.require(Role.WORKER, Role.ADMIN)
    principal.require_attempt(attempt_id)
    return principal


WORKER_OF_ATTEMPT = Depends(worker_of_attempt)
