"""The worker protocol's handshake, both sides: connect() refuses a service that does not
speak its version, naming both, and the service refuses a request in a version it does not
speak with a 400 naming both (so that an old client against a newer service, or the other
way round, is told what to upgrade)."""

from __future__ import annotations

from pathlib import Path

import pytest
from runyard_client import PROTOCOL_VERSION, ProtocolMismatchError, connect, session, transport
from runyard_client.errors import ServiceError
from runyard_client.http_reporter import HttpReporter

from tests.unit.runyard_client.stand_in import StandIn


def rank0(url: str, tmp_path: Path) -> dict[str, str]:
    return {
        "RUNYARD_SERVICE_URL": url,
        "RUNYARD_ATTEMPT_ID": "7",
        "RUNYARD_CHECKPOINT_DIR": str(tmp_path),
        "RANK": "0",
    }


def test_connect_refuses_a_service_that_speaks_other_versions(
    stand_in: StandIn, tmp_path: Path
) -> None:
    stand_in.protocol = {"oldest": 2, "newest": 3}
    with pytest.raises(ProtocolMismatchError) as refused:
        connect(rank0(stand_in.url, tmp_path))
    assert str(refused.value) == (
        f"runyard-client speaks protocol 1, the service at {stand_in.url} speaks 2..3: "
        "upgrade runyard-client"
    )
    assert stand_in.requests() == [("GET", "/v1/worker/protocol")]  # and nothing reported


def test_a_service_older_than_the_handshake_speaks_protocol_1(
    stand_in: StandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in.protocol = None  # GET /v1/worker/protocol: 404
    connect(rank0(stand_in.url, tmp_path)).close()  # protocol 1: accepted
    monkeypatch.setattr(session, "PROTOCOL_VERSION", 2)
    with pytest.raises(ProtocolMismatchError, match=r"speaks protocol 2, .* speaks 1: install"):
        connect(rank0(stand_in.url, tmp_path))


def test_connect_speaks_the_real_services_protocol(
    real_service: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    connect(rank0(real_service, tmp_path)).close()
    monkeypatch.setattr(session, "PROTOCOL_VERSION", PROTOCOL_VERSION + 1)
    with pytest.raises(ProtocolMismatchError) as refused:
        connect(rank0(real_service, tmp_path))
    assert str(refused.value) == (
        f"runyard-client speaks protocol {PROTOCOL_VERSION + 1}, the service at "
        f"{real_service} speaks {PROTOCOL_VERSION}: install a runyard-client that speaks "
        f"protocol {PROTOCOL_VERSION}, or upgrade the service"
    )


def test_the_service_refuses_a_request_in_a_protocol_it_does_not_speak(
    real_service: str,
) -> None:
    url = f"{real_service}/v1/worker/attempts/7/progress"
    body = {"rank": 0, "metrics": []}
    for version in ("0", str(PROTOCOL_VERSION + 1)):
        headers = {**transport.request_headers(""), "X-Runyard-Protocol": version}
        with pytest.raises(ServiceError) as refused:
            transport.request("POST", url, body, headers=headers)
        assert (refused.value.status, refused.value.code) == (400, "unsupported_protocol")
        assert f"runyard-client speaks protocol {version}, " in refused.value.detail
        assert f"this service speaks {PROTOCOL_VERSION}: " in refused.value.detail
    # Its own version, or none (a client older than the header: protocol 1), passes on to
    # the token check.
    for headers in (transport.request_headers(""), {"Content-Type": "application/json"}):
        with pytest.raises(ServiceError) as unauthenticated:
            transport.request("POST", url, body, headers=headers)
        assert unauthenticated.value.status == 401


def test_a_refused_report_says_which_versions(
    real_service: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """An old reporter against a newer service: its rows are refused, and the log says why."""
    monkeypatch.setattr(transport, "PROTOCOL_VERSION", PROTOCOL_VERSION + 1)
    reporter = HttpReporter(real_service, 7, node="n", interval_s=3600.0, token="")
    reporter.metric(1, loss=3.0, tokens_per_s=1.0, step_time_s=0.1)
    assert reporter.flush_once()  # refused rows are dropped, not retried forever
    reporter.close(drain_timeout_s=0)
    assert (
        f"progress rows 1..1 refused: POST {real_service}/v1/worker/attempts/7/progress: 400 "
        f"runyard-client speaks protocol {PROTOCOL_VERSION + 1}, this service speaks "
        f"{PROTOCOL_VERSION}" in capfd.readouterr().err
    )
