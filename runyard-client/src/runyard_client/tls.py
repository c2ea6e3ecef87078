"""How every client of the service checks whom it talks to: TLS verified against the
site's CA, and no bearer token sent in the clear off this host.

The CLI, the node agents, runyard's launcher and a team's script (through this package)
all reach the service with a token. Over HTTPS the token is safe once the service's
certificate is verified: against the CA bundle named by RUNYARD_CA (a site's own CA, or
the dev cluster's) or else the system's store. Over plain HTTP anyone on the path reads it
and can act as its owner until it expires, so a token goes over plain HTTP only to a
loopback address (the dev cluster, a service behind a local TLS proxy), never across a
network. Standard library only, as the rest of this package.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from urllib.parse import urlsplit

from .errors import InsecureTransport

ENV_CA = "RUNYARD_CA"  # a PEM bundle of the CA(s) that sign the service's certificate
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def ca_file() -> str | None:
    """The CA bundle to verify the service with (RUNYARD_CA), or None for the system store."""
    return os.environ.get(ENV_CA) or None


def client_context(ca: str | None = None) -> ssl.SSLContext:
    """A context that verifies the service's certificate and host name: against `ca`, else
    RUNYARD_CA, else the system's store. A named bundle that cannot be read raises
    InsecureTransport naming it (a typo would otherwise surface as a verification failure)."""
    bundle = ca or ca_file()
    if bundle is None:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cafile=bundle)
    except (OSError, ssl.SSLError) as exc:
        raise InsecureTransport(
            f"{ENV_CA}={bundle} is not a readable PEM CA bundle ({exc.__class__.__name__}: "
            f"{exc}); point it at the CA certificate that signed the service's certificate"
        ) from exc


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a name or an address) is this host itself: 127.0.0.0/8, ::1 or
    localhost. The service's listen address is judged by it too (service/serve.py)."""
    host = host.lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_loopback(url: str) -> bool:
    """Whether `url` names this host itself."""
    return is_loopback_host(urlsplit(url).hostname or "")


def check_token_transport(url: str) -> None:
    """Raise InsecureTransport when a token sent to `url` would cross a network in clear."""
    parts = urlsplit(url)
    if parts.scheme == "https" or is_loopback(url):
        return
    raise InsecureTransport(
        f"refusing to send a token over plain HTTP to {parts.hostname or url}: use the "
        "service's https:// URL (set RUNYARD_URL; RUNYARD_CA names the site's CA if the "
        "system store lacks it); plain http:// is only for a loopback address"
    )
