"""`runyard run logs`: one rank's output across attempts, optionally followed live.

Reads in chunks from byte offsets (GET /v1/runs/{id}/logs), so following a log is polling
for what came after the last offset; a header line marks where each attempt starts, the
way `tail` marks files.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from client.api import RunyardClient

Write = Callable[[str], None]
ENDED_ATTEMPT = ("SUCCEEDED", "FAILED", "CANCELLED")
ENDED_RUN = ("SUCCEEDED", "FAILED", "CANCELLED")


def read_attempt(
    client: RunyardClient,
    run_id: int,
    attempt: int,
    rank: int,
    write: Write,
    *,
    follow: bool,
    interval_s: float = 1.0,
) -> dict[str, Any]:
    """Write one attempt's output for `rank`; with `follow`, until the attempt has ended."""
    offset = 0
    while True:
        chunk = client.run_logs(run_id, attempt=attempt, rank=rank, offset=offset)
        if chunk["text"]:
            write(chunk["text"])
        offset = chunk["next_offset"]
        if chunk["text"] and offset < chunk["size_bytes"]:
            continue  # more is already there: no need to wait
        # The attempt's state is read before its file, so once it has ended the read
        # above saw everything the rank wrote.
        if not follow or chunk["attempt_state"] in ENDED_ATTEMPT:
            return chunk
        time.sleep(interval_s)


def show_logs(
    client: RunyardClient,
    run_id: int,
    write: Write,
    header: Write,
    *,
    rank: int = 0,
    attempt: int | None = None,
    follow: bool = False,
    interval_s: float = 1.0,
) -> None:
    """One attempt if `attempt` is given, else every attempt in order; with `follow`, keep
    going into new attempts until the run ends."""
    if attempt is not None:
        read_attempt(client, run_id, attempt, rank, write, follow=follow, interval_s=interval_s)
        return
    number = 1
    while True:
        probe = client.run_logs(run_id, rank=rank, limit=1)
        latest = probe["latest_attempt"]
        if latest is not None and number <= latest:
            header(f"==> run {run_id} attempt {number} rank {rank} <==")
            last = read_attempt(
                client, run_id, number, rank, write, follow=follow, interval_s=interval_s
            )
            if not last["exists"]:
                header("(no output: the rank never started)")
            number += 1
            continue
        if not follow or probe["run_state"] in ENDED_RUN:
            if latest is None:
                header(f"run {run_id} has no attempt yet ({probe['run_state']})")
            return
        time.sleep(interval_s)  # between attempts: wait for the next one to be submitted
