"""A run survives hardware failures without a human: real agents, real Slurm, real drains."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from client.api import RunyardClient
from tests.conftest import wait_for
from tests.integration.conftest import Agents, ServiceProcess, tiny_spec

pytestmark = pytest.mark.integration

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."


def slurm(*args: str, conf: str) -> str:
    out = subprocess.run(
        list(args), capture_output=True, text=True, env={**os.environ, "SLURM_CONF": conf}
    )
    return out.stdout


def drain_reason(node: str, conf: str) -> str:
    return slurm("sinfo", "-h", "-R", "-n", node, "-o", "%E", conf=conf).strip()


def committed(client: RunyardClient, run_id: int) -> list[int]:
    return [c["step"] for c in client.run_checkpoints(run_id) if c["state"] != "WRITING"]


@pytest.fixture
def spare_pool(service: ServiceProcess, agents: Agents) -> Iterator[RunyardClient]:
    """One spare reserved for the test; drained nodes resumed and the pool emptied after."""
    client = service.client()
    client.set_spares(1)
    wait_for("a spare in the pool", lambda: client.get_spares()["members"])
    yield client
    client.set_spares(0)
    for node in client.list_nodes():
        if node["state"] in ("DRAINED", "DRAINING"):
            client.resume_node(node["name"])
    wait_for("the spare pool to empty", lambda: not client.get_spares()["members"])


def test_xid_79_drains_the_node_and_the_spare_takes_over(
    spare_pool: RunyardClient, agents: Agents, slurm_cluster
) -> None:
    client, conf = spare_pool, str(slurm_cluster.slurm_conf)
    spare = client.get_spares()["members"][0]
    run = client.submit_run(tiny_spec("xid-79", steps=400))
    run_id = run["id"]
    first_commit = wait_for("a committed checkpoint", lambda: committed(client, run_id))[0]
    wait_for(
        "steps past it", lambda: (client.get_run(run_id)["last_step"] or 0) >= first_commit + 5
    )
    placed = client.get_run(run_id)["nodes"]
    assert len(placed) == 2 and spare not in placed
    bad, healthy = placed[1], placed[0]

    agents.append(bad, XID_79.format(pid=os.getpid()))

    wait_for(
        f"{bad} drained in Slurm with the Xid in its reason",
        lambda: "xid:79" in drain_reason(bad, conf),
        timeout_s=30,
    )
    second = wait_for(
        "attempt 2 running",
        lambda: next(
            (a for a in client.get_run(run_id)["attempts"][1:] if a["state"] == "RUNNING"), None
        ),
        timeout_s=60,
    )
    assert sorted(second["nodes"]) == sorted([healthy, spare])
    newest_before = max(s for s in committed(client, run_id) if s <= second["resume_step"])
    assert second["resume_step"] == newest_before

    wait_for(
        "the run to succeed", lambda: client.get_run(run_id)["state"] == "SUCCEEDED", timeout_s=180
    )
    final = client.get_run(run_id)
    assert final["num_hardware_restarts"] == 1 and final["num_restarts"] == 1
    assert client.get_node(bad)["state"] == "DRAINED"
    incident = next(i for i in client.list_incidents() if i["run_id"] == run_id)
    assert incident["signal"] == "xid:79" and incident["spare_node"] == spare
    assert incident["state"] == "RESOLVED" and incident["recovery_s"] is not None
    for stamp in ("drained_at", "attempt_ended_at", "submitted_at", "running_at", "first_step_at"):
        assert incident[stamp], stamp
    print(f"recovery: signal -> first resumed step {incident['recovery_s']:.1f} s")
    goodput = final["goodput"]
    assert 0 < goodput["goodput"] < 1
    assert goodput["lost"]["recomputed_steps_s"] > 0
    kinds = [e["kind"] for e in client.run_events(run_id)]
    assert "recovery.spare_assigned" in kinds
