"""Cancellation: the user's cancel marks the run CANCELLING; the reconciler scancels its job
(even one sbatched before a crash, found by name) and only then calls it CANCELLED."""

from __future__ import annotations

from contract import StopReason
from service.db import session_scope
from service.models import AttemptState, RunState
from service.runs.service import cancel_run
from tests.unit.reconcile.conftest import Cluster


def cancel(run_id: int) -> None:
    """As DELETE /v1/runs/{id} does."""
    with session_scope() as session:
        cancel_run(session, run_id)


def test_cancelling_a_running_run_scancels_it_then_releases_its_nodes(cluster: Cluster) -> None:
    run_id = cluster.submit_run("cancelled")
    cluster.cycle()
    job = cluster.live_job(run_id)
    reservation = cluster.run(run_id).reservation
    cancel(run_id)
    assert cluster.run(run_id).state == RunState.CANCELLING
    cluster.tick()
    assert cluster.slurm.jobs[job].state == "CANCELLED"
    run = cluster.run(run_id)
    (attempt,) = cluster.attempts(run_id)
    assert run.state == RunState.CANCELLED
    assert attempt.state == AttemptState.CANCELLED and attempt.stop_reason == StopReason.CANCELLED
    assert reservation not in cluster.slurm.reservation_nodes


def test_a_job_sbatched_before_a_crash_is_found_by_name_and_cancelled(cluster: Cluster) -> None:
    run_id = cluster.submit_run("cancel-orphan")
    job = cluster.crash_after_sbatch(run_id)
    cancel(run_id)
    cluster.tick()
    assert cluster.slurm.jobs[job].state == "CANCELLED"
    assert cluster.run(run_id).state == RunState.CANCELLED
    assert cluster.slurm.calls["submit"] == 1  # cancelled, never submitted again


def test_a_run_stays_cancelling_while_slurm_cannot_say_what_is_queued(cluster: Cluster) -> None:
    run_id = cluster.submit_run("cancel-blind")
    job = cluster.crash_after_sbatch(run_id)
    cancel(run_id)
    cluster.slurm.break_call("jobs_by_name")
    cluster.tick()
    assert cluster.run(run_id).state == RunState.CANCELLING
    assert cluster.slurm.jobs[job].state == "PENDING"
    cluster.slurm.heal_call("jobs_by_name")
    cluster.tick()
    assert cluster.run(run_id).state == RunState.CANCELLED


def test_a_run_cancelled_before_submission_never_reaches_slurm(cluster: Cluster) -> None:
    run_id = cluster.submit_run("never-submitted", nodes=8)  # waits: too big
    cluster.tick()
    cancel(run_id)
    cluster.tick()
    assert cluster.run(run_id).state == RunState.CANCELLED
    assert cluster.slurm.calls["submit"] == 0 and cluster.slurm.calls["cancel"] == 0
