"""`runyard dev up` brings back the dev cluster's own service when it died or was left
unrecorded, and restarts its agents either way (issue 37: the recorded PID was the
`runuser` wrapper's; killed, it left the service serving unrecorded, and every later
`dev up` stopped at "port 8000 already serves something" before restarting an agent).

On the dev cluster itself (.runyard/dev), through the CLI as a person types it. It kills
and replaces that cluster's service and an agent, so it runs when nobody else uses the dev
cluster (not beside a benchmark), and leaves the service and agents as it found them:
running, or paused by the test session (then they run during this module only)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from runyard_client.tls import client_context

from client.devcluster import cluster
from client.devcluster.cluster import DevCluster
from client.devcluster.processes import (
    cmdline_of,
    listening_sockets,
    processes_holding,
    running,
)
from tests.conftest import ENVIRONMENT_AT_START, wait_for

pytestmark = pytest.mark.integration
RUNYARD = Path(sys.executable).parent / "runyard"  # the CLI of this environment
DEV_UP_TIMEOUT_S = 300


def runyard_dev(*args: str) -> subprocess.CompletedProcess[str]:
    """`runyard dev ...` with the environment the session started with (the tests point
    RUNYARD_DATABASE_URL at their own database and turn the reconciler off)."""
    return subprocess.run(
        [str(RUNYARD), "dev", *args],
        capture_output=True,
        text=True,
        env=ENVIRONMENT_AT_START,
        timeout=DEV_UP_TIMEOUT_S,
    )


def dev_status() -> dict[str, dict[str, Any]]:
    shown = runyard_dev("status", "--json")
    assert shown.stdout.strip(), shown.stderr
    status: dict[str, dict[str, Any]] = json.loads(shown.stdout)
    return status


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2, verify=client_context()).status_code == 200
    except httpx.HTTPError:
        return False


def serving_pids(dev: DevCluster) -> set[int]:
    return processes_holding(listening_sockets(dev.service_port))


@pytest.fixture(scope="module")
def dev() -> Iterator[DevCluster]:
    """The dev cluster, up with its service and agents in the shape it has, as `dev up`
    brings it; stopped again afterwards if the session had paused them."""
    dev = DevCluster(cluster.default_state_dir())
    table = dev.table.load()
    if any(name.startswith(("service:", "proxy")) for name in table):
        pytest.skip("the dev cluster runs service replicas; `dev up` with one would refuse")
    paused = not any(name == "service" for name in table)
    up = runyard_dev("up", *shape_options(dev))
    assert up.returncode == 0, up.stdout + up.stderr
    yield dev
    if paused:
        cluster.stop_control_plane(dev)


def shape_options(dev: DevCluster) -> list[str]:
    """--nodes and --leaf-size as the cluster runs (`dev up` refuses another shape)."""
    saved = dev.state_dir / "shape.json"
    if not saved.exists():
        return []
    shape = json.loads(saved.read_text())
    return ["--nodes", str(shape["num_nodes"]), "--leaf-size", str(shape["leaf_size"])]


def assert_serving_with_every_agent(dev: DevCluster, status: dict[str, dict[str, Any]]) -> int:
    """The recorded service is what listens on the port and answers; every node's agent
    runs under its recorded PID. Returns the service's PID."""
    pid = status["service"]["pid"]
    assert status["service"]["running"], status["service"]
    assert serving_pids(dev) == {pid}, f"PID {pid} recorded, {serving_pids(dev)} listen"
    assert healthy(dev.service_url)
    nodes = json.loads((dev.state_dir / "shape.json").read_text())["num_nodes"]
    agents = {name: entry for name, entry in status.items() if name.startswith("agent:")}
    assert len(agents) == nodes, sorted(agents)
    for name, entry in agents.items():
        assert entry["running"], (name, entry)
        assert running(entry["pid"]), (name, entry)
        node = name.removeprefix("agent:")
        assert "worker.agent" in cmdline_of(entry["pid"]), cmdline_of(entry["pid"])
        assert node in cmdline_of(entry["pid"]), (name, cmdline_of(entry["pid"]))
    return int(pid)


def test_a_killed_service_is_started_again_by_dev_up(dev: DevCluster) -> None:
    """The PID `dev status` shows is the process serving: SIGKILL on it stops the service
    (nothing left serving behind a dead wrapper), and `dev up` starts it again."""
    killed = assert_serving_with_every_agent(dev, dev_status())
    os.kill(killed, signal.SIGKILL)
    wait_for("the port to close", lambda: not listening_sockets(dev.service_port), timeout_s=10)
    assert not dev_status()["service"]["running"]

    up = runyard_dev("up", *shape_options(dev))
    assert up.returncode == 0, up.stdout + up.stderr
    status = dev_status()
    assert assert_serving_with_every_agent(dev, status) != killed
    assert all(entry["running"] for entry in status.values()), status


def test_an_unrecorded_service_of_its_own_is_replaced_and_agents_restarted(
    dev: DevCluster,
) -> None:
    """The soak: the recorded process gone, the service still serving unrecorded, and an
    agent dead. `dev up` stops that service, starts a fresh one and restarts the agent,
    where it used to stop at "port 8000 already serves something"."""
    orphan = assert_serving_with_every_agent(dev, dev_status())
    table = dev.table.load()
    gone = subprocess.Popen(["true"])
    gone.wait()
    table["service"] = replace(table["service"], pid=gone.pid)
    dev.table.save(table)  # recorded: a process that no longer runs, as the dead wrapper
    agent = table[next(name for name in table if name.startswith("agent:"))]
    os.kill(agent.pid, signal.SIGKILL)
    wait_for("the agent to die", lambda: not running(agent.pid), timeout_s=10)

    up = runyard_dev("up", *shape_options(dev))
    assert up.returncode == 0, up.stdout + up.stderr
    assert "unrecorded" in up.stdout, up.stdout  # it says what it stopped
    assert not running(orphan)
    status = dev_status()
    assert assert_serving_with_every_agent(dev, status) != orphan
    assert status[agent.name]["pid"] != agent.pid
    assert all(entry["running"] for entry in status.values()), status
