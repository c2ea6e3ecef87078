"""Notifications: webhook deliveries from the outbox, and the networks they may reach."""

from __future__ import annotations

from ipaddress import IPv4Network, IPv6Network, ip_network

from pydantic import Field, field_validator

from service.config_areas.base import AreaSettings


class NotificationSettings(AreaSettings):
    """Notifications (webhooks).

    Webhooks delivered from a Postgres outbox (service/notifications/): how often it is
    read, each POST's timeout, the retries and when they give up, and which internal
    networks a webhook may reach besides public addresses."""

    notify_interval_s: float = Field(
        default=1.0, gt=0, description="How often the outbox is read for deliveries due."
    )
    notify_timeout_s: float = Field(default=10.0, gt=0, description="One webhook POST's timeout.")
    notify_retry_base_s: float = Field(
        default=2.0,
        gt=0,
        description="First wait before a failed delivery is tried again; doubles per try.",
    )
    notify_retry_max_s: float = Field(
        default=300.0, gt=0, description="Longest wait between two tries of one delivery."
    )
    notify_give_up_after_s: float = Field(
        default=86400.0,
        gt=0,
        description="A delivery not answered 2xx this long after its event is GAVE_UP.",
    )
    webhook_allowed_networks: str = Field(
        default="",
        description="Comma-separated CIDRs webhooks may reach besides public addresses (e.g. "
        "an internal Slack proxy's 10.20.0.0/24). Loopback, link-local (cloud metadata), "
        "private, carrier-grade NAT, multicast and reserved addresses are refused otherwise, "
        "when a notification is added and at each delivery.",
    )

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _cidrs(cls, text: str) -> str:
        # A typo refuses the service's start, not every delivery to the network it meant.
        for cidr in _split_cidrs(text):
            try:
                ip_network(cidr, strict=False)
            except ValueError as exc:
                raise ValueError(f"{cidr!r} is not a network (e.g. 10.20.0.0/24): {exc}") from exc
        return text

    @property
    def webhook_networks(self) -> list[IPv4Network | IPv6Network]:
        """webhook_allowed_networks, parsed (10.20.0.5/24 is taken as 10.20.0.0/24)."""
        return [
            ip_network(cidr, strict=False) for cidr in _split_cidrs(self.webhook_allowed_networks)
        ]


def _split_cidrs(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]
