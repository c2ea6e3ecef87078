"""Fault injection on the dev cluster: what a node failure looks like to a running attempt."""

from __future__ import annotations

import os
import signal
import subprocess


def rank_pids(service_url: str, attempt_id: int) -> list[int]:
    """PIDs of an attempt's training ranks (the `worker.entry` processes), lowest rank first."""
    pattern = f"worker.entry --service-url {service_url} --attempt-id {attempt_id}$"
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return sorted(int(p) for p in out.stdout.split())


def kill_rank(pid: int) -> None:
    """SIGKILL, as when a node drops: no handler runs, no goodbye is sent."""
    os.kill(pid, signal.SIGKILL)
