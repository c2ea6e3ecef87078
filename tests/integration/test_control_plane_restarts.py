"""What already survives, kept so: Postgres restarted, and slurmctld killed and restarted,
while a run trains; the run finishes with its one attempt (nothing submitted twice).

Both stop shared parts of the dev cluster for seconds: the tests run under the integration
lock, and each brings the part back the way `runyard dev up` does before it ends."""

from __future__ import annotations

import subprocess

import pytest

from client.api import RunyardClient
from client.devcluster import cluster, postgres
from client.devcluster.cluster import DevCluster
from tests.conftest import TEST_DATABASE, wait_for
from tests.integration.conftest import Agents, ServiceProcess, committed, slurm, tiny_spec

pytestmark = pytest.mark.integration
OUTAGE_S = 5  # long enough for several reconcile ticks and worker reports to fail


def train_past_a_commit(client: RunyardClient, name: str) -> int:
    run_id = client.submit_run(tiny_spec(name, steps=200))["id"]
    first = wait_for("a committed checkpoint", lambda: committed(client, run_id), timeout_s=120)[0]
    wait_for("steps past it", lambda: (client.get_run(run_id)["last_step"] or 0) >= first + 3)
    return int(run_id)


def finished_once(client: RunyardClient, run_id: int, conf: str) -> None:
    wait_for(
        "the run to succeed", lambda: client.get_run(run_id)["state"] == "SUCCEEDED", timeout_s=240
    )
    final = client.get_run(run_id)
    assert len(final["attempts"]) == 1, "no attempt was submitted twice"
    assert final["num_restarts"] == 0
    named = f"JobName=runyard-{TEST_DATABASE}-r{run_id}-"
    jobs = [line for line in slurm("scontrol", "show", "job", "-o", conf=conf).splitlines()]
    assert sum(named in line for line in jobs) == 1, "Slurm saw one job for the run"


def test_postgres_restarted_while_a_run_trains(
    service: ServiceProcess, agents: Agents, slurm_cluster: DevCluster
) -> None:
    client = service.client()
    run_id = train_past_a_commit(client, "postgres-restart")
    version, name = next((v, n) for v, n, _ in postgres._clusters())
    pg = ["pg_ctlcluster", "--skip-systemctl-redirect", version, name]
    subprocess.run([*pg, "stop", "-m", "fast"], check=True)
    try:
        wait_for("the API to notice", lambda: not service.healthy(), timeout_s=10)
        subprocess.run(["sleep", str(OUTAGE_S)], check=True)
    finally:
        subprocess.run([*pg, "start"], check=True)
    wait_for("the API back", service.healthy, timeout_s=30)
    finished_once(client, run_id, str(slurm_cluster.slurm_conf))


def test_slurmctld_killed_and_restarted_while_a_run_trains(
    service: ServiceProcess, agents: Agents, slurm_cluster: DevCluster
) -> None:
    client, conf = service.client(), str(slurm_cluster.slurm_conf)
    run_id = train_past_a_commit(client, "slurmctld-restart")
    table = slurm_cluster.table.load()
    subprocess.run(["kill", "-9", str(table["slurmctld"].pid)], check=True)
    try:
        step_before = client.get_run(run_id)["last_step"] or 0
        subprocess.run(["sleep", str(OUTAGE_S)], check=True)
        # Training goes on without the controller: the steps already run need no slurmctld.
        assert (client.get_run(run_id)["last_step"] or 0) > step_before
    finally:
        cluster.up(cluster=slurm_cluster, with_service=False, say=lambda _: None)
    finished_once(client, run_id, conf)
