"""The background reconcile loop: one per database, guarded by a Postgres advisory lock."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import text

from service.config import Settings
from service.db import get_engine, session_scope
from service.nodes.service import sync_from_slurm
from service.reconcile import attempts
from service.slurm import commands

log = logging.getLogger(__name__)

ADVISORY_LOCK_KEY = 0x72756E79  # "runy": only one reconciler acts on a database at a time
NODE_SYNC_EVERY_S = 5.0


def sync_nodes() -> None:
    nodes, switches = commands.show_nodes(), commands.node_switches()
    with session_scope() as session:
        sync_from_slurm(session, nodes, switches)


def tick(settings: Settings) -> None:
    """One pass over everything that may need action."""
    attempts.submit_pending(settings)
    attempts.stop_cancelling()
    attempts.poll_attempts()


def run_forever(settings: Settings, stop: threading.Event) -> None:
    """Hold the advisory lock on a dedicated connection, then tick until `stop` is set."""
    with get_engine().connect() as lock_conn:
        while not stop.is_set():
            got = lock_conn.execute(
                text("SELECT pg_try_advisory_lock(:k)"), {"k": ADVISORY_LOCK_KEY}
            ).scalar()
            lock_conn.commit()
            if got:
                break
            stop.wait(settings.reconcile_interval_s)
        log.info(
            "reconciler holds the lock; reconciling every %.1f s", settings.reconcile_interval_s
        )
        last_node_sync = 0.0
        while not stop.is_set():
            started = time.monotonic()
            try:
                if started - last_node_sync >= NODE_SYNC_EVERY_S:
                    sync_nodes()
                    last_node_sync = started
                tick(settings)
            except Exception:  # one bad tick must not stop recovery for every other run
                log.exception("reconcile tick failed; retrying next tick")
            stop.wait(max(0.0, settings.reconcile_interval_s - (time.monotonic() - started)))
