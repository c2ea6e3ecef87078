"""Collective failures are told apart from other errors, with the service's kinds."""

from __future__ import annotations

import pytest

from worker.failures import classify_collective_error

# Texts as torch raises them (the gloo one captured here from a SIGKILLed peer).
GLOO_PEER_DIED = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:44183. This is typically caused by a remote worker crashing."
)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (GLOO_PEER_DIED, "nccl:connection_reset"),
        (
            "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
            "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600041 milliseconds before timing out.",
            "nccl:watchdog_timeout",
        ),
        (
            "NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a "
            "network error, NCCL version 2.21.5\\nncclRemoteError: A call failed possibly due to "
            "a network error or a remote process exiting prematurely.",
            "nccl:remote_error",
        ),
        (
            "NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details), "
            "ncclSystemError: System call (e.g. socket, malloc) or external library call failed",
            "nccl:system_error",
        ),
    ],
)
def test_collective_errors_get_the_service_kind(text: str, kind: str) -> None:
    assert classify_collective_error(RuntimeError(text)) == kind


def test_other_errors_are_not_collective() -> None:
    assert classify_collective_error(ValueError("shapes do not match")) is None
    assert classify_collective_error(KeyboardInterrupt()) is None
