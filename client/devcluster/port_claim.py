"""Who holds the dev service's port, as `runyard dev up` finds it before starting a service.

A service of this dev cluster's own can hold the port unrecorded: its recorded process
died and left it serving (a killed `runuser` wrapper did so before issue 37), or the
process table was lost. That one `dev up` replaces; anything else on the port it refuses
to touch.
"""

from __future__ import annotations

import pwd
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from client.devcluster.errors import DevClusterError
from client.devcluster.identity import SERVICE_USER
from client.devcluster.processes import (
    Started,
    cmdline_of,
    environ_of,
    is_alive,
    listening_sockets,
    processes_holding,
    session_of,
    stop,
    terminate,
    uid_of,
)

# What the service's command line names (service_argv in cluster.py): with the state
# folder in its environment and the service's user, what marks a dev cluster's service.
SERVICE_APP = "service.serve"


class PortHeld(StrEnum):
    """What holds the port, each with what `dev up` does about it."""

    FREE = "free"  # nothing listens: start the service
    RECORDED = "recorded"  # the recorded process listens, or still starts: keep it
    # The recorded process runs and a process of its session listens (the service under
    # a wrapper, as `dev up` recorded it before issue 37): record the listener, keep it.
    WRAPPED = "wrapped"
    # A service of this dev cluster's, not recorded (its recorded process is gone): stop
    # it and start a fresh one, from today's code and settings.
    STALE = "stale"
    FOREIGN = "foreign"  # somebody else's (or a process we may not inspect): refuse


@dataclass(frozen=True)
class PortHolder:
    """What holds a port and the processes listening on it."""

    held: PortHeld
    pids: tuple[int, ...] = ()


def is_dev_service(pid: int, state_dir: Path, user_uid: int) -> bool:
    """Whether `pid` is a service this dev cluster started: the service's command line,
    run as the service's user, with this cluster's state folder in its environment (its
    RUNYARD_STATE_DIR; the tests' services and a site's have folders of their own)."""
    state = environ_of(pid).get("RUNYARD_STATE_DIR")
    return (
        state is not None
        and Path(state).resolve() == state_dir.resolve()
        and SERVICE_APP in cmdline_of(pid)
        and uid_of(pid) == user_uid
    )


def holder(port: int, state_dir: Path, recorded: Started | None, user_uid: int) -> PortHolder:
    """What holds `port` (127.0.0.1 or any address), judged against the process recorded
    for it (None: none recorded)."""
    live = recorded if recorded is not None and is_alive(recorded) else None
    sockets = listening_sockets(port)
    if not sockets:
        return PortHolder(PortHeld.RECORDED if live else PortHeld.FREE)
    pids = tuple(sorted(processes_holding(sockets)))
    if not pids or not all(is_dev_service(pid, state_dir, user_uid) for pid in pids):
        return PortHolder(PortHeld.FOREIGN, pids)
    if live is not None and live.pid in pids:
        return PortHolder(PortHeld.RECORDED, pids)
    if live is not None and all(session_of(pid) == live.pid for pid in pids):
        return PortHolder(PortHeld.WRAPPED, pids)
    return PortHolder(PortHeld.STALE, pids)


def claim(
    port: int,
    key: str,
    table: dict[str, Started],
    state_dir: Path,
    say: Callable[[str], None],
    user: str = SERVICE_USER,
) -> bool:
    """Make `port` ready for the service recorded as `key` in `table`: True if one is to
    be started there now (the caller saves the table: an adopted listener's PID).

    A service of this cluster's own that holds the port unrecorded is stopped and started
    afresh rather than adopted: it may run older code or settings than this `dev up`
    would give it, and `dev up` after a death is expected to restart what died. One that
    runs under the recorded process (the wrapper `dev up` recorded before issue 37) is
    adopted: it is the very process this cluster started and still runs, and restarting
    it would only interrupt whoever uses it. Somebody else's stops `dev up` before
    anything changes."""
    recorded = table.get(key)
    uid = pwd.getpwnam(user).pw_uid
    found = holder(port, state_dir, recorded, uid)
    if found.held is PortHeld.FOREIGN:
        raise DevClusterError(
            f"port {port} already serves something not started by this "
            "dev cluster; stop it or set another port with --port"
        )
    if found.held is PortHeld.RECORDED:
        return False
    if found.held is PortHeld.WRAPPED and recorded is not None:
        table[key] = replace(recorded, pid=found.pids[0])
        say(f"recorded the service on port {port} as PID {found.pids[0]}, not its wrapper")
        return False
    if found.held is PortHeld.STALE:
        say(f"stopping a service of this dev cluster's left unrecorded on port {port}")
        for pid in found.pids:
            terminate(pid)
        if recorded is not None and is_dev_service(recorded.pid, state_dir, uid):
            stop(recorded)  # still starting, or hung: the fresh one replaces it too
    return True
