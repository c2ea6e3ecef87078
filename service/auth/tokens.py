"""Bearer tokens: random, shown once, stored only as a SHA-256 hash."""

from __future__ import annotations

import hashlib
import secrets

TOKEN_PREFIX = "ry_"


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """Tokens are 256 random bits: a fast hash is enough (no dictionary to attack)."""
    return hashlib.sha256(token.encode()).hexdigest()
