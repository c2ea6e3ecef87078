"""Glue shared by the command modules: one client per invocation, errors to exit codes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from client.api import ApiError, RunyardClient
from client.output import Exit, fail

T = TypeVar("T")


def call(fn: Callable[[RunyardClient], T]) -> T:
    """Run one API call; a refusal or an unreachable service becomes a one-line error."""
    client = RunyardClient()
    try:
        return fn(client)
    except ApiError as exc:
        fail(exc.message, Exit.UNREACHABLE if exc.status is None else Exit.ERROR)


def fmt_float(value: Any, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}f}"
