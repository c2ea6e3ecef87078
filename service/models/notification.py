"""Webhook subscriptions and their outbox (service/notifications/)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Enum,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, Timestamped, utcnow


class NotificationEvent(StrEnum):
    """What a subscription can ask to hear about."""

    RUN_FAILED = "run.failed"
    RUN_SUCCEEDED = "run.succeeded"
    RUN_MOVED = "run.moved"  # a spare took a failed node's place
    INCIDENT_OPENED = "incident.opened"  # a failure touched one of the team's runs
    ROLLBACK = "rollback"  # rolled back past a loss spike, a NaN or silent data corruption
    GOODPUT_LOW = "goodput.low"  # below the plan's goodput after the first hour
    TEST = "test"  # `runyard notify test`: always delivered to the one subscription asked


class NotificationFormat(StrEnum):
    JSON = "json"  # the event as JSON, for your own receiver
    SLACK = "slack"  # a Slack incoming-webhook message (text and blocks)


class DeliveryState(StrEnum):
    PENDING = "PENDING"  # not delivered yet (retried with backoff)
    DELIVERED = "DELIVERED"  # the receiver answered 2xx
    GAVE_UP = "GAVE_UP"  # no 2xx within notify_give_up_after_s


class NotificationSubscription(Timestamped, Base):
    """A team's webhook: which events go to which URL, in which format, signed with `secret`."""

    __tablename__ = "notification_subscriptions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    team: Mapped[str] = mapped_column(String(64), index=True)
    owner: Mapped[str] = mapped_column(String(64))
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(ARRAY(String(32)))
    format: Mapped[NotificationFormat] = mapped_column(
        Enum(
            NotificationFormat,
            name="notification_format",
            native_enum=False,
            length=8,
            values_callable=lambda cls: [member.value for member in cls],
        )
    )
    # The HMAC-SHA256 key of the X-Runyard-Signature header; shown once, when created.
    secret: Mapped[str] = mapped_column(String(128))
    removed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class NotificationDelivery(Base):
    """One event for one subscription: the outbox row, written in the transaction that
    recorded the event, and the delivery log an owner reads (`runyard notify log`)."""

    __tablename__ = "notification_deliveries"
    __table_args__ = (
        # The same event is queued once per subscription, however often it is seen.
        UniqueConstraint("subscription_id", "dedupe_key"),
        Index("ix_notification_deliveries_due", "state", "next_try_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    subscription_id: Mapped[int] = mapped_column(
        ForeignKey("notification_subscriptions.id", ondelete="CASCADE"), index=True
    )
    team: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    event: Mapped[NotificationEvent] = mapped_column(
        Enum(
            NotificationEvent,
            name="notification_event",
            native_enum=False,
            length=32,
            values_callable=lambda cls: [member.value for member in cls],
        )
    )
    dedupe_key: Mapped[str] = mapped_column(String(128))
    payload: Mapped[dict[str, Any]] = mapped_column(JSONB)
    state: Mapped[DeliveryState] = mapped_column(
        Enum(DeliveryState, name="delivery_state", native_enum=False, length=16),
        default=DeliveryState.PENDING,
    )
    num_tries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_try_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # A dispatcher that took the row sends it until then; past it (the process died
    # mid-send) another takes it again: delivered at least once.
    leased_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_status: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_tried_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
