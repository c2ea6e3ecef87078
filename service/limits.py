"""Limits that keep one misbehaving client from taking the service down.

Hand-written on purpose: a per-token token bucket and a body-size cap are a few lines each,
and the rate-limit libraries for Starlette key on client address, not on our tokens.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import AppError


class TooManyRequests(AppError):
    status_code = 429
    code = "rate_limited"


@dataclass
class _Bucket:
    tokens: float
    updated: float = field(default_factory=time.monotonic)


class RateLimiter:
    """A token bucket per key: `rate_per_s` sustained, `burst` at once."""

    def __init__(self, rate_per_s: float, burst: float) -> None:
        self.rate, self.burst = rate_per_s, burst
        self._buckets: dict[object, _Bucket] = {}
        self._lock = threading.Lock()

    def check(self, key: object) -> None:
        with self._lock:
            now = time.monotonic()
            bucket = self._buckets.setdefault(key, _Bucket(tokens=self.burst, updated=now))
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            if bucket.tokens < 1:
                raise TooManyRequests(
                    f"more than {self.rate:g} requests/s from this token; slow down "
                    "(agents batch their events: see docs/api.md)"
                )
            bucket.tokens -= 1


class BodySizeLimit:
    """Refuse request bodies over `max_bytes` with a 413 before reading them whole."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counting_receive, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = (
            b'{"error":"body_too_large","detail":"request bodies are limited to '
            + str(self.max_bytes).encode()
            + b' bytes; send smaller batches"}'
        )
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass
