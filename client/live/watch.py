"""`runyard run watch`: poll a run until it ends and say how it ended with the exit code.

The run comes from a feed that asks each poll only for what is new (client/live/feed.py).

On a terminal the view redraws in place (rich's Live); into a pipe or a CI log it prints
each new event and a progress line whenever the step moved, since redraws would be noise.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live

from client.api import RunyardClient
from client.live.feed import RunFeed, RunSnapshot
from client.live.view import STATE_STYLE, progress_line, render
from client.output import Exit, short_time

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
