"""What already survives, kept so: Postgres restarted, slurmctld killed and restarted, and
the service stopped and started, while a run trains; the run finishes with its one attempt
(nothing submitted twice).

Stopping Postgres and slurmctld stops shared parts of the dev cluster for seconds: the test
runs under the integration lock, and brings each part back the way `runyard dev up` does.
(The Postgres outage stops the service's reconciler too; the service's own restart is the
last outage, with metrics buffered by the worker meanwhile.)"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from client.api import ApiError
from client.devcluster import cluster, postgres
from client.devcluster.cluster import DevCluster
from tests.conftest import TEST_DATABASE, wait_for
from tests.integration.conftest import Agents, ServiceProcess, committed, slurm, tiny_spec

pytestmark = pytest.mark.integration
# What an outage must have cost before it ends: reconcile ticks failed in the service's log
# (its leader lock cannot reach Postgres; a tick cannot read Slurm), for Postgres the
# worker's own word that a progress report failed, for slurmctld steps trained meanwhile.
POSTGRES_DOWN = "leader lock: cannot reach Postgres"
SLURM_DOWN = "reconcile tick failed"
FAILED_REPORT = "progress report failed, will retry"
STEPS = 1500  # paced at 60 ms, 90 s: longer than the three outages together with a wide
# margin (600 steps, 36 s, ended before the third outage on a slow CI machine)


def rank0_log(service: ServiceProcess, slurm_job_id: str) -> str:
    """Rank 0's output (its reporter's warnings among it), read from the job folder: the
    API that serves it is down for part of this test."""
    jobs = Path(service.settings["RUNYARD_STATE_DIR"]) / "jobs"
    found = sorted(jobs.glob(f"*/*/attempt-*/{slurm_job_id}_0_log.out"))  # owner/run/attempt
    return found[0].read_text(errors="replace") if found else ""


def log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def last_step_printed(log: str) -> int:
    """The last step rank 0 printed (`step N/1500 ...`, at the end of each report window)."""
    printed = re.findall(rf"^step (\d+)/{STEPS} ", log, re.MULTILINE)
    return int(printed[-1]) if printed else 0


def test_a_run_trains_through_postgres_slurmctld_and_service_restarts(
    service: ServiceProcess, agents: Agents, slurm_cluster: DevCluster
) -> None:
    """One run, three outages in turn: Postgres stopped, slurmctld killed, the service
    stopped. The run finishes with its one attempt, and every step's metrics arrive (the
    worker buffers what it cannot deliver while the service or its database is down); while
    Postgres is down the API answers 503 database_unavailable."""
    client, conf = service.client(), str(slurm_cluster.slurm_conf)
    steps = STEPS
    run_id = client.submit_run(tiny_spec("control-plane-restarts", steps=steps))["id"]
    first = wait_for("a committed checkpoint", lambda: committed(client, run_id), timeout_s=120)[0]
    wait_for("steps past it", lambda: (client.get_run(run_id)["last_step"] or 0) >= first + 3)
    job_id = client.get_run(run_id)["attempts"][0]["slurm_job_id"]

    def failed_ticks(line: str, since: int) -> int:
        """How often the service logged `line` after byte `since` of its log."""
        with service.log.open("rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace").count(line)

    since = log_size(service.log)

    version, name = next((v, n) for v, n, _ in postgres._clusters())
    pg = ["pg_ctlcluster", "--skip-systemctl-redirect", version, name]
    subprocess.run([*pg, "stop", "-m", "fast"], check=True)
    try:
        wait_for("the API to notice", lambda: not service.healthy(), timeout_s=10)
        with pytest.raises(ApiError) as refused:
            client.get_run(run_id)
        # A reader is told what is wrong in one line, not handed an HTML 500.
        assert refused.value.status == 503, refused.value.message
        assert refused.value.body["error"] == "database_unavailable"
        wait_for(
            "reconcile ticks and a worker report to fail",
            lambda: (
                failed_ticks(POSTGRES_DOWN, since) >= 3
                and FAILED_REPORT in rank0_log(service, job_id)
            ),
            timeout_s=30,
        )
    finally:
        subprocess.run([*pg, "start"], check=True)
    wait_for("the API back", service.healthy, timeout_s=30)

    table = slurm_cluster.table.load()
    since = log_size(service.log)
    subprocess.run(["kill", "-9", str(table["slurmctld"].pid)], check=True)
    try:
        # Training goes on without the controller: the steps already run need no slurmctld.
        # Read from rank 0's own output: its reports may still be backing off from the
        # Postgres outage.
        step_before = last_step_printed(rank0_log(service, job_id))
        wait_for(
            "a reconcile tick to fail and steps to be trained without slurmctld",
            lambda: (
                failed_ticks(SLURM_DOWN, since) >= 1
                and last_step_printed(rank0_log(service, job_id)) > step_before
            ),
            timeout_s=60,
        )
    finally:
        cluster.up(cluster=slurm_cluster, with_service=False, say=lambda _: None)

    assert client.get_run(run_id)["state"] == "RUNNING", "the outages outlasted the run"
    service.stop()
    assert not service.healthy()
    service.start()

    wait_for(
        "the run to succeed", lambda: client.get_run(run_id)["state"] == "SUCCEEDED", timeout_s=240
    )
    final = client.get_run(run_id)
    assert len(final["attempts"]) == 1, [  # no attempt was submitted twice
        (a["number"], a["state"], a.get("stop_reason"), a.get("end_reason"))
        for a in final["attempts"]
    ]
    assert final["num_restarts"] == 0
    named = f"JobName=runyard-{TEST_DATABASE}-r{run_id}-"
    jobs = [line for line in slurm("scontrol", "show", "job", "-o", conf=conf).splitlines()]
    assert sum(named in line for line in jobs) == 1, "Slurm saw one job for the run"
    reported = sorted({m["step"] for m in client.run_metrics(run_id, after_step=-1, limit=steps)})
    assert reported == list(range(1, steps + 1))
