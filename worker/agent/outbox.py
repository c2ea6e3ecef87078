"""A durable, ordered outbox on local disk (SQLite), plus the agent's read positions.

Events are queued and the read position that produced them is saved in one transaction, so
an agent killed at any point neither loses a kernel line nor reports it twice; the service
stores each event once by its idempotency key, so re-delivery after a crash is harmless.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any


class Outbox:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY "
                "AUTOINCREMENT, key TEXT UNIQUE, payload TEXT NOT NULL)"
            )
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS positions (source TEXT PRIMARY KEY, "
                "value TEXT NOT NULL)"
            )

    def put(
        self,
        events: list[dict[str, Any]],
        source: str | None = None,
        position: dict[str, Any] | None = None,
    ) -> None:
        """Queue `events` and, atomically with them, remember how far `source` was read."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for event in events:
                    self._db.execute(
                        "INSERT OR IGNORE INTO events (key, payload) VALUES (?, ?)",
                        (event["idempotency_key"], json.dumps(event)),
                    )
                if source is not None:
                    self._db.execute(
                        "INSERT OR REPLACE INTO positions VALUES (?, ?)",
                        (source, json.dumps(position)),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def position(self, source: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT value FROM positions WHERE source = ?", (source,)
            ).fetchone()
        return json.loads(row[0]) if row else None

    def peek(self, limit: int) -> list[tuple[int, dict[str, Any]]]:
        """The oldest `limit` undelivered events, in order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, payload FROM events ORDER BY id LIMIT ?", (limit,)
            ).fetchall()
        return [(row_id, json.loads(payload)) for row_id, payload in rows]

    def ack(self, up_to_id: int) -> None:
        with self._lock:
            self._db.execute("DELETE FROM events WHERE id <= ?", (up_to_id,))

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM events").fetchone()[0])
