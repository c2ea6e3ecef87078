"""Which exceptions are collective (NCCL / gloo) failures, and the kind the service files
them under (service/recovery/classification.py: every kind there restarts without a drain).

A table, not code, so that a new message is one row. Matched in order, first wins, on the
exception's text (torch raises these as RuntimeError / DistBackendError with the text only).
"""

from __future__ import annotations

# (substring of the error text, kind, where the text comes from)
COLLECTIVE_ERRORS: tuple[tuple[str, str, str], ...] = (
    # torch ProcessGroupNCCL watchdog: "Watchdog caught collective operation timeout: ..."
    ("Watchdog caught collective operation timeout", "nccl:watchdog_timeout", "torch c10d"),
    # gloo: "[.../tcp/unbound_buffer.cc:81] Timed out waiting 600000ms for recv operation"
    ("Timed out waiting", "nccl:watchdog_timeout", "gloo transport/tcp"),
    ("ncclRemoteError", "nccl:remote_error", "nccl.h ncclResult_t"),
    ("remote process exited or there was a network error", "nccl:remote_error", "NCCL"),
    ("ncclSystemError", "nccl:system_error", "nccl.h ncclResult_t"),
    ("ncclInternalError", "nccl:internal_error", "nccl.h ncclResult_t"),
    # gloo, seen here when a peer rank is SIGKILLed: "[.../tcp/pair.cc:553] Connection
    # closed by peer [127.0.0.1]:44183. This is typically caused by a remote worker crashing."
    ("Connection closed by peer", "nccl:connection_reset", "gloo transport/tcp pair.cc"),
    ("Connection reset by peer", "nccl:connection_reset", "ECONNRESET (gloo, NCCL sockets)"),
)


def classify_collective_error(exc: BaseException) -> str | None:
    """The service's kind for a collective failure, or None for any other error."""
    text = str(exc)
    for substring, kind, _source in COLLECTIVE_ERRORS:
        if substring in text:
            return kind
    return None
