"""What runyard-client and the service agree on over HTTP, defined once, here.

runyard's `contract` package re-exports these names for the service (contract may import
this distribution; this one imports nothing of runyard's, so that it installs alone).
"""

from __future__ import annotations

# The worker protocol this client speaks: the paths, bodies and replies of /v1/worker/...
# Bump it when a change would make an older service misread a request or an older client
# misread a reply; the service answers the range it speaks at GET /v1/worker/protocol and
# refuses a request whose PROTOCOL_HEADER is outside it (service/worker_protocol/handshake.py).
PROTOCOL_VERSION = 1
PROTOCOL_HEADER = "X-Runyard-Protocol"
# A request without the header comes from a client older than the header: it spoke what
# became protocol 1. A service without the GET /v1/worker/protocol endpoint speaks 1 too.
UNVERSIONED_PROTOCOL = 1

# The longest a worker waits between tries of a progress report the service did not take
# (its waits double from the report interval up to this), and how long one try may take.
# The service's hang check allows both after any time it could not record reports
# (service/recovery/hangs.py): a worker that kept failing during an outage delivers again
# within their sum once the service is back.
MAX_REPORT_BACKOFF_S = 30.0
REPORT_REQUEST_TIMEOUT_S = 10.0


def protocol_advice(client: int, oldest: int, newest: int) -> str:
    """What to change when a client speaking `client` meets a service speaking
    `oldest..newest`: the side that is behind."""
    if client < oldest:
        return "upgrade runyard-client"
    return f"install a runyard-client that speaks protocol {newest}, or upgrade the service"
