"""Subscriptions are a team's, like runs: a user sees and removes their team's; an admin all."""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.auth.principal import Principal
from service.errors import InvalidSpec, NotFound
from service.models import NotificationDelivery, NotificationEvent, NotificationSubscription
from service.models.base import utcnow
from service.notifications import egress
from service.notifications.egress import Network
from service.notifications.outbox import enqueue
from service.notifications.schemas import SubscriptionIn


def create(
    session: Session, spec: SubscriptionIn, principal: Principal, networks: Sequence[Network]
) -> NotificationSubscription:
    """A subscription for the caller's team, once its URL reaches only allowed addresses."""
    # Before the session's first statement: the lookup is a network call, and none is made
    # while a transaction is open.
    try:
        egress.checked_addresses(httpx.URL(spec.url), networks)
    except (egress.Unreachable, httpx.InvalidURL) as refused:
        advice = (
            "; webhooks may only reach public addresses unless an admin allows the network "
            f"({egress.ALLOW_SETTING})"
            if isinstance(refused, egress.AddressRefused)
            else ""
        )
        raise InvalidSpec(f"url: {refused}{advice}") from refused
    subscription = NotificationSubscription(
        team=principal.team,
        owner=principal.user,
        url=spec.url,
        events=[e.value for e in spec.events],
        format=spec.format,
        secret=secrets.token_hex(32),
    )
    session.add(subscription)
    session.flush()
    return subscription


def visible(session: Session, principal: Principal) -> Sequence[NotificationSubscription]:
    query = select(NotificationSubscription).where(NotificationSubscription.removed_at.is_(None))
    if not principal.is_admin:
        query = query.where(NotificationSubscription.team == principal.team)
    return session.scalars(query.order_by(NotificationSubscription.id)).all()


def require(
    session: Session, subscription_id: int, principal: Principal
) -> NotificationSubscription:
    missing = f"no notification {subscription_id}; `runyard notify list` shows your team's"
    subscription = session.get(NotificationSubscription, subscription_id)
    if subscription is None or subscription.removed_at is not None:
        raise NotFound(missing)
    principal.require_team_of(subscription.team, missing)
    return subscription


def remove(session: Session, subscription_id: int, principal: Principal) -> None:
    """Stop sending; its delivery log stays readable (`runyard notify log`)."""
    require(session, subscription_id, principal).removed_at = utcnow()


def send_test(session: Session, subscription_id: int, principal: Principal) -> None:
    """Queue a `test` event for one subscription: the whole path, outbox to receiver."""
    subscription = require(session, subscription_id, principal)
    now = utcnow()
    payload = {
        "event": NotificationEvent.TEST.value,
        "at": now.isoformat(),
        "team": subscription.team,
        "run": None,
        "what": f"a test from {principal.user}: this subscription reaches you",
        "node": None,
        "reason": None,
        "look": f"runyard notify log --id {subscription.id}",
    }
    enqueue(
        session,
        subscription.team,
        NotificationEvent.TEST,
        f"test:{subscription.id}:{now.timestamp()}",
        payload,
        only_subscription=subscription.id,
    )


def deliveries(
    session: Session, principal: Principal, subscription_id: int | None, limit: int
) -> Sequence[NotificationDelivery]:
    """The delivery log, newest first."""
    query = select(NotificationDelivery)
    if subscription_id is not None:
        require(session, subscription_id, principal)
        query = query.where(NotificationDelivery.subscription_id == subscription_id)
    if not principal.is_admin:
        query = query.where(NotificationDelivery.team == principal.team)
    return session.scalars(query.order_by(NotificationDelivery.id.desc()).limit(limit)).all()
