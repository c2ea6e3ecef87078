"""Submit over the API, watch Slurm run it, checkpoint, cancel: all on the real cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from client.devcluster.faults import rank_pids
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
    kinds = [e["kind"] for e in client.run_events(run["id"])]
    assert (
        kinds.index("run.running")
        < kinds.index("checkpoint.committed")
        < kinds.index("run.cancelled")
    )


def losses(metrics: list[dict], attempt_id: int) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics if m["attempt_id"] == attempt_id}


def test_killed_rank_restarts_from_last_commit(service: ServiceProcess) -> None:
    client = service.client()
    run = client.submit_run(tiny_spec("kill-a-rank", steps=200))
    run_id = run["id"]

    def attempt(n: int) -> dict | None:
        attempts = client.get_run(run_id)["attempts"]
        return attempts[n - 1] if len(attempts) >= n else None

    def committed_steps() -> list[int]:
        return [c["step"] for c in client.run_checkpoints(run_id) if c["state"] != "WRITING"]

    # Kill once attempt 1 has committed a checkpoint and reported steps past it, so the
    # steps after the commit are trained twice and their losses can be compared. Ranks
    # report in windows of about two seconds of steps, so "reported past the commit" is
    # checked with a rank frozen (SIGSTOP): its peer then waits in a collective, and neither
    # can report or commit more while the test looks.
    first_commit = wait_for("a committed checkpoint", lambda: committed_steps())[0]
    first = attempt(1)
    assert first is not None
    pids = wait_for("the rank processes", lambda: rank_pids(service.url, first["id"]))
    assert len(pids) == 2

    def frozen_past_a_commit() -> bool:
        os.kill(pids[-1], signal.SIGSTOP)
        time.sleep(1.0)  # reports already on their way land
        reported = max(losses(client.run_metrics(run_id), first["id"]), default=0)
        if reported > max(committed_steps()):
            return True
        os.kill(pids[-1], signal.SIGCONT)
        return False

    wait_for("attempt 1 frozen past its newest commit", frozen_past_a_commit, interval_s=0.5)
    os.kill(pids[-1], signal.SIGKILL)

    second = wait_for("attempt 2", lambda: attempt(2), timeout_s=90)
    failed = client.get_run(run_id)["attempts"][0]
    assert failed["state"] == "FAILED"
    assert failed["end_reason"]
    resume = second["resume_step"]
    assert resume is not None and resume >= first_commit

    wait_for(
        "the run to succeed", lambda: client.get_run(run_id)["state"] == "SUCCEEDED", timeout_s=180
    )
    final = client.get_run(run_id)
    assert final["num_restarts"] == 1
    assert final["attempts"][1]["resume_step"] == resume

    metrics = client.run_metrics(run_id, after_step=-1)
    before = losses(metrics, first["id"])
    after = losses(metrics, final["attempts"][1]["id"])
    assert min(after) == resume + 1, "attempt 2 must continue right after the committed step"
    overlap = sorted(set(before) & set(after))
    assert overlap, (
        "attempt 1 must have trained past the checkpoint attempt 2 resumed from: "
        f"attempt 1 reported steps {sorted(before)[-5:]}, attempt 2 resumed at {resume}"
    )
    for step in overlap:
        assert after[step] == pytest.approx(before[step], rel=1e-4), f"loss differs at {step}"


def test_service_restart_picks_the_run_up_again(service: ServiceProcess) -> None:
    client = service.client()
    run = client.submit_run(tiny_spec("survives-service-restart", steps=240))
    run_id = run["id"]
    wait_for("the run to train", lambda: (client.get_run(run_id)["last_step"] or 0) >= 10)

    service.stop()
    assert not service.healthy()
    service.start()

    wait_for(
        "the run to succeed after the restart",
        lambda: client.get_run(run_id)["state"] == "SUCCEEDED",
        timeout_s=180,
    )
    final = client.get_run(run_id)
    assert len(final["attempts"]) == 1, "a restarted service must not submit the run again"
    # The worker buffered what it could not deliver while the service was down.
    steps = sorted({m["step"] for m in client.run_metrics(run_id, after_step=-1)})
    assert steps == list(range(1, 241))
