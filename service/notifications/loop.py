"""The delivery thread of each service process: the outbox every notify_interval_s, the
goodput judgement every minute. Deliveries are leased row by row (delivery.py), so every
replica may run this loop at once; no leader lock is needed."""

from __future__ import annotations

import logging
import threading
import time

import httpx

from service.config import Settings
from service.db import session_scope
from service.notifications.delivery import deliver_due
from service.notifications.goodput import enqueue_low_goodput

log = logging.getLogger(__name__)

GOODPUT_EVERY_S = 60.0  # goodput moves over hours; its alert waits an hour


def run_forever(settings: Settings, stop: threading.Event) -> None:
    """Deliver until `stop` is set; a failing pass is logged and tried again next interval."""
    last_goodput = 0.0
    with httpx.Client(timeout=settings.notify_timeout_s, follow_redirects=False) as client:
        while not stop.is_set():
            try:
                if time.monotonic() - last_goodput >= GOODPUT_EVERY_S:
                    with session_scope() as session:
                        enqueue_low_goodput(session, settings)
                    last_goodput = time.monotonic()
                while deliver_due(settings, client) and not stop.is_set():
                    pass  # a full batch: the next is likely due too
            except Exception:  # Postgres down: the next pass tries again
                log.exception("notification pass failed; retrying")
            stop.wait(settings.notify_interval_s)
