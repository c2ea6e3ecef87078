"""Submit over the API, watch Slurm run it, checkpoint, cancel: all on the real cluster."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import wait_for
from tests.integration.conftest import ServiceProcess, tiny_spec

pytestmark = pytest.mark.integration


def squeue_nodes(job_id: str, slurm_conf: str) -> int | None:
    """Nodes of a job as squeue reports it, or None when it is not in the queue."""
    out = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%D|%T"],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": slurm_conf},
    )
    line = out.stdout.strip()
    return int(line.split("|")[0]) if line else None


@pytest.mark.whole_path
@pytest.mark.every_slurm
def test_submit_train_checkpoint_cancel(service: ServiceProcess, slurm_cluster) -> None:
    client = service.client()
    run = client.submit_run(tiny_spec("lifecycle", steps=5000))
    assert run["state"] == "PENDING"
    conf = str(slurm_cluster.slurm_conf)

    job_id = wait_for(
        "a Slurm job for attempt 1",
        lambda: (
            client.get_run(run["id"])["attempts"][0]["slurm_job_id"]
            if client.get_run(run["id"])["attempts"]
            else None
        ),
    )
    assert wait_for("the job in squeue on 2 nodes", lambda: squeue_nodes(job_id, conf) == 2)

    first = wait_for("steps to advance", lambda: client.get_run(run["id"])["last_step"])
    wait_for("more steps", lambda: (client.get_run(run["id"])["last_step"] or 0) > first)
    committed = wait_for(
        "a COMMITTED checkpoint",
        lambda: [c for c in client.run_checkpoints(run["id"]) if c["state"] == "COMMITTED"],
    )
    assert os.path.exists(os.path.join(committed[0]["path"], "COMMITTED"))

    shown = client.get_run(run["id"])
    assert shown["state"] == "RUNNING"
    assert shown["attempts"][0]["nodes"] and len(shown["attempts"][0]["nodes"]) == 2

    assert client.cancel_run(run["id"])["state"] == "CANCELLING"
    wait_for(
        "the run to be CANCELLED",
        lambda: client.get_run(run["id"])["state"] == "CANCELLED",
        timeout_s=60,
    )
    assert squeue_nodes(job_id, conf) is None
    ended = client.get_run(run["id"])
    assert ended["attempts"][0]["state"] == "CANCELLED"
    # The cancel asked the ranks to stop: they saved where they were and left by themselves.
    assert ended["attempts"][0]["end_reason"] == "cancelled by the user (saved and exited)"
    last_save = max(c["step"] for c in client.run_checkpoints(run["id"]) if c["committed_at"])
    assert last_save == ended["last_step"], (last_save, ended["last_step"])  # none lost
    assert f"newest checkpoint is step {last_save}" in ended["state_reason"]
    kinds = [e["kind"] for e in client.run_events(run["id"])]
    assert (
        kinds.index("run.running")
        < kinds.index("checkpoint.committed")
        < kinds.index("run.cancelled")
    )
