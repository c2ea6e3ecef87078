"""Webhooks reach only public addresses unless an admin allows a network (issue 38, finding
3): a URL on loopback, link-local (cloud metadata), private or other internal addresses is
refused when it is added (422 naming `url`) and at delivery, on the address the POST would
really use (a name may resolve elsewhere by then); the delivery log keeps the receiver's
status, never its body. Real Postgres and the real API; the receivers listen on 127.0.0.1,
the only address this machine can reach, and names resolve from a table (`dns`)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from ipaddress import ip_address
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from service.auth.service import create_token
from service.config import Settings, get_settings
from service.models import (
    DeliveryState,
    NotificationDelivery,
    NotificationEvent,
    NotificationSubscription,
    Role,
)
from service.notifications import delivery, egress, render
from service.notifications.egress import AddressKind
from tests.fixtures.webhook_receiver import WebhookReceiver
from tests.unit.test_notifications import PUBLIC_ADDRESS, RECEIVER_NETWORK, call, subscribe

INTERNAL = [  # (host, why it is refused, what the refusal says)
    ("127.0.0.1", AddressKind.LOOPBACK, "127.0.0.1 is a loopback address"),
    ("169.254.169.254", AddressKind.LINK_LOCAL, "169.254.169.254 is a link-local address"),
    ("10.0.0.1", AddressKind.PRIVATE, "10.0.0.1 is a private address"),
    # A name, resolved by this machine (some list ::1 first).
    ("localhost", AddressKind.LOOPBACK, "localhost resolves to "),
    ("[::ffff:10.0.0.1]", AddressKind.PRIVATE, "::ffff:10.0.0.1 is a private address"),
    ("100.64.0.1", AddressKind.NON_PUBLIC, "100.64.0.1 is a non-public address"),  # CGNAT
    # One public address and one private: the private one refuses the name.
    ("mixed.example.test", AddressKind.PRIVATE, "resolves to 10.0.0.1, a private address"),
]
SECRET = "AKIA-instance-credentials-do-not-show"


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Names in this table resolve to its addresses (edit it to move a name); the rest as
    this machine resolves them (localhost)."""
    table = {"mixed.example.test": [PUBLIC_ADDRESS, "10.0.0.1"]}
    real = egress.resolve

    def resolve(host: str) -> list[egress.IPAddress]:
        if host in table:
            return [ip_address(a) for a in table[host]]
        return real(host)

    monkeypatch.setattr(egress, "resolve", resolve)
    return table


@pytest.fixture
def allow_networks(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Set RUNYARD_WEBHOOK_ALLOWED_NETWORKS for the API, as an admin would."""

    def allow(cidrs: str) -> None:
        monkeypatch.setenv("RUNYARD_WEBHOOK_ALLOWED_NETWORKS", cidrs)
        get_settings.cache_clear()

    yield allow
    get_settings.cache_clear()  # the next reader sees the environment monkeypatch restores


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    hook = WebhookReceiver()
    yield hook
    hook.close()


@pytest.fixture(scope="module")
def token(database_url: str) -> str:
    """A committed user token (the API's auth reads its own transaction)."""
    engine = create_engine(database_url)
    with Session(engine) as s, s.begin():
        _, secret = create_token(s, user="eve", team="egress-n", role=Role.USER)
    engine.dispose()
    return secret


def queue(session: Session, subscription: NotificationSubscription) -> NotificationDelivery:
    """A delivery due now, written straight to the outbox."""
    row = NotificationDelivery(
        subscription_id=subscription.id,
        team=subscription.team,
        event=NotificationEvent.ROLLBACK,
        dedupe_key="queued-by-hand",
        payload={"event": NotificationEvent.ROLLBACK.value, "run": None},
    )
    session.add(row)
    session.flush()
    return row


def deliver_once(session: Session, settings: Settings, client: httpx.Client) -> list[int]:
    """One pass of the delivery loop on the test's session: the ids tried."""
    tried = []
    for item in delivery.claim_due(session, settings):
        answer = delivery.send(client, item, settings.webhook_networks)
        delivery.record(session, item, answer, settings)
        tried.append(item.id)
    session.expire_all()
    return tried


def recording_client(seen: list[httpx.Request], follow_redirects: bool = False) -> httpx.Client:
    """A client whose every request is recorded (and answered 200) instead of sent."""

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    return httpx.Client(transport=httpx.MockTransport(answer), follow_redirects=follow_redirects)


@pytest.mark.parametrize(("host", "kind", "said"), INTERNAL)
def test_an_internal_url_is_refused_at_add_naming_the_field(
    api: Any, token: str, dns: dict[str, list[str]], host: str, kind: AddressKind, said: str
) -> None:
    body = {"url": f"http://{host}:8000/hook", "events": ["run.failed"]}
    refused = call(api, token, "POST", "/v1/notifications", json=body)
    print(refused.json())
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    assert refused.json()["error"] == "invalid_spec"
    assert detail.startswith("url: ") and said in detail and f"a {kind} address" in detail
    assert detail.endswith(
        "; webhooks may only reach public addresses unless an admin allows the network "
        "(RUNYARD_WEBHOOK_ALLOWED_NETWORKS)"
    )
    assert call(api, token, "GET", "/v1/notifications").json() == []


def test_a_name_that_does_not_resolve_is_refused_at_add(
    api: Any, token: str, dns: dict[str, list[str]]
) -> None:
    dns["nowhere.example.test"] = []
    body = {"url": "https://nowhere.example.test/hook", "events": ["run.failed"]}
    refused = call(api, token, "POST", "/v1/notifications", json=body)
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith("url: nowhere.example.test does not resolve")


@pytest.mark.parametrize(("host", "kind", "said"), INTERNAL)
def test_an_internal_url_is_refused_at_delivery_and_never_posted(
    db_session: Session, dns: dict[str, list[str]], host: str, kind: AddressKind, said: str
) -> None:
    """A row written past the add check (before this fix, or by hand): never sent."""
    subscription = subscribe(db_session, "vision", f"http://{host}:8000/hook", ["run.failed"])
    row = queue(db_session, subscription)
    seen: list[httpx.Request] = []
    with recording_client(seen) as client:
        assert deliver_once(db_session, Settings(), client) == [row.id]
    print(row.last_error)
    assert seen == []
    assert row.state == DeliveryState.PENDING and row.num_tries == 1  # tried again later
    assert row.last_status is None
    assert row.last_error is not None and row.last_error.startswith("refused: ")
    assert said in row.last_error and row.last_error.endswith(f"a {kind} address")


def test_a_name_that_moves_to_loopback_after_add_is_refused_at_delivery(
    api: Any,
    token: str,
    db_session: Session,
    dns: dict[str, list[str]],
    receiver: WebhookReceiver,
) -> None:
    """DNS rebinding: public when added, 127.0.0.1 when delivered. The POST would reach
    the receiver on 127.0.0.1 if it were sent."""
    dns["hooks.rebind.test"] = [PUBLIC_ADDRESS]
    url = f"http://hooks.rebind.test:{receiver.port}/hook"
    created = call(
        api, token, "POST", "/v1/notifications", json={"url": url, "events": ["rollback"]}
    )
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    dns["hooks.rebind.test"] = ["127.0.0.1"]
    assert call(api, token, "POST", f"/v1/notifications/{sid}/test").status_code == 202
    with httpx.Client(timeout=5) as client:
        [tried] = deliver_once(db_session, Settings(), client)
    assert receiver.received == []
    [logged] = call(api, token, "GET", f"/v1/notifications/deliveries?subscription_id={sid}").json()
    print(logged)
    assert logged["id"] == tried and logged["last_status"] is None
    assert logged["last_error"] == (
        "refused: hooks.rebind.test resolves to 127.0.0.1, a loopback address"
    )


def test_an_allowed_network_lets_loopback_through(
    api: Any,
    token: str,
    db_session: Session,
    dns: dict[str, list[str]],
    receiver: WebhookReceiver,
    allow_networks: Callable[[str], None],
) -> None:
    """127.0.0.0/8 allowed: added, and the POST arrives, by address and by name (an
    internal Slack proxy's), the name's Host header kept."""
    allow_networks(RECEIVER_NETWORK)
    dns["slack-proxy.internal.test"] = ["127.0.0.1"]
    by_name = f"http://slack-proxy.internal.test:{receiver.port}/hook"
    for url in (receiver.url, by_name):
        body = {"url": url, "events": ["rollback"]}
        created = call(api, token, "POST", "/v1/notifications", json=body)
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        assert call(api, token, "POST", f"/v1/notifications/{sid}/test").status_code == 202
    settings = Settings(webhook_allowed_networks=RECEIVER_NETWORK)
    with httpx.Client(timeout=5) as client:
        assert len(deliver_once(db_session, settings, client)) == 2
    logged = call(api, token, "GET", "/v1/notifications/deliveries").json()
    assert [(d["state"], d["last_status"], d["last_error"]) for d in logged] == [
        ("DELIVERED", 200, None)
    ] * 2
    hosts = sorted(r.headers["Host"] for r in receiver.received)
    assert hosts == sorted(
        [f"127.0.0.1:{receiver.port}", f"slack-proxy.internal.test:{receiver.port}"]
    )
    for request in receiver.received:
        assert request.json["event"] == "test"
        assert render.SIGNATURE_HEADER in request.headers


def test_the_log_shows_the_status_never_the_body(
    api: Any,
    token: str,
    db_session: Session,
    receiver: WebhookReceiver,
    allow_networks: Callable[[str], None],
) -> None:
    allow_networks(RECEIVER_NETWORK)
    receiver.fail_next = [500]
    receiver.body = f'{{"Code": "Success", "SecretAccessKey": "{SECRET}"}}'.encode()
    body = {"url": receiver.url, "events": ["rollback"]}
    sid = call(api, token, "POST", "/v1/notifications", json=body).json()["id"]
    assert call(api, token, "POST", f"/v1/notifications/{sid}/test").status_code == 202
    with httpx.Client(timeout=5) as client:
        deliver_once(db_session, Settings(webhook_allowed_networks=RECEIVER_NETWORK), client)
    assert [r.status for r in receiver.received] == [500]  # it did answer with the secret
    answer = call(api, token, "GET", "/v1/notifications/deliveries")
    print(answer.json())
    [logged] = answer.json()
    assert logged["last_status"] == 500 and logged["state"] == "PENDING"
    assert SECRET not in answer.text


def test_what_a_service_that_is_not_http_says_is_not_logged(db_session: Session) -> None:
    """An allowed internal address whose port is not a web server (SSH, Redis): its banner,
    which an HTTP parser's error quotes, is not in the log."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def banner() -> None:
        conn, _ = listener.accept()
        with conn:
            # The whole request first: closing on one half read would reset the connection.
            reader = conn.makefile("rb")
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            reader.read(length)
            conn.sendall(f"SSH-2.0-OpenSSH_9.6 {SECRET}\r\n".encode())

    thread = threading.Thread(target=banner, daemon=True)
    thread.start()
    subscription = subscribe(db_session, "vision", f"http://127.0.0.1:{port}/", ["rollback"])
    row = queue(db_session, subscription)
    with httpx.Client(timeout=5) as client:
        deliver_once(db_session, Settings(webhook_allowed_networks=RECEIVER_NETWORK), client)
    thread.join(timeout=5)
    listener.close()
    print(row.last_error)
    assert row.last_status is None and row.last_error == "not an HTTP answer"


def test_a_redirect_is_not_followed(db_session: Session) -> None:
    """A public receiver that answers 302 to the metadata service: a failed try with its
    status, and one request only, whatever the client's own redirect setting."""
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(302, headers={"Location": "http://169.254.169.254/latest/"})

    transport = httpx.MockTransport(answer)
    url = f"https://{PUBLIC_ADDRESS}/hook"
    subscription = subscribe(db_session, "vision", url, ["rollback"])
    row = queue(db_session, subscription)
    with httpx.Client(transport=transport, follow_redirects=True) as client:
        deliver_once(db_session, Settings(), client)
    assert [str(r.url) for r in seen] == [url]
    assert (row.last_status, row.last_error) == (302, "redirect not followed")


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", AddressKind.LOOPBACK),
        ("::1", AddressKind.LOOPBACK),
        ("169.254.169.254", AddressKind.LINK_LOCAL),
        ("fe80::1", AddressKind.LINK_LOCAL),
        ("10.1.2.3", AddressKind.PRIVATE),
        ("172.16.0.1", AddressKind.PRIVATE),
        ("192.168.1.1", AddressKind.PRIVATE),
        ("fd00::1", AddressKind.PRIVATE),
        ("0.0.0.0", AddressKind.UNSPECIFIED),
        ("::", AddressKind.UNSPECIFIED),
        ("224.0.0.1", AddressKind.MULTICAST),
        ("ff02::1", AddressKind.MULTICAST),
        ("240.0.0.1", AddressKind.RESERVED),
        ("100.64.0.1", AddressKind.NON_PUBLIC),
        ("::ffff:127.0.0.1", AddressKind.LOOPBACK),
        ("::ffff:169.254.169.254", AddressKind.LINK_LOCAL),
        ("64:ff9b::a00:1", AddressKind.PRIVATE),  # NAT64 of 10.0.0.1
        (PUBLIC_ADDRESS, None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_each_kind_of_address(address: str, kind: AddressKind | None) -> None:
    assert egress.refused_kind(ip_address(address)) == kind


def test_an_allowed_network_covers_the_ipv4_mapped_form() -> None:
    networks = Settings(webhook_allowed_networks=" 127.0.0.0/8, fd00::/8 ").webhook_networks
    assert egress.in_networks(ip_address("::ffff:127.0.0.1"), networks)
    assert egress.in_networks(ip_address("fd00::5"), networks)
    assert not egress.in_networks(ip_address("10.0.0.1"), networks)


def test_a_network_that_is_not_one_refuses_the_settings() -> None:
    with pytest.raises(ValidationError, match="not a network"):
        Settings(webhook_allowed_networks="10.0.0.0/8,10.0.0.0/33")
