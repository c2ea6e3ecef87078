"""The errors runyard-client raises: one base, a class per condition."""

from __future__ import annotations

import json

from .protocol import protocol_advice


class RunyardClientError(Exception):
    """Anything runyard-client refuses or could not do."""


class ProtocolMismatchError(RunyardClientError):
    """The service does not speak this client's protocol version: one side must upgrade."""

    def __init__(self, client: int, oldest: int, newest: int, service_url: str) -> None:
        self.client, self.oldest, self.newest = client, oldest, newest
        self.service_url = service_url
        speaks = str(oldest) if oldest == newest else f"{oldest}..{newest}"
        super().__init__(
            f"runyard-client speaks protocol {client}, the service at {service_url} speaks "
            f"{speaks}: {protocol_advice(client, oldest, newest)}"
        )


class RequestError(RunyardClientError):
    """A request to the service did not succeed."""

    retryable = False  # worth another try: the service may take it later


class ServiceUnreachable(RequestError):
    """No answer: the network, a refused connection, a timeout, a cut-off reply."""

    retryable = True


class InsecureTransport(RequestError):
    """A bearer token would cross the network in clear (plain HTTP to another host), or the
    service's certificate failed verification: no other try can help until the URL or
    RUNYARD_CA changes."""


class ServiceError(RequestError):
    """The service answered with an error status; `code` and `detail` are from its
    `{"error": ..., "detail": ...}` body when it sent one."""

    def __init__(self, method: str, url: str, status: int, body: bytes) -> None:
        self.method, self.url, self.status = method, url, status
        self.code, self.detail = _error_fields(body)
        # 5xx: the service or the database had trouble; 429: come back later. Any other
        # 4xx is the service's answer to this very request: sending it again cannot help.
        self.retryable = status >= 500 or status == 429
        super().__init__(f"{method} {url}: {status} {self.detail}".rstrip())


def _error_fields(body: bytes) -> tuple[str, str]:
    text = body.decode("utf-8", "replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        return "", text[:200]
    if isinstance(parsed, dict):
        return str(parsed.get("error", "")), str(parsed.get("detail", text))[:400]
    return "", text[:200]
