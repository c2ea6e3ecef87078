"""`python -m service.serve`: the API and its reconciler under uvicorn, as the settings say.

One way to start the service (the dev cluster, the tests, deploy/runyard-service.sh), so
HTTPS is never forgotten on one of them: with RUNYARD_TLS_CERT_FILE and _KEY_FILE set it
serves TLS with the site's certificate (and, with RUNYARD_TLS_CLIENT_CA_FILE, verifies
the client certificates signed by that CA: optional, the bearer token still decides who
calls). Without a certificate it serves plain HTTP on a loopback address only: bearer
tokens cross every other interface, and in clear they are anyone's who can read the wire
(a site that terminates TLS in a proxy on the same host binds the service to loopback).
"""

from __future__ import annotations

import ssl
import sys
from typing import Any

import uvicorn
from runyard_client.tls import is_loopback_host

from service.config import Settings, get_settings

APP = "service.app:create_app"
# How long a stopping service waits for open connections before its lifespan ends (and
# with it the reconciler). A TLS connection closes only when its client answers the
# close_notify (asyncio waits up to 30 s for it), and the agents' idle keep-alive
# connections do not answer until their next heartbeat: uvicorn then waited until the
# service was killed, its listener closed while its reconciler still judged heartbeats,
# and healthy nodes were drained as silent (test_control_plane_restarts). Requests take
# well under a second; 3 s is far inside heartbeat_suspect_s.
GRACEFUL_SHUTDOWN_S = 3


class PlainHttpOffLoopback(ValueError):
    """The settings would serve bearer tokens in clear across a network."""


def server_tls(settings: Settings) -> dict[str, Any]:
    """uvicorn's TLS arguments for `settings`: none for plain HTTP on loopback; raises
    PlainHttpOffLoopback for plain HTTP anywhere else."""
    if settings.tls_cert_file is None:
        if not is_loopback_host(settings.host):
            raise PlainHttpOffLoopback(
                f"RUNYARD_HOST={settings.host} is not a loopback address and "
                "RUNYARD_TLS_CERT_FILE is not set: the service would take bearer tokens in "
                "clear over the network. Set RUNYARD_TLS_CERT_FILE and RUNYARD_TLS_KEY_FILE "
                "(docs/install.md, TLS), or listen on 127.0.0.1 behind a local TLS proxy"
            )
        return {}
    tls: dict[str, Any] = {
        "ssl_certfile": str(settings.tls_cert_file),
        "ssl_keyfile": str(settings.tls_key_file),
    }
    if settings.tls_client_ca_file is not None:
        tls["ssl_ca_certs"] = str(settings.tls_client_ca_file)
        tls["ssl_cert_reqs"] = ssl.CERT_OPTIONAL
    return tls


def main() -> None:
    settings = get_settings()
    try:
        tls = server_tls(settings)
    except PlainHttpOffLoopback as refused:
        sys.exit(f"runyard service: {refused}")
    uvicorn.run(
        APP,
        factory=True,
        host=settings.host,
        port=settings.port,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        **tls,
    )


if __name__ == "__main__":
    main()
