"""What `runyard run watch` knows of a run: one poll's snapshot (what the live view draws,
client/live/view.py) and the feed that polls for it.

Each poll asks only for what is new (events after the last id, metrics after the last
step), so watching a week-old run costs the same as watching a fresh one.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from client.api import RunyardClient

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
EVENTS_PAGE = 1000
RECENT_STEPS = 30  # step times the ETA is estimated from


@dataclass
class RunSnapshot:
    """Everything the live view shows, as of one poll."""

    run: dict[str, Any]
    events: list[dict[str, Any]]
    step_times_s: list[float] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        return self.run["state"] in TERMINAL

    @property
    def step(self) -> int:
        return int(self.run["last_step"] or 0)

    @property
    def eta_s(self) -> float | None:
        """Remaining steps at the median recent step time (None until steps were seen)."""
        if self.ended or not self.step_times_s:
            return None
        return (self.run["total_steps"] - self.step) * statistics.median(self.step_times_s)

    @property
    def attempt(self) -> dict[str, Any] | None:
        return self.run["attempts"][-1] if self.run["attempts"] else None


class RunFeed:
    """Polls one run; keeps the last `keep_events` events and recent step times."""

    def __init__(self, client: RunyardClient, run_id: int, keep_events: int = 8) -> None:
        self.client, self.run_id = client, run_id
        self.events: deque[dict[str, Any]] = deque(maxlen=keep_events)
        self.step_times_s: deque[float] = deque(maxlen=RECENT_STEPS)
        self.last_event_id = 0
        self.last_step: int | None = None

    def new_events(self) -> list[dict[str, Any]]:
        """Events since the last poll, oldest first (pages through a long backlog)."""
        fresh: list[dict[str, Any]] = []
        while True:
            page = self.client.run_events(self.run_id, self.last_event_id, EVENTS_PAGE)
            fresh += page
            if page:
                self.last_event_id = page[-1]["id"]
            if len(page) < EVENTS_PAGE:
                return fresh

    def poll(self) -> tuple[RunSnapshot, list[dict[str, Any]]]:
        """The run now, plus the events that arrived since the previous poll."""
        run = self.client.get_run(self.run_id)
        fresh = self.new_events()
        self.events.extend(fresh)
        if self.last_step is None:
            # Start from recent steps only: the ETA needs a few, not the whole history.
            self.last_step = max((run["last_step"] or 0) - RECENT_STEPS, -1)
        metrics = self.client.run_metrics(self.run_id, after_step=self.last_step)
        for m in metrics:
            if m["step_time_s"]:
                self.step_times_s.append(m["step_time_s"])
        if metrics:
            self.last_step = max(m["step"] for m in metrics)
        return RunSnapshot(run, list(self.events), list(self.step_times_s)), fresh
