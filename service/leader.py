"""Who leads a loop only one replica may run: a Postgres advisory lock held by one session.

The reconcile loop takes ADVISORY_LOCK_KEY; each tracker's exporter a key of its own
(service/tracking/export_loop.py). Every replica serves the API; only the process whose database
session holds the lock reconciles. The lock lives exactly as long as that session, so a
leader whose process dies, or whose connection Postgres drops (a restart, a network cut,
`pg_terminate_backend`), loses it, and another replica takes it on its next try. The leader
must therefore ask, before it acts, whether its own session still holds the lock: a process
that kept ticking on the strength of a lock taken long ago would act beside the new leader
(two attempts submitted for one run, one node drained twice). `LeaderLock.held()` is that
question.
"""

from __future__ import annotations

import contextlib
import logging

from sqlalchemy import Connection, Engine, text

log = logging.getLogger(__name__)

ADVISORY_LOCK_KEY = 0x72756E79  # "runy": only one reconciler acts on a database at a time

# A bigint advisory key shows in pg_locks as classid (high 32 bits), objid (low 32 bits) and
# objsubid 1. Advisory locks are per database, so two runyard databases never contend. The key
# is cast to bigint first: psycopg sends a small int as int4, whose ">> 32" shifts by nothing.
_HELD = text(
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND pid = pg_backend_pid() AND database = (SELECT oid FROM pg_database"
    " WHERE datname = current_database()) AND objsubid = 1"
    " AND classid = (CAST(:k AS bigint) >> 32)::oid"
    " AND objid = (CAST(:k AS bigint) & 4294967295)::oid"
)


class LeaderLock:
    """The advisory lock on a connection of its own, taken and checked on that connection."""

    def __init__(self, engine: Engine, key: int = ADVISORY_LOCK_KEY) -> None:
        self.engine, self.key = engine, key
        self._conn: Connection | None = None

    def try_acquire(self) -> bool:
        """Take the lock if no other session holds it; False when taken or unreachable."""
        try:
            if self._conn is None:
                self._conn = self.engine.connect()
            got = bool(
                self._conn.execute(
                    text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}
                ).scalar()
            )
            self._conn.commit()
            return got
        except Exception as exc:  # Postgres down or restarting: try again next interval
            log.warning("leader lock: cannot reach Postgres (%s)", type(exc).__name__)
            self._drop()
            return False

    def held(self) -> bool:
        """Whether this session is alive and still holds the lock (one round trip).

        False, and the connection is dropped, when Postgres closed the session: the lock
        went with it and another replica may hold it now.
        """
        if self._conn is None:
            return False
        try:
            count = self._conn.execute(_HELD, {"k": self.key}).scalar()
            self._conn.commit()
        except Exception as exc:
            log.warning("leader lock: lost the lock's session (%s)", type(exc).__name__)
            self._drop()
            return False
        if not count:
            log.warning("leader lock: the session is alive but no longer holds the lock")
            self._drop()
            return False
        return True

    def release(self) -> None:
        """Give the lock back (closing the session releases it too)."""
        if self._conn is not None:
            with contextlib.suppress(Exception):  # a dead session holds nothing
                self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
                self._conn.commit()
        self._drop()

    def _drop(self) -> None:
        """Forget the connection; it is invalidated, never handed back to the pool holding
        the lock (a fresh session is taken on the next try)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        for close in (conn.invalidate, conn.close):
            with contextlib.suppress(Exception):  # already dead
                close()
