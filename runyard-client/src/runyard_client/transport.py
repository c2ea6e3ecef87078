"""JSON over HTTP to the service, with the standard library only.

Every request carries the protocol version (PROTOCOL_HEADER) and the job's bearer token
(RUNYARD_TOKEN, set by runyard's launcher); failures are RequestError subclasses that say
whether another try could succeed, and `with_retries` gives them bounded, doubling waits.

urllib rather than httpx: what the reporter needs (a JSON POST with a timeout, the status
and body of an error, proxies from the environment) is all in the standard library, and a
library that depends on nothing installs into any team's environment without pinning, or
fighting over, a version of something the team's own code uses. The cost is a new
connection per request (urllib keeps none alive): one every report interval, a few
milliseconds against seconds. Redirects are not followed: a report is for the URL the
launcher named, and urllib would turn a redirected POST into a GET without its body.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any, Callable, TypeVar

from .errors import InsecureTransport, RequestError, ServiceError, ServiceUnreachable
from .protocol import PROTOCOL_HEADER, PROTOCOL_VERSION, REPORT_REQUEST_TIMEOUT_S
from .tls import ca_file, check_token_transport, client_context

ENV_TOKEN = "RUNYARD_TOKEN"  # the job's bearer token (a worker token of its attempt)

T = TypeVar("T")


def request_headers(token: str | None = None) -> dict[str, str]:
    """The headers of every request: JSON, the protocol version, and the bearer token
    (`token`, or else $RUNYARD_TOKEN; none when empty)."""
    token = os.environ.get(ENV_TOKEN, "") if token is None else token
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        PROTOCOL_HEADER: str(PROTOCOL_VERSION),
    }
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """Turns a 3xx into a ServiceError (see the module's docstring)."""

    def redirect_request(self, *_: Any, **__: Any) -> None:
        return None


# Thread-safe: an opener keeps no state between requests (no cookies, no connections).
# One per CA bundle (RUNYARD_CA, read at each request: a test or a launcher may set it
# after this module was imported); HTTPS verifies the service's certificate and name.
_OPENERS: dict[str | None, urllib.request.OpenerDirector] = {}


def _opener() -> urllib.request.OpenerDirector:
    bundle = ca_file()
    if bundle not in _OPENERS:
        https = urllib.request.HTTPSHandler(context=client_context(bundle))
        _OPENERS[bundle] = urllib.request.build_opener(_RefuseRedirects, https)
    return _OPENERS[bundle]


def request(
    method: str,
    url: str,
    body: Any = None,
    *,
    headers: Mapping[str, str],
    timeout_s: float = REPORT_REQUEST_TIMEOUT_S,
) -> bytes:
    """Send `body` as JSON (none when None) and return the reply's body.

    Raises ServiceError for a non-2xx answer and ServiceUnreachable when none came; a body
    with NaN or infinity raises ValueError (JSON has no form for them, nor has the API)."""
    if any(name.lower() == "authorization" for name in headers):
        check_token_transport(url)
    data = None if body is None else json.dumps(body, allow_nan=False).encode()
    prepared = urllib.request.Request(url, data=data, method=method, headers=dict(headers))
    opener = _opener()
    try:
        with opener.open(prepared, timeout=timeout_s) as reply:
            content: bytes = reply.read()
            return content
    except urllib.error.HTTPError as answer:
        with answer:
            try:
                error_body = answer.read()
            except (http.client.HTTPException, OSError):
                error_body = b""
        raise ServiceError(method, url, answer.code, error_body) from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, ssl.SSLCertVerificationError):
            raise InsecureTransport(
                f"{method} {url}: the service's certificate failed verification "
                f"({reason.verify_message}); set RUNYARD_CA to the CA that signed it"
            ) from exc
        raise ServiceUnreachable(f"{method} {url}: {reason!r}") from exc


def request_json(
    method: str,
    url: str,
    body: Any = None,
    *,
    headers: Mapping[str, str],
    timeout_s: float = REPORT_REQUEST_TIMEOUT_S,
) -> Any:
    """`request`, with the reply parsed as JSON (None for an empty one). A reply that is not
    JSON raises ValueError."""
    content = request(method, url, body, headers=headers, timeout_s=timeout_s)
    return json.loads(content) if content.strip() else None


def with_retries(
    call: Callable[[], T], *, stop_after_s: float, first_wait_s: float, max_wait_s: float
) -> T:
    """`call()` until it returns or raises a RequestError that is not retryable; after a
    retryable failure, wait (`first_wait_s`, doubling up to `max_wait_s`) and try again
    unless `stop_after_s` has passed since the first try, then raise the last error."""
    started = time.monotonic()
    wait_s = first_wait_s
    while True:
        try:
            return call()
        except RequestError as exc:
            if not exc.retryable or time.monotonic() - started >= stop_after_s:
                raise
        time.sleep(wait_s)
        wait_s = min(wait_s * 2, max_wait_s)
