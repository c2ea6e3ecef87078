"""Cancellation: the user's cancel marks the run CANCELLING and asks training ranks to save
and exit; the reconciler scancels its job once nothing more is to be saved (at once for a
job not training or `--now`, after the grace for ranks that do not leave; even a job
sbatched before a crash, found by name) and only then calls it CANCELLED."""

from __future__ import annotations

from datetime import timedelta

from contract import StopReason
from service.db import session_scope
from service.models import AttemptState, RunState
from service.models.base import utcnow
from service.runs.service import cancel_run
from service.worker_protocol.schemas import ProgressReport
from service.workers import service as workers
from tests.unit.reconcile.conftest import Cluster


def cancel(run_id: int, now: bool = False) -> None:
    """As POST /v1/runs/{id}/cancel does."""
    with session_scope() as session:
        cancel_run(session, run_id, now=now)


def stop_asked_in_the_reply(cluster: Cluster, run_id: int) -> bool:
    """What rank 0 reads in its next progress reply (workers/endpoints.py)."""
    attempt_id = cluster.attempts(run_id)[-1].id
    with session_scope() as session:
        _, attempt = workers.record_progress(session, attempt_id, ProgressReport(rank=0))
        return attempt.stop_requested_at is not None


def test_a_cancel_lets_training_ranks_save_and_exit_before_the_run_ends(
    cluster: Cluster,
) -> None:
    run_id = cluster.submit_run("cancel-saves")
    cluster.cycle()
    job = cluster.live_job(run_id)
    cluster.train(run_id, 20)
    cancel(run_id)
    cluster.tick()
    assert cluster.slurm.jobs[job].state == "RUNNING"  # saving, not scancelled
    assert stop_asked_in_the_reply(cluster, run_id)
    assert cluster.attempts(run_id)[-1].stop_reason == StopReason.CANCELLED
    cluster.train(run_id, 27)  # the stop's own save, off the checkpoint cadence
    cluster.slurm.finish(job, exit_code=0)
    cluster.tick()
    run = cluster.run(run_id)
    assert run.state == RunState.CANCELLED and "newest checkpoint is step 27" in run.state_reason
    (attempt,) = cluster.attempts(run_id)
    assert attempt.state == AttemptState.CANCELLED
    assert attempt.end_reason == "cancelled by the user (saved and exited)"
    assert cluster.slurm.calls["cancel"] == 0


def test_ranks_that_do_not_leave_within_the_grace_are_scancelled(cluster: Cluster) -> None:
    run_id = cluster.submit_run("cancel-ignored")
    cluster.cycle()
    job = cluster.live_job(run_id)
    cancel(run_id)
    cluster.tick()
    assert cluster.slurm.jobs[job].state == "RUNNING"
    grace = timedelta(seconds=cluster.settings.stop_grace_s + 1)
    cluster.age_attempt(run_id, stop_requested_at=utcnow() - grace)
    cluster.tick()
    assert cluster.slurm.jobs[job].state == "CANCELLED"
    assert cluster.run(run_id).state == RunState.CANCELLED
    assert cluster.attempts(run_id)[-1].end_reason == "cancelled by the user (scancelled)"


def test_cancel_now_scancels_at_once_even_after_a_cancel_that_saves(cluster: Cluster) -> None:
    saving, hurried = cluster.submit_run("saving"), cluster.submit_run("hurried")
    cluster.cycle()
    jobs = {run_id: cluster.live_job(run_id) for run_id in (saving, hurried)}
    cancel(hurried, now=True)
    assert not stop_asked_in_the_reply(cluster, hurried)
    cancel(saving)
    cluster.tick()
    assert cluster.slurm.jobs[jobs[hurried]].state == "CANCELLED"
    assert cluster.slurm.jobs[jobs[saving]].state == "RUNNING"
    cancel(saving, now=True)  # the user will not wait for the save
    cluster.tick()
    assert cluster.slurm.jobs[jobs[saving]].state == "CANCELLED"
    assert {cluster.run(r).state for r in jobs} == {RunState.CANCELLED}


def test_cancelling_a_running_run_scancels_it_then_releases_its_nodes(cluster: Cluster) -> None:
    run_id = cluster.submit_run("cancelled")
    cluster.cycle()
    job = cluster.live_job(run_id)
    reservation = cluster.run(run_id).reservation
    cancel(run_id, now=True)
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


def test_a_script_read_from_its_output_is_scancelled_at_once(cluster: Cluster) -> None:
    """It never reads the service's replies: asking it to save would only delay its end."""
    script = {
        "entrypoint": {"script": "/shared/train.py"},
        "progress": {"pattern": r"step (?P<step>\d+)"},
    }
    run_id = cluster.submit_run("zero-change", **script)
    cluster.cycle()
    job = cluster.live_job(run_id)
    cancel(run_id)
    assert not stop_asked_in_the_reply(cluster, run_id)
    cluster.tick()
    assert cluster.slurm.jobs[job].state == "CANCELLED"
    assert cluster.run(run_id).state == RunState.CANCELLED


def test_a_replica_group_run_is_scancelled_at_once(cluster: Cluster) -> None:
    """Its groups stop on a request only at a step they agree on, which a cancel does not
    arrange: asked to save, they trained on until the grace ran out (bench/recovery.py)."""
    run_id = cluster.submit_run("groups", fault_tolerance={"replica_groups": 2})
    cluster.cycle()
    jobs = [a.slurm_job_id for a in cluster.attempts(run_id)]
    assert len(jobs) == 2 and all(jobs)
    cancel(run_id)
    assert not stop_asked_in_the_reply(cluster, run_id)
    cluster.tick()
    assert {cluster.slurm.jobs[j].state for j in jobs if j} == {"CANCELLED"}
    assert cluster.run(run_id).state == RunState.CANCELLED
