"""The base of every contract model: immutable, and strict about unknown fields."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """A value both sides exchange: no field may change once built, none may be added."""

    model_config = ConfigDict(frozen=True, extra="forbid")
