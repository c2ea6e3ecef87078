"""Delivering the outbox: at least once, with retries and backoff, never inside a transaction.

Each pass (service/notifications/delivery_loop.py) claims the deliveries that are due by
leasing them (one short transaction, `FOR UPDATE SKIP LOCKED`, so any number of service
processes can deliver side by side without sending one row twice at once), POSTs each with no
transaction open, and records each answer in a transaction of its own. A process killed
between the POST and the record leaves the lease to expire, and the delivery is sent
again: a receiver may see a delivery twice (the X-Runyard-Delivery id tells), never zero
times. A 2xx is DELIVERED; anything else is tried again after
notify_retry_base_s * 2^(tries-1), at most notify_retry_max_s, until
notify_give_up_after_s after the event (GAVE_UP).

A POST goes only to an address egress.py allowed a moment before (a refused one is a failed
try, never sent), follows no redirect, and leaves in the log the receiver's status and our
own words for what went wrong, never what the receiver answered (issue 38).
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
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
from service.notifications import egress, render
from service.notifications.egress import Network

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


class Failure(StrEnum):
    """Why a try failed, in the delivery log's words: ours, never the receiver's (its body,
    or the banner of whatever else answered, is not shown to the team: issue 38)."""

    REFUSED = "refused"  # an address webhooks may not reach (egress.py); nothing was sent
    UNRESOLVED = "unresolved"
    TIMEOUT = "timeout"
    UNREACHABLE = "could not connect"
    TLS = "TLS handshake failed"
    NOT_HTTP = "not an HTTP answer"
    TRANSPORT = "transport error"
    REDIRECT = "redirect not followed"  # the POST goes to the URL checked, nowhere else
    STATUS = "not 2xx"


@dataclass(frozen=True)
class Answer:
    status: int | None  # the receiver's HTTP status; None: no answer (refused, timed out)
    failure: Failure | None = None
    detail: str | None = None  # our own words (which address was refused), never a body

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def error(self) -> str | None:
        """What the delivery log says beside the status."""
        if self.failure is None or self.failure == Failure.STATUS:
            return None  # delivered, or the status says it all
        return f"{self.failure}: {self.detail}" if self.detail else str(self.failure)


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


def send(client: httpx.Client, item: Claimed, networks: Sequence[Network]) -> Answer:
    """One POST, signed, to an address checked just now; never raises.

    The name is resolved here and the connection made to a checked address, the URL's own
    Host header and TLS name (SNI, certificate check) kept: checking the name and letting
    httpx resolve it again would leave a rebinding name free to answer 127.0.0.1 the second
    time. Public httpx (the address in the URL, `sni_hostname`), no private transport.
    """
    url = httpx.URL(item.url)
    try:
        addresses = egress.checked_addresses(url, networks)
    except egress.NotResolved as exc:
        return Answer(None, Failure.UNRESOLVED, str(exc))
    except egress.Unreachable as exc:
        return Answer(None, Failure.REFUSED, str(exc))
    content = render.body(item.payload, item.format, item.id)
    headers = {
        "Host": url.netloc.decode("ascii"),
        # One connection per POST: the pool knows connections by address, and one whose
        # certificate was checked for another name at the same address must not be reused.
        "Connection": "close",
        "Content-Type": "application/json",
        "User-Agent": "runyard-notify/1",
        render.SIGNATURE_HEADER: render.signature(item.secret, int(time.time()), content),
        render.DELIVERY_HEADER: str(item.id),
        render.EVENT_HEADER: item.event,
    }
    answer = Answer(None, Failure.UNREACHABLE)
    for address in addresses:  # the next address only when this one took no connection
        try:
            # Streamed and closed unread: the status is all we keep, so the body (however
            # large) is never read.
            with client.stream(
                "POST",
                url.copy_with(host=str(address)),
                content=content,
                headers=headers,
                extensions={"sni_hostname": egress.url_host(url)},
                follow_redirects=False,
            ) as response:
                status, redirect = response.status_code, response.is_redirect
        except httpx.ConnectError as exc:
            answer = _not_connected(exc)
            continue
        except httpx.HTTPError as exc:
            return _no_answer(exc)
        if redirect:
            return Answer(status, Failure.REDIRECT)
        return Answer(status, None if 200 <= status < 300 else Failure.STATUS)
    return answer


def _not_connected(exc: httpx.ConnectError) -> Answer:
    cause: BaseException | None = exc
    while cause is not None:  # httpx's error wraps httpcore's, which wraps the socket's
        if isinstance(cause, ssl.SSLCertVerificationError):
            return Answer(None, Failure.TLS, cause.verify_message)
        if isinstance(cause, ssl.SSLError):
            return Answer(None, Failure.TLS)
        if isinstance(cause, OSError) and cause.errno is not None:
            return Answer(None, Failure.UNREACHABLE, cause.strerror or os.strerror(cause.errno))
        cause = cause.__cause__ or cause.__context__
    return Answer(None, Failure.UNREACHABLE)


def _no_answer(exc: httpx.HTTPError) -> Answer:
    # The exception's text is not kept: a protocol error quotes what the peer sent.
    if isinstance(exc, httpx.TimeoutException):
        return Answer(None, Failure.TIMEOUT)
    if isinstance(exc, httpx.ProtocolError):
        return Answer(None, Failure.NOT_HTTP)
    return Answer(None, Failure.TRANSPORT, type(exc).__name__)


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
        answer = send(client, item, settings.webhook_networks)  # no transaction open
        if not answer.ok:
            log.warning(
                "notification %s to %s: %s (try %d)",
                item.id,
                item.url.split("?")[0],
                " ".join(str(part) for part in (answer.status, answer.error) if part),
                item.num_tries + 1,
            )
        with session_scope() as session:
            record(session, item, answer, settings)
    return len(claimed)
