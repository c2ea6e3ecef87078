"""The background work that talks to the outside: webhooks (service/notifications/) and
experiment trackers (service/tracking/). Each on threads of its own, started with the
reconciler, so a slow receiver or tracker never holds up the reconciler or a request."""

from __future__ import annotations

import threading

from service.config import Settings
from service.models import TrackerKind
from service.notifications import delivery_loop
from service.runs.goodput_low import enqueue_low_goodput
from service.tracking.export_loop import ExportLoop
from service.tracking.integration_gauges import register_collector


def start(settings: Settings, stop: threading.Event) -> list[threading.Thread]:
    """The notification thread and one exporter per tracker kind, until `stop` is set."""
    register_collector()
    threads = [
        threading.Thread(
            target=delivery_loop.run_forever,
            args=(settings, stop, [enqueue_low_goodput]),
            name="notifications",
            daemon=True,
        )
    ]
    for kind in TrackerKind:
        loop = ExportLoop(kind, settings)
        threads.append(
            threading.Thread(
                target=loop.run_forever, args=(stop,), name=f"export-{kind.value}", daemon=True
            )
        )
    for thread in threads:
        thread.start()
    return threads
