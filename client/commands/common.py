"""Glue shared by the command modules: one client per invocation, errors to exit codes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from client.api import ApiError, InsecureUrl, RunyardClient
from client.output import Exit, fail
from client.token_store import TokenSource

T = TypeVar("T")


def call(fn: Callable[[RunyardClient], T]) -> T:
    """Run one API call; a refusal or an unreachable service becomes a one-line error."""
    client = RunyardClient()
    try:
        return fn(client)
    except ApiError as exc:
        if exc.status == 401 and client.token_source == TokenSource.LOGIN:
            fail(login_refused(exc), Exit.ERROR)
        fail(exc.message, exit_for(exc))


# Refusals that say the command named something wrong (bad input, as a usage error is).
USAGE_ERRORS = ("unknown_cluster",)


def exit_for(exc: ApiError) -> int:
    """The README's exit code for a failed call: 2 for a URL or CA that cannot carry a
    token safely, or a name the service does not know (bad input), 3 when no answer came,
    1 when the service refused."""
    if isinstance(exc, InsecureUrl):
        return Exit.USAGE
    if isinstance(exc.body, dict) and exc.body.get("error") in USAGE_ERRORS:
        return Exit.USAGE
    return Exit.UNREACHABLE if exc.status is None else Exit.ERROR


def login_refused(exc: ApiError) -> str:
    """What to tell someone whose saved login token the service refused."""
    code = exc.body.get("error") if isinstance(exc.body, dict) else None
    if code == "token_expired":
        return "your runyard login expired; run `runyard login` again"
    return f"your saved runyard login is no longer valid ({exc.message}); run `runyard login` again"


def fmt_float(value: Any, digits: int = 4) -> str:
    return "" if value is None else f"{value:.{digits}f}"
