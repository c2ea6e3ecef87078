"""The delivery thread of each service process: the outbox every notify_interval_s, and
every minute the judges that queue events nothing else raises as it happens (goodput.low,
service/runs/goodput_low.py, handed in by service/integrations.py). Deliveries are leased
row by row (delivery.py), so every replica may run this loop at once; no leader lock is
needed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

import httpx
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import session_scope
from service.notifications.delivery import deliver_due

log = logging.getLogger(__name__)

# A judge queues the events it finds due, in the session it is given; how many it queued.
Judge = Callable[[Session, Settings], int]
JUDGE_EVERY_S = 60.0  # goodput moves over hours; its alert waits an hour


def run_forever(settings: Settings, stop: threading.Event, judges: Sequence[Judge]) -> None:
    """Deliver until `stop` is set; a failing pass is logged and tried again next interval."""
    last_judged = 0.0
    with httpx.Client(timeout=settings.notify_timeout_s, follow_redirects=False) as client:
        while not stop.is_set():
            try:
                if time.monotonic() - last_judged >= JUDGE_EVERY_S:
                    with session_scope() as session:
                        for judge in judges:
                            judge(session, settings)
                    last_judged = time.monotonic()
                while deliver_due(settings, client) and not stop.is_set():
                    pass  # a full batch: the next is likely due too
            except Exception:  # Postgres down: the next pass tries again
                log.exception("notification pass failed; retrying")
            stop.wait(settings.notify_interval_s)
