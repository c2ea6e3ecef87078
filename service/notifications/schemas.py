"""What `runyard notify` sends and gets."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator

from service.models import DeliveryState, NotificationEvent, NotificationFormat

SUBSCRIBABLE = [e for e in NotificationEvent if e != NotificationEvent.TEST]


class SubscriptionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        min_length=8,
        max_length=2048,
        description="Where to POST: your receiver, or a Slack incoming-webhook URL.",
    )
    events: list[NotificationEvent] = Field(
        min_length=1,
        max_length=len(NotificationEvent),
        description="Any of " + ", ".join(e.value for e in SUBSCRIBABLE) + ".",
    )
    format: NotificationFormat = Field(
        default=NotificationFormat.JSON,
        description="json: the event as JSON; slack: a readable Slack message.",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")) or " " in url:
            raise ValueError("must be an http:// or https:// URL")
        return url

    @field_validator("events")
    @classmethod
    def _subscribable(cls, events: list[NotificationEvent]) -> list[NotificationEvent]:
        if NotificationEvent.TEST in events:
            raise ValueError("'test' is not subscribed to: `runyard notify test ID` sends one")
        return list(dict.fromkeys(events))


class SubscriptionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    team: str
    owner: str
    url: str
    events: list[str]
    format: NotificationFormat
    created_at: datetime


class SubscriptionCreated(SubscriptionOut):
    secret: str = Field(
        description="The HMAC-SHA256 key of the X-Runyard-Signature header. Shown only now."
    )


class DeliveryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    subscription_id: int
    run_id: int | None
    event: NotificationEvent
    state: DeliveryState
    num_tries: int
    last_status: int | None = Field(description="The receiver's last HTTP status (None: none).")
    last_error: str | None
    created_at: datetime
    last_tried_at: datetime | None
    next_try_at: datetime
    delivered_at: datetime | None
