"""/v1/notifications: a team's webhooks and their delivery log."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from service.auth.deps import USERS, PrincipalDep
from service.config import get_settings
from service.db import SessionDep
from service.errors import DbId
from service.notifications import service
from service.notifications.schemas import (
    DeliveryOut,
    SubscriptionCreated,
    SubscriptionIn,
    SubscriptionOut,
)

router = APIRouter(prefix="/v1/notifications", tags=["notifications"], dependencies=[USERS])


@router.post("", status_code=status.HTTP_201_CREATED)
def add(spec: SubscriptionIn, session: SessionDep, principal: PrincipalDep) -> SubscriptionCreated:
    """Send your team's events to a URL (JSON or Slack), signed; the secret is shown once."""
    networks = get_settings().webhook_networks
    subscription = service.create(session, spec, principal, networks)
    return SubscriptionCreated.model_validate(subscription)


@router.get("")
def list_(session: SessionDep, principal: PrincipalDep) -> list[SubscriptionOut]:
    """Your team's subscriptions (an admin's: everyone's)."""
    return [SubscriptionOut.model_validate(s) for s in service.visible(session, principal)]


@router.delete("/{subscription_id}")
def remove(subscription_id: DbId, session: SessionDep, principal: PrincipalDep) -> dict[str, int]:
    """Stop sending to this subscription; its delivery log stays."""
    service.remove(session, subscription_id, principal)
    return {"removed": subscription_id}


@router.post("/{subscription_id}/test", status_code=status.HTTP_202_ACCEPTED)
def test(subscription_id: DbId, session: SessionDep, principal: PrincipalDep) -> dict[str, int]:
    """Queue a test event for this subscription (see it in the delivery log)."""
    service.send_test(session, subscription_id, principal)
    return {"queued_for": subscription_id}


@router.get("/deliveries")
def deliveries(
    session: SessionDep,
    principal: PrincipalDep,
    subscription_id: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[DeliveryOut]:
    """The delivery log, newest first: each event, its tries and the receiver's last answer."""
    rows = service.deliveries(session, principal, subscription_id, limit)
    return [DeliveryOut.model_validate(d) for d in rows]
