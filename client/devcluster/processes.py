"""Start detached daemons, stop exactly the ones we started, by PID, and find who listens
on a port (so `dev up` can tell its own service from somebody else's)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

# /proc/net/tcp's `st` column for a listening socket (TCP_LISTEN, include/net/tcp_states.h).
TCP_LISTEN = "0A"


@dataclass(frozen=True)
class Started:
    """A process this dev cluster started: enough to find it again and nothing else."""

    name: str
    pid: int
    executable: str  # what /proc/<pid>/cmdline must mention, so a reused PID is not killed
    log: str


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name: state, ppid, pgrp, session, ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None


def running(pid: int) -> bool:
    """Whether `pid` runs: a zombie does not (it holds no socket and answers nothing, and a
    container whose PID 1 does not reap keeps it listed)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def session_of(pid: int) -> int | None:
    """The session `pid` belongs to; `spawn` makes each process it starts a session leader."""
    fields = _stat_fields(pid)
    return int(fields[3]) if fields is not None else None


def cmdline_of(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def environ_of(pid: int) -> dict[str, str]:
    """The environment `pid` was started with; empty where we may not read it (another
    user's process, unless we are root)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (entry.decode(errors="replace").partition("=") for entry in raw.split(b"\0"))
    return {key: value for key, _, value in pairs if key}


def uid_of(pid: int) -> int | None:
    """The real uid `pid` runs as."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


def is_alive(proc: Started) -> bool:
    """Whether the recorded process still runs: its PID runs the recorded executable (a
    PID reused by another program does not count)."""
    cmdline = " ".join(cmdline_of(proc.pid))
    return running(proc.pid) and proc.executable in cmdline


def spawn(
    name: str,
    argv: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    user: str | None = None,
) -> Started:
    """Start `argv` in its own session, detached from our terminal, logging to `log`.

    With `user`, the child switches to that user (its uid, group and supplementary groups)
    itself before it execs `argv`, so the PID recorded is the daemon's own. Through
    `runuser` it was not: runuser forks the daemon and waits for it, to close its PAM
    session, and `exec runuser` would not help; killed, that wrapper left the daemon
    serving, unrecorded (issue 37). The environment gets the user's HOME, USER, LOGNAME and
    SHELL, as runuser gave it; what the PAM session added (limits.conf) is not applied.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    uid = gid = groups = None
    if user:
        entry = pwd.getpwnam(user)
        uid, gid = entry.pw_uid, entry.pw_gid
        groups = os.getgrouplist(user, gid)
        env = {
            **(os.environ if env is None else env),
            "HOME": entry.pw_dir,
            "USER": user,
            "LOGNAME": user,
            "SHELL": entry.pw_shell,
        }
    with open(log, "ab") as out:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            user=uid,
            group=gid,
            extra_groups=groups,
        )
    return Started(name=name, pid=popen.pid, executable=Path(argv[0]).name, log=str(log))


def group_members(pgid: int) -> list[int]:
    """The processes of a group still running (zombies do not count). Its leader may be
    gone: Linux hands out no PID that still names a group, so these are what it started."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[-1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                members.append(int(stat.parent.name))
    return members


def _group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))


def _wait_until(done: Callable[[], bool], timeout_s: float) -> bool:
    """Poll `done` (a process's state in /proc) until it holds; False after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def stop(proc: Started, timeout_s: float = 10.0) -> bool:
    """SIGTERM the process group, then SIGKILL after `timeout_s`; returns once the whole
    group is gone (what the daemon started, the service's sudo helpers say, may outlive it
    by a moment, and a `dev up` right after must not find them). True if it was running."""
    if not is_alive(proc):
        return False
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    _wait_or_kill(proc, timeout_s)
    return True


def stop_together(procs: list[Started], timeout_s: float = 10.0) -> list[Started]:
    """stop() for several processes at once: SIGTERM every group first, then wait for each
    (the dev cluster's service and eight agents each take a moment to say goodbye: one at a
    time they added up to seconds at every test session's start). Returns the ones that ran."""
    signalled = []
    for proc in procs:
        if is_alive(proc):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
                signalled.append(proc)
    for proc in signalled:
        _wait_or_kill(proc, timeout_s)
    return signalled


def _wait_or_kill(proc: Started, timeout_s: float) -> None:
    """Wait for a signalled process group to end; SIGKILL it after `timeout_s`."""
    if _wait_until(lambda: not is_alive(proc) and not _group_alive(proc.pid), timeout_s):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    _wait_until(lambda: not _group_alive(proc.pid), 5)


def terminate(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM one process we did not record (its group may be somebody else's, so only
    it), SIGKILL after `timeout_s`; returns once it no longer runs, its sockets closed."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if _wait_until(lambda: not running(pid), timeout_s):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _wait_until(lambda: not running(pid), 5)


def listening_sockets(port: int) -> set[str]:
    """The inodes of the TCP sockets (IPv4 and IPv6, any address) listening on `port`."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue  # no IPv6 on this machine
        for row in rows:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == TCP_LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def processes_holding(sockets: set[str]) -> set[int]:
    """The processes with one of these sockets open (read from /proc/<pid>/fd: another
    user's only as root). Several where a listener forked after it bound."""
    links = {f"socket:[{inode}]" for inode in sockets}
    holders = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    if os.readlink(fd_dir / fd) in links:
                        holders.add(int(fd_dir.parent.name))
                        break
    return holders


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
