"""Notifications: the outbox row is written with the event (and rolled back with it),
delivered at least once to a real HTTP receiver with retries, backoff and a signature,
and subscriptions are a team's, like runs. Real Postgres; the receiver listens on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from ipaddress import ip_address
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from service.auth.service import create_token
from service.config import Settings
from service.models import (
    DeliveryState,
    NotificationDelivery,
    NotificationFormat,
    NotificationSubscription,
    RecoveryAction,
    Role,
    RunState,
)
from service.notifications import delivery, egress, render
from service.recovery.signals import open_incident
from service.runs.run_state_machine import set_run_state
from tests.conftest import wait_for
from tests.fixtures.rows import add_run
from tests.fixtures.webhook_receiver import WebhookReceiver

# The receivers listen on loopback, which webhooks may reach only where an admin allows it.
RECEIVER_NETWORK = "127.0.0.0/8"
PUBLIC_ADDRESS = "93.184.216.34"  # public (example.com's); what a name resolves to in tests


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    hook = WebhookReceiver()
    yield hook
    hook.close()


def subscribe(
    session: Session, team: str, url: str, events: list[str], fmt: str = "json"
) -> NotificationSubscription:
    subscription = NotificationSubscription(
        team=team,
        owner="ana",
        url=url,
        events=events,
        format=NotificationFormat(fmt),
        secret="s3cret-key",
    )
    session.add(subscription)
    session.flush()
    return subscription


def deliveries(session: Session) -> list[NotificationDelivery]:
    return list(session.scalars(select(NotificationDelivery).order_by(NotificationDelivery.id)))


def test_an_event_and_its_outbox_row_commit_or_roll_back_together(db_session: Session) -> None:
    mine = subscribe(db_session, "vision", "http://127.0.0.1:9/x", ["run.failed", "rollback"])
    subscribe(db_session, "vision", "http://127.0.0.1:9/y", ["run.succeeded"])  # not this one
    subscribe(db_session, "speech", "http://127.0.0.1:9/z", ["run.failed"])  # another team's
    run = add_run(db_session, RunState.RUNNING, team="vision", name="llama-vision")

    with db_session.begin_nested() as savepoint:  # the transaction that fails the run...
        set_run_state(db_session, run, RunState.FAILED, "no restarts left")
        db_session.flush()
        assert len(deliveries(db_session)) == 1
        savepoint.rollback()  # ...is rolled back: no notification of what did not happen
    db_session.expire_all()
    assert deliveries(db_session) == []

    set_run_state(db_session, run, RunState.FAILED, "no restarts left")
    db_session.flush()
    [queued] = deliveries(db_session)
    assert queued.subscription_id == mine.id and queued.state == DeliveryState.PENDING
    assert queued.payload["run"] == queued.payload["run"] | {
        "id": run.id,
        "name": "llama-vision",
        "state": "FAILED",
    }
    assert queued.payload["reason"] == "no restarts left"
    assert queued.payload["look"] == f"runyard run show {run.id}"


def test_an_incident_on_a_node_reaches_the_team_whose_run_holds_it(db_session: Session) -> None:
    subscribe(db_session, "vision", "http://127.0.0.1:9/x", ["incident.opened"])
    run = add_run(db_session, RunState.RUNNING, team="vision", nodes=["gpu017", "gpu018"])
    add_run(db_session, RunState.RUNNING, team="speech", nodes=["gpu020"])
    open_incident(
        db_session,
        kind="xid",
        signal="xid:79",
        action=RecoveryAction.DRAIN_AND_MOVE,
        message="gpu017: NVRM: Xid 79, GPU has fallen off the bus",
        cluster="default",
        node="gpu017",
    )
    db_session.flush()
    [queued] = deliveries(db_session)
    assert queued.run_id == run.id
    assert (queued.payload["node"], queued.payload["reason"]) == ("gpu017", "xid:79")
    text = render.slack_text(queued.payload)
    print(text)
    for needed in (
        "failure on a run's node",
        "seeded",
        "gpu017",
        "xid:79",
        f"runyard run show {run.id}",
    ):
        assert needed in text


def test_a_failing_receiver_gets_the_event_once_it_recovers(
    db_session: Session, receiver: WebhookReceiver
) -> None:
    """500 three times, then 200: four tries, doubling waits, every request signed."""
    settings = Settings(
        notify_retry_base_s=0.05,
        notify_retry_max_s=1.0,
        notify_timeout_s=5.0,
        webhook_allowed_networks=RECEIVER_NETWORK,
    )
    subscription = subscribe(db_session, "vision", receiver.url, ["run.succeeded"])
    run = add_run(db_session, RunState.RUNNING, team="vision")
    set_run_state(db_session, run, RunState.SUCCEEDED, "trained every step")
    db_session.flush()
    receiver.fail_next = [500, 500, 500]
    waits: list[float] = []
    with httpx.Client(timeout=settings.notify_timeout_s) as client:

        def one_pass() -> bool:
            for item in delivery.claim_due(db_session, settings):
                answer = delivery.send(client, item, settings.webhook_networks)
                delivery.record(db_session, item, answer, settings)
                row = db_session.get(NotificationDelivery, item.id)
                assert row is not None
                db_session.refresh(row)
                if row.state == DeliveryState.PENDING:
                    waits.append((row.next_try_at - row.last_tried_at).total_seconds())
            return bool(receiver.answered(200))

        wait_for("the receiver to answer 200", one_pass, timeout_s=20, interval_s=0.02)
    [row] = deliveries(db_session)
    print(f"tries {row.num_tries}, statuses {[r.status for r in receiver.received]}, waits {waits}")
    assert row.state == DeliveryState.DELIVERED and row.num_tries == 4 and row.last_status == 200
    assert [r.status for r in receiver.received] == [500, 500, 500, 200]
    assert waits == pytest.approx([0.05, 0.1, 0.2], abs=0.01)
    for request in receiver.received:
        header = request.headers[render.SIGNATURE_HEADER]
        assert render.verify(subscription.secret, header, request.body), header
        assert not render.verify("another-key", header, request.body)
        assert request.headers[render.DELIVERY_HEADER] == str(row.id)
        assert request.json["event"] == "run.succeeded" and request.json["run"]["id"] == run.id


def test_a_slack_subscription_gets_a_readable_message(
    db_session: Session, receiver: WebhookReceiver
) -> None:
    subscribe(db_session, "vision", receiver.url, ["rollback"], fmt="slack")
    run = add_run(db_session, RunState.RUNNING, team="vision", name="llama-70b")
    from service.runs.run_state_machine import record_event

    record_event(
        db_session,
        run,
        "run.rolled_back",
        "rolled back to step 1200 after a loss spike",
        data={"anomaly_step": 1234, "resume_step": 1200, "message": "loss 9.1 > 5 x median"},
    )
    db_session.flush()
    settings = Settings(webhook_allowed_networks=RECEIVER_NETWORK)
    with httpx.Client() as client:
        [item] = delivery.claim_due(db_session, settings)
        assert delivery.send(client, item, settings.webhook_networks).ok
    message = receiver.received[0].json
    print(message["text"])
    assert set(message) == {"text", "blocks"}
    for needed in (
        "rolled back",
        "llama-70b",
        "step 1200",
        "loss 9.1",
        f"runyard run show {run.id}",
    ):
        assert needed in message["text"]


@pytest.fixture(scope="module")
def team_tokens(database_url: str) -> dict[str, str]:
    """Committed user tokens of two teams (the API's auth reads its own transaction)."""
    engine = create_engine(database_url)
    with Session(engine) as s, s.begin():
        _, vision = create_token(s, user="ana", team="vision-n", role=Role.USER)
        _, speech = create_token(s, user="bo", team="speech-n", role=Role.USER)
    engine.dispose()
    return {"vision": vision, "speech": speech}


def call(api: Any, token: str, method: str, path: str, **kwargs: Any) -> Any:
    return api.request(method, path, headers={"Authorization": f"Bearer {token}"}, **kwargs)


def test_subscriptions_are_a_teams_own(
    api: Any, team_tokens: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    vision, speech = team_tokens["vision"], team_tokens["speech"]
    monkeypatch.setattr(egress, "resolve", lambda host: [ip_address(PUBLIC_ADDRESS)])
    created = call(
        api,
        vision,
        "POST",
        "/v1/notifications",
        json={"url": "https://hooks.slack.test/T/B/x", "events": ["run.failed"], "format": "slack"},
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["team"] == "vision-n" and len(body["secret"]) == 64
    listed = call(api, vision, "GET", "/v1/notifications").json()
    assert [s["id"] for s in listed] == [body["id"]] and "secret" not in listed[0]
    assert call(api, speech, "GET", "/v1/notifications").json() == []
    assert call(api, speech, "DELETE", f"/v1/notifications/{body['id']}").status_code == 404
    assert call(api, vision, "DELETE", f"/v1/notifications/{body['id']}").status_code == 200
    assert call(api, vision, "GET", "/v1/notifications").json() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "ftp://x.test/hook", "events": ["run.failed"]}, "url"),
        ({"url": "https://x.test/hook", "events": ["run.exploded"]}, "events.0"),
        ({"url": "https://x.test/hook", "events": []}, "events"),
        ({"url": "https://x.test/hook", "events": ["run.failed"], "format": "xml"}, "format"),
    ],
)
def test_a_bad_subscription_is_refused_naming_the_field(
    api: Any, team_tokens: dict[str, str], body: dict[str, Any], field: str
) -> None:
    refused = call(api, team_tokens["vision"], "POST", "/v1/notifications", json=body)
    assert refused.status_code == 422
    assert [p["field"] for p in refused.json()["problems"]] == [field], refused.json()
