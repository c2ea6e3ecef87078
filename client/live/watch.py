"""`runyard run watch`: poll a run until it ends and say how it ended with the exit code.

Each poll asks only for what is new (events after the last id, metrics after the last
step), so watching a week-old run costs the same as watching a fresh one.

On a terminal the view redraws in place (rich's Live); into a pipe or a CI log it prints
each new event and a progress line whenever the step moved, since redraws would be noise.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.live import Live

from client.api import RunyardClient
from client.live.view import STATE_STYLE, progress_line, render
from client.output import Exit, short_time

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


# How `watch` exits: scripts (and `make demo`) branch on these.
EXIT_FOR_STATE = {
    "SUCCEEDED": Exit.OK,
    "FAILED": Exit.ERROR,
    "CANCELLED": Exit.RUN_CANCELLED,
}


def watch_run(
    client: RunyardClient,
    run_id: int,
    console: Console,
    interval_s: float = 2.0,
    timeout_s: float = 0.0,
) -> int:
    """Follow the run; return the exit code for how it ended (or STILL_RUNNING on timeout)."""
    feed = RunFeed(client, run_id)
    deadline = time.monotonic() + timeout_s if timeout_s else None
    if console.is_terminal:
        snapshot = _watch_live(feed, console, interval_s, deadline)
    else:
        snapshot = _watch_lines(feed, console, interval_s, deadline)
    run = snapshot.run
    if not snapshot.ended:
        console.print(f"run {run_id} still {run['state']} after {timeout_s:.0f} s")
        return Exit.STILL_RUNNING
    style = STATE_STYLE.get(run["state"], "")
    console.print(f"run {run_id} [{style}]{run['state']}[/]: {run['state_reason']}")
    return EXIT_FOR_STATE[run["state"]]


def _timed_out(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() > deadline


def _watch_live(
    feed: RunFeed, console: Console, interval_s: float, deadline: float | None
) -> RunSnapshot:
    snapshot, _ = feed.poll()
    width = min(console.width, 120)
    with Live(
        render(snapshot, width), console=console, auto_refresh=False, transient=False
    ) as live:
        while not snapshot.ended and not _timed_out(deadline):
            time.sleep(interval_s)
            snapshot, _ = feed.poll()
            live.update(render(snapshot, width), refresh=True)
    return snapshot


def _watch_lines(
    feed: RunFeed, console: Console, interval_s: float, deadline: float | None
) -> RunSnapshot:
    last_printed_step = -1
    while True:
        snapshot, fresh = feed.poll()
        for e in fresh:
            console.print(
                f"[cyan]{short_time(e['created_at'])}[/cyan] {e['kind']}: {e['message']}",
                highlight=False,
            )
        if snapshot.step != last_printed_step:
            console.print(progress_line(snapshot), highlight=False)
            last_printed_step = snapshot.step
        if snapshot.ended or _timed_out(deadline):
            return snapshot
        time.sleep(interval_s)
