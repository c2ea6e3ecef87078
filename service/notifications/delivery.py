"""Delivering the outbox: at least once, with retries and backoff, never inside a transaction.

Each pass (service/notifications/loop.py) claims the deliveries that are due by leasing
them (one short transaction, `FOR UPDATE SKIP LOCKED`, so any number of service processes
can deliver side by side without sending one row twice at once), POSTs each with no
transaction open, and records each answer in a transaction of its own. A process killed
between the POST and the record leaves the lease to expire, and the delivery is sent
again: a receiver may see a delivery twice (the X-Runyard-Delivery id tells), never zero
times. A 2xx is DELIVERED; anything else is tried again after
notify_retry_base_s * 2^(tries-1), at most notify_retry_max_s, until
notify_give_up_after_s after the event (GAVE_UP).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import session_scope
from service.models import (
    DeliveryState,
    NotificationDelivery,
    NotificationFormat,
    NotificationSubscription,
)
from service.models.base import utcnow
from service.notifications import render

log = logging.getLogger(__name__)

CLAIM_BATCH = 50  # deliveries leased per pass; a pass sends them one after another


@dataclass(frozen=True)
class Claimed:
    """A leased delivery, with what sending it needs (read in the claiming transaction)."""

    id: int
    url: str
    secret: str
    format: NotificationFormat
    event: str
    payload: dict[str, Any]
    num_tries: int
    age_s: float


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: no answer (refused, timed out)
    error: str | None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def backoff_s(num_tries: int, settings: Settings) -> float:
    """The wait after the `num_tries`-th failed try: doubling, capped."""
    return min(
        settings.notify_retry_base_s * 2 ** max(num_tries - 1, 0), settings.notify_retry_max_s
    )


def claim_due(session: Session, settings: Settings, limit: int = CLAIM_BATCH) -> list[Claimed]:
    """Lease the oldest due deliveries for one send each (long enough for all of them)."""
    now = utcnow()
    due = (
        select(NotificationDelivery, NotificationSubscription)
        .join(NotificationSubscription)
        .where(
            NotificationDelivery.state == DeliveryState.PENDING,
            NotificationDelivery.next_try_at <= now,
            (NotificationDelivery.leased_until.is_(None))
            | (NotificationDelivery.leased_until < now),
        )
        .order_by(NotificationDelivery.id)
        .limit(limit)
        .with_for_update(of=NotificationDelivery, skip_locked=True)
    )
    rows = session.execute(due).all()
    claimed = []
    for position, (delivery, subscription) in enumerate(rows, start=1):
        # Sent one after another: the n-th waits for the n-1 before it, each at most a
        # timeout. A process that dies leaves each row to be taken again that much later.
        delivery.leased_until = now + timedelta(seconds=(settings.notify_timeout_s + 1) * position)
        claimed.append(
            Claimed(
                id=delivery.id,
                url=subscription.url,
                secret=subscription.secret,
                format=subscription.format,
                event=delivery.event.value,
                payload=delivery.payload,
                num_tries=delivery.num_tries,
                age_s=(now - delivery.created_at).total_seconds(),
            )
        )
    return claimed


def send(client: httpx.Client, item: Claimed) -> Answer:
    """One POST, signed; never raises."""
    content = render.body(item.payload, item.format, item.id)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "runyard-notify/1",
        render.SIGNATURE_HEADER: render.signature(item.secret, int(time.time()), content),
        render.DELIVERY_HEADER: str(item.id),
        render.EVENT_HEADER: item.event,
    }
    try:
        response = client.post(item.url, content=content, headers=headers)
    except httpx.HTTPError as exc:
        return Answer(None, f"{type(exc).__name__}: {exc}"[:500])
    error = None if response.is_success else response.text[:500]
    return Answer(response.status_code, error)


def record(session: Session, item: Claimed, answer: Answer, settings: Settings) -> None:
    """The answer to one try: DELIVERED, or when to try again, or GAVE_UP."""
    now = utcnow()
    tries = item.num_tries + 1
    values: dict[str, Any] = {
        "num_tries": tries,
        "last_status": answer.status,
        "last_error": answer.error,
        "last_tried_at": now,
        "leased_until": None,
    }
    if answer.ok:
        values |= {"state": DeliveryState.DELIVERED, "delivered_at": now}
    elif item.age_s >= settings.notify_give_up_after_s:
        values |= {"state": DeliveryState.GAVE_UP}
    else:
        values |= {"next_try_at": now + timedelta(seconds=backoff_s(tries, settings))}
    session.execute(
        update(NotificationDelivery).where(NotificationDelivery.id == item.id).values(**values)
    )


def deliver_due(settings: Settings, client: httpx.Client) -> int:
    """One pass: claim, send each, record each; how many were tried."""
    with session_scope() as session:
        claimed = claim_due(session, settings)
    for item in claimed:
        answer = send(client, item)  # no transaction open
        if not answer.ok:
            log.warning(
                "notification %s to %s: %s (try %d)",
                item.id,
                item.url.split("?")[0],
                answer.status or answer.error,
                item.num_tries + 1,
            )
        with session_scope() as session:
            record(session, item, answer, settings)
    return len(claimed)
