"""The dev cluster keeps track of its own processes (issue 37): the PID it records is the
daemon's own, it finds who listens on a port, and `dev up` tells its own service on the
service's port (stopped and started afresh, or adopted) from somebody else's (refused).

Every listener here is a real socket of a real process this test starts on a free port;
the dev cluster itself (.runyard/dev) is never touched."""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from client.devcluster.errors import DevClusterError
from client.devcluster.mlflow import pid_file, stop_dev_server
from client.devcluster.port_claim import SERVICE_APP, claim
from client.devcluster.processes import (
    Started,
    cmdline_of,
    environ_of,
    listening_sockets,
    processes_holding,
    running,
    session_of,
    spawn,
    stop,
    stop_together,
    terminate,
    uid_of,
)
from tests.conftest import free_port, wait_for

# A stand-in for the service: listens on argv[1] and waits for a signal. Started with
# SERVICE_APP among its arguments and the cluster's state folder in its environment, it
# carries what marks a dev cluster's service.
SERVER = """
import signal, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    signal.pause()
"""
ME = pwd.getpwuid(os.getuid()).pw_name  # the stand-ins run as whoever runs the tests
PYTHON = Path(sys.executable).name


def server_argv(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-c", SERVER, str(port), *extra]


Spawner = Callable[..., Started]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Spawner]:
    """spawn() for the test; whatever it started and still runs is stopped afterwards."""
    started: list[Started] = []

    def start_one(argv: list[str], state_dir: Path | None = tmp_path, **kw: str) -> Started:
        env = {**os.environ, "RUNYARD_STATE_DIR": str(state_dir)} if state_dir else None
        proc = spawn(f"test-{len(started)}", argv, tmp_path / f"{len(started)}.out", env, **kw)
        started.append(proc)
        return proc

    yield start_one
    for proc in started:
        stop(proc, timeout_s=2)


def listening(port: int) -> set[str]:
    return wait_for(f"a listener on port {port}", lambda: listening_sockets(port), timeout_s=10)


def test_the_listener_of_a_port_is_found_by_its_socket() -> None:
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family) as server:
            try:
                server.bind((address, 0))
            except OSError:
                continue  # no IPv6 on this machine
            port = server.getsockname()[1]
            assert not listening_sockets(port)  # bound, not listening yet
            server.listen()
            with socket.create_connection((address, port)):  # a connection is no listener
                assert processes_holding(listening_sockets(port)) == {os.getpid()}
        assert not listening_sockets(port)


def test_a_spawned_server_is_recorded_by_its_own_pid(start: Spawner) -> None:
    port = free_port()
    proc = start(server_argv(port))
    assert processes_holding(listening(port)) == {proc.pid}
    assert session_of(proc.pid) == proc.pid  # a session of its own: stop() kills its group
    assert stop(proc) and not running(proc.pid) and not listening_sockets(port)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_spawn_as_a_user_records_the_daemon_not_a_wrapper(start: Spawner) -> None:
    """Under runuser the recorded PID was runuser's, which forks the daemon and waits;
    killed, it left the daemon serving unrecorded (issue 37)."""
    nobody = pwd.getpwnam("nobody")
    proc = start(["sleep", "300"], user="nobody")
    assert cmdline_of(proc.pid) == ["sleep", "300"]
    assert uid_of(proc.pid) == nobody.pw_uid
    status = Path(f"/proc/{proc.pid}/status").read_text()
    groups = next(line.split()[1:] for line in status.splitlines() if line.startswith("Groups:"))
    # The user's groups only: root's own supplementary groups must not come along.
    assert sorted(map(int, groups)) == sorted(os.getgrouplist("nobody", nobody.pw_gid))
    env = environ_of(proc.pid)
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == (nobody.pw_dir, "nobody", "nobody")
    os.kill(proc.pid, signal.SIGKILL)  # what the soak did to the recorded PID
    wait_for("the daemon to die with its PID", lambda: not running(proc.pid), timeout_s=10)


def test_terminate_kills_what_ignores_sigterm_after_its_wait(start: Spawner) -> None:
    port = free_port()
    proc = start(server_argv(port, "--ignore-term"))
    listening(port)
    terminate(proc.pid, timeout_s=0.5)
    assert not running(proc.pid) and not listening_sockets(port)


# Says goodbye for a second on SIGTERM, as an agent tells its service it leaves.
SLOW_GOODBYE = """
import signal, sys, time
def leave(*_):
    time.sleep(1.0)
    sys.exit(0)
signal.signal(signal.SIGTERM, leave)
print("ready", flush=True)
while True:
    signal.pause()
"""


def test_several_are_stopped_together_not_one_after_another(start: Spawner, tmp_path: Path) -> None:
    procs = [start([sys.executable, "-c", SLOW_GOODBYE]) for _ in range(3)]
    gone = start(["true"])
    wait_for("the three ready", lambda: all(
        (tmp_path / f"{i}.out").exists() and "ready" in (tmp_path / f"{i}.out").read_text()
        for i in range(3)
    ), timeout_s=30)  # fmt: skip
    wait_for("`true` to end", lambda: not running(gone.pid))
    began = time.monotonic()
    assert stop_together([*procs, gone]) == procs  # the ended one was not running
    took = time.monotonic() - began
    assert not any(running(p.pid) for p in procs)
    assert took < 2.5, f"{took:.1f} s: one goodbye after another takes 3 s"


def test_a_free_port_is_claimed_for_a_new_service(tmp_path: Path) -> None:
    said: list[str] = []
    assert claim(free_port(), "service", {}, tmp_path, said.append, user=ME)
    assert not said


def test_the_recorded_service_is_kept(start: Spawner, tmp_path: Path) -> None:
    port = free_port()
    proc = start(server_argv(port, SERVICE_APP))
    listening(port)
    table = {"service": proc}
    assert not claim(port, "service", table, tmp_path, print, user=ME)
    assert table["service"] == proc and running(proc.pid)


def test_an_unrecorded_service_of_its_own_is_stopped_to_start_afresh(
    start: Spawner, tmp_path: Path
) -> None:
    """The soak: the recorded process died and left the service serving; `dev up` stopped
    at "port 8000 already serves something" and never restarted the agents."""
    port = free_port()
    orphan = start(server_argv(port, SERVICE_APP))
    listening(port)
    dead = subprocess.Popen(["true"])
    dead.wait()
    table = {"service": Started("service", dead.pid, PYTHON, str(tmp_path / "service.out"))}
    said: list[str] = []
    assert claim(port, "service", table, tmp_path, said.append, user=ME)
    assert not running(orphan.pid) and not listening_sockets(port)
    assert said == [f"stopping a service of this dev cluster's left unrecorded on port {port}"]


def test_a_service_under_the_recorded_wrapper_is_adopted(start: Spawner, tmp_path: Path) -> None:
    """As `dev up` recorded it before issue 37: the wrapper's PID; the listener its child."""
    port = free_port()
    wrapper = start(["sh", "-c", '"$@" & wait', "sh", *server_argv(port, SERVICE_APP)])
    (child,) = wait_for("the wrapped listener", lambda: processes_holding(listening(port)))
    assert child != wrapper.pid
    recorded = Started("service", wrapper.pid, PYTHON, wrapper.log)
    table = {"service": recorded}
    assert not claim(port, "service", table, tmp_path, print, user=ME)
    assert table["service"].pid == child and running(child)


@pytest.mark.parametrize(
    "extra, state_dir",
    [
        pytest.param((), "ours", id="another-program-with-our-state-folder"),
        pytest.param((SERVICE_APP,), "other", id="a-service-of-another-state-folder"),
        pytest.param((SERVICE_APP,), None, id="a-service-without-a-state-folder"),
    ],
)
def test_somebody_elses_listener_stops_dev_up_untouched(
    start: Spawner, tmp_path: Path, extra: tuple[str, ...], state_dir: str | None
) -> None:
    port = free_port()
    folder = {"ours": tmp_path, "other": tmp_path / "other", None: None}[state_dir]
    proc = start(server_argv(port, *extra), state_dir=folder)
    listening(port)
    table: dict[str, Started] = {}
    with pytest.raises(DevClusterError, match=f"^port {port} already serves something not"):
        claim(port, "service", table, tmp_path, print, user=ME)
    assert running(proc.pid) and not table


def test_a_service_run_by_another_user_is_not_ours(start: Spawner, tmp_path: Path) -> None:
    port = free_port()
    proc = start(server_argv(port, SERVICE_APP))
    listening(port)
    other = "nobody" if ME != "nobody" else "root"
    with pytest.raises(DevClusterError, match="already serves something not started"):
        claim(port, "service", {}, tmp_path, print, user=other)
    assert running(proc.pid)


def test_stopping_mlflow_stops_what_its_killed_supervisor_left_serving(
    start: Spawner, tmp_path: Path
) -> None:
    """`mlflow server` supervises the uvicorn that serves; mlflow.pid records the
    supervisor. Killed, it left the server running where `dev down` no longer looked."""
    port = free_port()
    supervisor = start(["sh", "-c", '"$@" & wait', "sh", *server_argv(port, "mlflow")])
    (server,) = wait_for("the supervised server", lambda: processes_holding(listening(port)))
    pid_file(tmp_path).write_text(str(supervisor.pid))
    os.kill(supervisor.pid, signal.SIGKILL)
    wait_for("the supervisor to die", lambda: not running(supervisor.pid), timeout_s=10)
    assert stop_dev_server(tmp_path)
    wait_for("the server to stop", lambda: not running(server), timeout_s=10)
    assert not stop_dev_server(tmp_path)  # nothing recorded any more
