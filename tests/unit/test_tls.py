"""TLS on the wire: the dev cluster's CA, the service serving HTTPS with it, every client
verifying it (RUNYARD_CA), and no token ever sent in clear to another host.

The services here are real (uvicorn with the service's own app, TLS from the files
client/devcluster/tls.py makes, or a plain TCP listener on this host's network address
that counts what reaches it); nothing about the handshake is stubbed."""

from __future__ import annotations

import datetime as dt
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from cryptography import x509
from runyard_client import transport
from runyard_client.errors import InsecureTransport, ServiceUnreachable
from runyard_client.tls import check_token_transport, is_loopback
from typer.testing import CliRunner

from client.api import ApiError, InsecureUrl, RunyardClient
from client.cli import app
from client.devcluster import tls as dev_tls
from client.doctor import wire
from client.doctor.result import SiteSettings, Status
from service.app import create_app
from service.config import Settings
from service.serve import PlainHttpOffLoopback, server_tls

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dev_ca(tmp_path_factory: pytest.TempPathFactory) -> dev_tls.DevTls:
    return dev_tls.ensure(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def https_url(dev_ca: dev_tls.DevTls, database_url: str) -> Iterator[str]:
    """The service's app under uvicorn on 127.0.0.1 with the dev CA's server certificate,
    as service/serve.py starts it (without the lifespan: no reconciler here)."""
    settings = Settings(tls_cert_file=dev_ca.server_cert, tls_key_file=dev_ca.server_key)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    config = uvicorn.Config(
        create_app(),
        lifespan="off",
        log_level="warning",
        timeout_graceful_shutdown=1,  # the tests' clients keep their connections open
        **server_tls(settings),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


def test_the_dev_ca_makes_its_files_private_where_they_are_secret_and_keeps_them(
    tmp_path: Path,
) -> None:
    made = dev_tls.ensure(tmp_path / "tls")
    modes = {p.name: p.stat().st_mode & 0o777 for p in made.folder.iterdir()}
    assert modes == {
        "ca.pem": 0o644, "server.pem": 0o644, "ca-key.pem": 0o600, "server-key.pem": 0o600
    }  # fmt: skip
    cert = x509.load_pem_x509_certificate(made.server_cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", socket.gethostname()} <= set(names.get_values_for_type(x509.DNSName))
    assert {str(a) for a in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    before = made.server_cert.read_bytes(), made.ca_cert.read_bytes()
    again = dev_tls.ensure(tmp_path / "tls")
    assert (again.server_cert.read_bytes(), again.ca_cert.read_bytes()) == before


def test_a_server_certificate_near_its_expiry_is_renewed_by_the_same_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dev_tls, "SERVER_LIFETIME", dt.timedelta(days=3))
    made = dev_tls.ensure(tmp_path / "tls")
    short = made.server_cert.read_bytes()
    monkeypatch.setattr(dev_tls, "SERVER_LIFETIME", dt.timedelta(days=90))
    again = dev_tls.ensure(tmp_path / "tls")
    assert again.server_cert.read_bytes() != short
    cert = x509.load_pem_x509_certificate(again.server_cert.read_bytes())
    assert cert.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=80)
    context = ssl.create_default_context(cafile=str(again.ca_cert))
    assert context.get_ca_certs()[0]["subject"] == ((("commonName", "runyard dev cluster CA"),),)


def test_the_cli_verifies_the_service_against_runyard_ca(
    https_url: str, dev_ca: dev_tls.DevTls, admin_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNYARD_CA", str(dev_ca.ca_cert))
    assert "items" in RunyardClient(https_url, token=admin_token).list_runs()
    with pytest.raises(ApiError) as answered:
        RunyardClient(https_url, token="not-a-token").list_runs()
    assert answered.value.status == 401  # the request crossed TLS and the service answered

    monkeypatch.delenv("RUNYARD_CA")  # the system's store does not know the dev CA
    with pytest.raises(ApiError) as refused:
        RunyardClient(https_url, token="not-a-token").list_runs()
    assert refused.value.status is None
    assert "certificate" in refused.value.message and "RUNYARD_CA" in refused.value.message


def test_a_certificate_from_another_ca_is_refused(
    https_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = dev_tls.ensure(tmp_path / "other")
    monkeypatch.setenv("RUNYARD_CA", str(other.ca_cert))
    with pytest.raises(ApiError, match="failed verification"):
        RunyardClient(https_url, token="not-a-token").list_runs()
    with pytest.raises(InsecureTransport, match="failed verification"):
        transport.request("GET", f"{https_url}/v1/worker/protocol", headers={})


def test_the_workers_transport_verifies_the_service_against_runyard_ca(
    https_url: str, dev_ca: dev_tls.DevTls, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNYARD_CA", str(dev_ca.ca_cert))
    answer = transport.request_json(
        "GET", f"{https_url}/v1/worker/protocol", headers=transport.request_headers("x")
    )
    assert set(answer) >= {"oldest", "newest"}
    monkeypatch.delenv("RUNYARD_CA")
    with pytest.raises(InsecureTransport, match="RUNYARD_CA"):
        transport.request("GET", f"{https_url}/v1/worker/protocol", headers={})


def network_address() -> str:
    """This host's address on its network (not loopback): where a token would cross the
    wire. The UDP connect sends nothing; it only picks the outgoing interface."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        address = str(probe.getsockname()[0])
    except OSError:
        address = ""
    finally:
        probe.close()
    if not address or is_loopback(f"http://{address}"):
        pytest.skip("this host has no network address besides loopback")
    return address


@pytest.fixture
def listener() -> Iterator[tuple[str, list[bytes]]]:
    """A TCP listener on this host's network address: its http:// URL, and what each
    connection to it sent."""
    address = network_address()
    server = socket.create_server((address, 0))
    server.settimeout(0.2)
    received: list[bytes] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(1)
                try:
                    received.append(conn.recv(65536))
                except OSError:
                    received.append(b"")

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://{address}:{server.getsockname()[1]}", received
    done.set()
    thread.join(timeout=5)
    server.close()


def test_no_token_goes_over_plain_http_to_another_host(
    listener: tuple[str, list[bytes]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url, received = listener
    with pytest.raises(InsecureUrl, match="plain HTTP"):
        RunyardClient(url, token="secret-token").list_runs()
    with pytest.raises(InsecureUrl, match="plain HTTP"):
        RunyardClient(url).log_in("MUNGE:credential")  # a credential and the token back
    with pytest.raises(InsecureTransport, match="plain HTTP"):
        transport.request("GET", f"{url}/v1/worker/protocol", headers={"Authorization": "B x"})

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    env = {"RUNYARD_URL": url, "RUNYARD_TOKEN": "secret-token"}
    result = CliRunner().invoke(app, ["run", "list"], env=env)
    assert result.exit_code == 2, result.output  # README: 2, bad input
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: refusing to send a token over plain HTTP to ")
    assert received == []  # nothing reached the other host, not even a connection

    # Without a token nothing secret is sent: an anonymous request may go (and arrives).
    with pytest.raises(ServiceUnreachable):
        transport.request("GET", f"{url}/v1/worker/protocol", headers={}, timeout_s=2)
    assert len(received) == 1 and b"Authorization" not in received[0]


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1:8000", True),
        ("http://127.8.9.10:8000", True),
        ("http://localhost:8000", True),
        ("http://[::1]:8000", True),
        ("https://runyard.example.org", True),
        ("http://runyard.example.org", False),
        ("http://10.0.0.5:8000", False),
        ("http://localhost.example.org:8000", False),
    ],
)
def test_which_urls_may_carry_a_token(url: str, allowed: bool) -> None:
    if allowed:
        check_token_transport(url)
    else:
        with pytest.raises(InsecureTransport):
            check_token_transport(url)


def test_the_service_serves_plain_http_on_loopback_only(dev_ca: dev_tls.DevTls) -> None:
    assert server_tls(Settings(host="127.0.0.1")) == {}
    with pytest.raises(PlainHttpOffLoopback, match="RUNYARD_TLS_CERT_FILE"):
        server_tls(Settings(host="0.0.0.0"))
    served = server_tls(
        Settings(
            host="0.0.0.0",
            tls_cert_file=dev_ca.server_cert,
            tls_key_file=dev_ca.server_key,
            tls_client_ca_file=dev_ca.ca_cert,
        )
    )
    assert served["ssl_certfile"] == str(dev_ca.server_cert)
    assert served["ssl_cert_reqs"] == ssl.CERT_OPTIONAL  # the token still decides who calls

    # The real entry point refuses before it listens: one line, no stack trace.
    env = {**os.environ, "RUNYARD_HOST": "0.0.0.0", "RUNYARD_PORT": "1"}
    env.pop("RUNYARD_TLS_CERT_FILE", None)
    env.pop("RUNYARD_TLS_KEY_FILE", None)
    done = subprocess.run(
        [sys.executable, "-m", "service.serve"],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("runyard service: RUNYARD_HOST=0.0.0.0 is not a loopback")
    assert "Traceback" not in done.stderr


def site_with(tls: dev_tls.DevTls, **extra: str) -> SiteSettings:
    """The doctor's view of a site that serves `tls`'s certificate."""
    values = {
        "RUNYARD_HOST": "0.0.0.0",
        "RUNYARD_TLS_CERT_FILE": str(tls.server_cert),
        "RUNYARD_TLS_KEY_FILE": str(tls.server_key),
        **extra,
    }
    return SiteSettings(
        service_url="https://127.0.0.1:1",
        database_url="",
        slurm_conf=None,
        partition="train",
        checkpoint_root=Path("/nonexistent"),
        extra=values,
    )


def test_the_doctor_judges_the_certificate_and_plain_http(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = dev_tls.ensure(tmp_path / "good")
    assert wire.certificate(site_with(good)).status is Status.OK
    assert wire.plain_http(site_with(good)).status is Status.OK

    monkeypatch.setattr(dev_tls, "SERVER_LIFETIME", dt.timedelta(days=10))
    soon = dev_tls.ensure(tmp_path / "soon")  # within the 21 days the doctor warns ahead
    near = wire.certificate(site_with(soon))
    assert near.status is Status.WARN and "expires on" in near.detail, near
    assert wire.certificate(site_with(soon, RUNYARD_TLS_EXPIRY_WARN_DAYS="5")).status is Status.OK

    other = dev_tls.ensure(tmp_path / "other")  # a key that is not the certificate's
    mixed = site_with(good, RUNYARD_TLS_KEY_FILE=str(other.server_key))
    wrong = wire.certificate(mixed)
    assert wrong.status is Status.FAIL and "does not match" in wrong.detail, wrong

    plain = site_with(good, RUNYARD_TLS_CERT_FILE="", RUNYARD_TLS_KEY_FILE="")
    refused = wire.plain_http(plain)
    assert refused.status is Status.FAIL and "RUNYARD_HOST=0.0.0.0" in refused.detail
    loopback = site_with(good, RUNYARD_HOST="127.0.0.1", RUNYARD_TLS_CERT_FILE="")
    assert wire.plain_http(loopback).status is Status.OK
