"""Authenticated principals kept in memory, so a fleet's heartbeats skip the token lookup.

Without it every request opened a second session just to read its `api_tokens` row: 1,280
agents reporting every few seconds spent more time proving who they were than reporting.

What stays exact:
- revocation by this process: `forget_token` runs once the revoking transaction commits, so
  the next request with that token reads the revoked row;
- expiry: the token's `expires_at` is kept with the principal and checked on every hit;
- worker tokens are never cached: they die with their attempt, which the reconciler ends.

What may lag: a revocation committed by another service process (or written straight into
the database). `watch_revocations` reads the recently revoked tokens every
`auth_revocation_poll_s` (1 s) and forgets them; `auth_cache_ttl_s` (60 s) bounds the lag
even if that read fails.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from service.auth.principal import Principal
from service.models.base import utcnow


@dataclass(frozen=True)
class _Entry:
    principal: Principal
    expires_at: datetime | None  # the token's own expiry
    cached_until: float  # time.monotonic()


class PrincipalCache:
    """Principals by token hash, each for `ttl_s` seconds at most."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._generation = 0  # bumped by every forget: a lookup that raced it is not stored

    def get(self, token_hash: str) -> Principal | None:
        entry = self._entries.get(token_hash)
        if entry is None:
            return None
        if entry.cached_until <= time.monotonic() or (
            entry.expires_at is not None and entry.expires_at <= utcnow()
        ):
            with self._lock:
                if self._entries.get(token_hash) is entry:
                    del self._entries[token_hash]
            return None
        return entry.principal

    def generation(self) -> int:
        """Read before looking a token up in the database; hand it back to `put`."""
        return self._generation

    def put(
        self,
        token_hash: str,
        principal: Principal,
        expires_at: datetime | None,
        ttl_s: float,
        generation: int,
    ) -> None:
        if ttl_s <= 0 or principal.attempt_id is not None:
            return
        with self._lock:
            if generation != self._generation:
                return  # a revocation committed while this row was being read
            self._entries[token_hash] = _Entry(principal, expires_at, time.monotonic() + ttl_s)

    def forget_token(self, token_id: int) -> None:
        """Drop a token's principal (after its revocation commits)."""
        with self._lock:
            self._generation += 1
            self._drop({token_id})

    def forget_revoked(self, token_ids: Collection[int]) -> None:
        """Drop the principals of tokens another process revoked.

        No generation bump: the same revocations are read again on the next polls (a
        window of a minute), which drops a principal that a racing lookup stored.
        """
        if token_ids:
            with self._lock:
                self._drop(token_ids)

    def _drop(self, token_ids: Collection[int]) -> None:
        stale = [k for k, e in self._entries.items() if e.principal.token_id in token_ids]
        for key in stale:
            del self._entries[key]

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._entries.clear()


principals = PrincipalCache()
