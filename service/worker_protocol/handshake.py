"""The worker protocol's handshake: which versions of runyard-client this service answers.

runyard-client sends its PROTOCOL_VERSION in the X-Runyard-Protocol header of every request
and asks GET /v1/worker/protocol at connect(). A worker request in a version outside
OLDEST_PROTOCOL..NEWEST_PROTOCOL is refused with a 400 that names both, before its token
or body is read: an old client against a newer service is told what to upgrade instead of
failing on a body it was never going to understand.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header

from contract import PROTOCOL_HEADER, PROTOCOL_VERSION, UNVERSIONED_PROTOCOL, protocol_advice
from service.errors import AppError
from service.worker_protocol.schemas import ProtocolRange

# The newest is the protocol of the runyard-client this service is built with; the oldest is
# the oldest client it still answers: raise it when a change stops answering older ones.
NEWEST_PROTOCOL = PROTOCOL_VERSION
OLDEST_PROTOCOL = 1
SPOKEN = ProtocolRange(oldest=OLDEST_PROTOCOL, newest=NEWEST_PROTOCOL)


class UnsupportedProtocol(AppError):
    status_code = 400
    code = "unsupported_protocol"


def _spoken() -> str:
    if OLDEST_PROTOCOL == NEWEST_PROTOCOL:
        return str(NEWEST_PROTOCOL)
    return f"{OLDEST_PROTOCOL}..{NEWEST_PROTOCOL}"


async def require_spoken_protocol(
    version: Annotated[
        str | None,
        Header(
            alias=PROTOCOL_HEADER,
            description="The worker protocol the client speaks (runyard-client's "
            "PROTOCOL_VERSION); absent: a client older than the header, protocol 1.",
        ),
    ] = None,
) -> None:
    """Refuse a request in a protocol this service does not speak (a check without I/O,
    on the event loop)."""
    if version is None:
        client = UNVERSIONED_PROTOCOL
    else:
        try:
            client = int(version)
        except ValueError:
            raise UnsupportedProtocol(
                f"{PROTOCOL_HEADER}: {version[:20]!r} is not a protocol version; this "
                f"service speaks worker protocol {_spoken()}"
            ) from None
    if not OLDEST_PROTOCOL <= client <= NEWEST_PROTOCOL:
        raise UnsupportedProtocol(
            f"runyard-client speaks protocol {client}, this service speaks {_spoken()}: "
            f"{protocol_advice(client, OLDEST_PROTOCOL, NEWEST_PROTOCOL)}"
        )


SPOKEN_PROTOCOL = Depends(require_spoken_protocol)
