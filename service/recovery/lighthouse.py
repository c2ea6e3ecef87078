"""One torchft lighthouse per replica-group run, started and stopped by the service.

Who runs it: the service host, not a compute node. The lighthouse holds the quorum every
group asks for each step; on a compute node (say rank 0 of group 0) it would die with that
node, and every surviving group would stall: half the failures of a two-group run would
need the classic path (ClassicBecause.LIGHTHOUSE_LOST). The service host is reached by
every rank already (their reports), and its load is one small RPC per group per step (128
groups at a 10 s step: 13 requests/s). The process is started in a session of its own, so
a service restart leaves it running; its address and process id are in Postgres, and a
restarted service adopts it (a dead one is started again on the same port, and the groups'
managers reconnect on their next quorum).

The service never imports torch: it runs the `torchft_lighthouse` executable that the
torchft wheel installs.

Where it listens: a lighthouse has no authentication, and the quorum it hands out names
each member's manager, from which a group that is behind heals by unpickling what it is
sent. So it listens only on the address the ranks reach it at (RUNYARD_LIGHTHOUSE_BIND_ADDR,
default RUNYARD_LIGHTHOUSE_HOST), never on every address of the host, and on a port from
RUNYARD_LIGHTHOUSE_PORTS when a site's firewall names one range (docs/install.md, "Who a
run runs as").
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import select

from service.config import Settings
from service.db import session_scope
from service.models import Run, RunState

log = logging.getLogger(__name__)

# How long the lighthouse waits for a group that stopped heartbeating before it forms a
# quorum without it: the survivors' stall once the service has scancelled the failed
# group's job (the Xid's drain does that, sooner than any collective timeout). Managers
# heartbeat every 100 ms (torchft's default), so 2 s is 20 missed heartbeats; torchft's
# default of 5 s stalled a two-group toy 5 s per failure. How long a new quorum waits for
# stragglers that still heartbeat: torchft's 60 s default would hold every survivor while
# a replacement starts up, 2 s lets them go on and the replacement joins the next one.
HEARTBEAT_TIMEOUT_MS = 2000
JOIN_TIMEOUT_MS = 2000


def _executable(settings: Settings) -> str:
    beside_python = Path(sys.executable).parent / settings.lighthouse_command
    if beside_python.exists():
        return str(beside_python)
    return shutil.which(settings.lighthouse_command) or settings.lighthouse_command


class NoLighthousePort(RuntimeError):
    """Every port of RUNYARD_LIGHTHOUSE_PORTS is taken on the bind address."""


def bind_host(settings: Settings) -> str:
    """The one address lighthouses listen on: the site's choice, else where ranks reach it."""
    return settings.lighthouse_bind_addr or settings.lighthouse_host


def socket_address(host: str, port: int) -> str:
    """`host:port` as torchft's --bind takes it (an IPv6 literal in brackets)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def _candidate_ports(settings: Settings, run_id: int) -> Iterator[int]:
    """The site's range, starting at a run's own offset (fewer collisions between runs
    started together); just 0 (the kernel picks) without a range."""
    if not settings.lighthouse_ports:
        yield 0
        return
    low, high = (int(port) for port in settings.lighthouse_ports.split("-"))
    span = high - low + 1
    for i in range(span):
        yield low + (run_id + i) % span


def _free_port(settings: Settings, run_id: int) -> int:
    host = bind_host(settings).strip("[]")
    for port in _candidate_ports(settings, run_id):
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            try:
                s.bind(address)
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise NoLighthousePort(
        f"no free port in RUNYARD_LIGHTHOUSE_PORTS={settings.lighthouse_ports} on {host}"
    )


def lighthouse_argv(settings: Settings, min_replicas: int, port: int) -> list[str]:
    """The lighthouse's command line: bound to one address, with runyard's timeouts."""
    return [
        _executable(settings),
        "--bind",
        socket_address(bind_host(settings), port),
        "--min_replicas",
        str(min_replicas),
        "--join_timeout_ms",
        str(JOIN_TIMEOUT_MS),
        "--heartbeat_timeout_ms",
        str(HEARTBEAT_TIMEOUT_MS),
    ]


def is_alive(pid: int | None) -> bool:
    """Whether `pid` is a running lighthouse (not a process that reused its id)."""
    if pid is None:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"lighthouse" in cmdline


def start(settings: Settings, run_id: int, min_replicas: int, port: int | None) -> tuple[str, int]:
    """Start a lighthouse for one run; returns (address for the ranks, process id)."""
    port = port or _free_port(settings, run_id)
    # The service's own folder: in the shared jobs root, a user could plant a link there.
    folder = settings.service_dir / "lighthouses"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"run-{run_id}.log", "ab") as out:
        process = subprocess.Popen(
            lighthouse_argv(settings, min_replicas, port),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # survives a restart of the service
        )
    return f"http://{socket_address(settings.lighthouse_host, port)}", process.pid


def stop(pid: int) -> None:
    if is_alive(pid):
        os.kill(pid, signal.SIGTERM)


def maintain_lighthouses(settings: Settings) -> None:
    """A live lighthouse for every replica-group run that may train; none for ended runs.
    Recorded in Postgres in the same transaction that decides it, process calls after."""
    with session_scope() as session:
        runs = session.scalars(
            select(Run).where(
                Run.config["fault_tolerance"].is_not(None) | Run.lighthouse_pid.is_not(None)
            )
        ).all()
        todo = [
            (r.id, r.state, r.lighthouse_pid, r.lighthouse_addr, r.config.get("fault_tolerance"))
            for r in runs
        ]
    for run_id, state, pid, addr, ft in todo:
        if state.is_terminal or state == RunState.CANCELLING:
            if pid is not None:
                stop(pid)
                with session_scope() as session:
                    run = session.get(Run, run_id, with_for_update=True)
                    if run is not None:
                        run.lighthouse_pid = None
            continue
        if ft is None or is_alive(pid):
            continue
        port = int(addr.rsplit(":", 1)[1]) if addr else None  # the ranks know this address
        new_addr, new_pid = start(settings, run_id, int(ft["min_healthy_groups"]), port)
        log.info("run %s: lighthouse at %s (pid %s)", run_id, new_addr, new_pid)
        with session_scope() as session:
            run = session.get(Run, run_id, with_for_update=True)
            if run is not None:
                run.lighthouse_addr, run.lighthouse_pid = new_addr, new_pid
