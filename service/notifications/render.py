"""What a receiver gets: the body in its subscription's format, and the signature headers.

Signature: `X-Runyard-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`.
A receiver recomputes it over the raw body with the secret `runyard notify add` printed,
compares in constant time, and refuses a `t` too far from its clock (a replayed request).
`X-Runyard-Delivery` is the delivery's id: a receiver that saw it already (at-least-once
delivery can repeat one after a crash) drops it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from service.models import NotificationEvent, NotificationFormat

SIGNATURE_HEADER = "X-Runyard-Signature"
DELIVERY_HEADER = "X-Runyard-Delivery"
EVENT_HEADER = "X-Runyard-Event"

HEADLINE = {
    NotificationEvent.RUN_FAILED.value: ":red_circle: run failed",
    NotificationEvent.RUN_SUCCEEDED.value: ":large_green_circle: run succeeded",
    NotificationEvent.RUN_MOVED.value: ":twisted_rightwards_arrows: run moved to a spare",
    NotificationEvent.INCIDENT_OPENED.value: ":warning: failure on a run's node",
    NotificationEvent.ROLLBACK.value: ":rewind: run rolled back",
    NotificationEvent.GOODPUT_LOW.value: ":chart_with_downwards_trend: goodput below plan",
    NotificationEvent.TEST.value: ":bell: test notification",
}


def signature(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={mac.hexdigest()}"


def verify(secret: str, header: str, body: bytes) -> bool:
    """What a receiver does (and the tests): the header's HMAC matches the body's."""
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    if "t" not in fields or "v1" not in fields or not fields["t"].isdigit():
        return False
    return hmac.compare_digest(signature(secret, int(fields["t"]), body), header)


def slack_text(payload: dict[str, Any]) -> str:
    """One readable message: the run, what happened, the node and reason, where to look."""
    run = payload.get("run") or {}
    headline = HEADLINE.get(payload["event"], payload["event"])
    who = f"run {run.get('id', '?')}, team {payload.get('team') or '?'}"
    lines = [f"*{headline}*: `{run.get('name', '?')}` ({who})"]
    lines.append(str(payload.get("what") or ""))
    details = []
    if payload.get("node"):
        details.append(f"node *{payload['node']}*")
    if payload.get("reason") and payload.get("reason") != payload.get("what"):
        details.append(f"reason: {payload['reason']}")
    if run.get("step") is not None:
        details.append(f"step {run['step']} of {run.get('total_steps')}")
    if details:
        lines.append(" · ".join(details))
    lines.append(f"Look: `{payload.get('look')}`")
    return "\n".join(line for line in lines if line)


def body(payload: dict[str, Any], fmt: NotificationFormat, delivery_id: int) -> bytes:
    """The request body for a subscription in `fmt`."""
    if fmt == NotificationFormat.SLACK:
        text = slack_text(payload)
        message: dict[str, Any] = {
            "text": text,  # the notification's preview, and what clients without blocks show
            "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
        }
    else:
        message = {**payload, "delivery_id": delivery_id}
    return json.dumps(message, sort_keys=True).encode()
