"""Start detached daemons and stop exactly the ones we started, by PID."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Started:
    """A process this dev cluster started: enough to find it again and nothing else."""

    name: str
    pid: int
    executable: str  # what /proc/<pid>/cmdline must mention, so a reused PID is not killed
    log: str


def is_alive(proc: Started) -> bool:
    try:
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ")
        stat = Path(f"/proc/{proc.pid}/stat").read_text()
    except OSError:
        return False
    zombie = stat.rsplit(")", 1)[-1].split()[0] == "Z"
    return not zombie and proc.executable.encode() in cmdline


def spawn(
    name: str,
    argv: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    user: str | None = None,
) -> Started:
    """Start `argv` in its own session, detached from our terminal, logging to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    executable = Path(argv[0] if not user else argv[4]).name
    return Started(name=name, pid=popen.pid, executable=executable, log=str(log))


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group is still running (zombies do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[-1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                return True
    return False


def stop(proc: Started, timeout_s: float = 10.0) -> bool:
    """SIGTERM the process group, then SIGKILL after `timeout_s`; returns once the whole
    group is gone (a daemon under runuser outlives runuser by a moment, and a `dev up`
    right after must not take the dying daemon for a running one). True if it was running."""
    if not is_alive(proc):
        return False
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_alive(proc) and not _group_alive(proc.pid):
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    while _group_alive(proc.pid) and time.monotonic() < deadline + 5:
        time.sleep(0.1)
    return True


class ProcessTable:
    """The JSON file under the state folder that lists what `dev up` started."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, Started]:
        if not self.path.exists():
            return {}
        raw = json.loads(self.path.read_text())
        return {name: Started(**entry) for name, entry in raw.items()}

    def save(self, table: dict[str, Started]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: asdict(v) for k, v in table.items()}, indent=2))
        os.replace(tmp, self.path)
