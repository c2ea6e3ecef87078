"""Submission: after a crash between recording an attempt and storing its job id, the job
is found by its unique name and adopted, never submitted twice; a Slurm that cannot say what
is queued gets no blind submission; a refused sbatch fails the run with Slurm's reason."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from contract import StopReason
from service.auth.tokens import hash_token
from service.db import session_scope
from service.models import ApiToken, AttemptState, RunState
from service.reconcile import placement, submission
from service.runs import repository
from service.slurm.owner import RunOwner
from service.slurm.snapshot import take_snapshot
from service.slurm.submit import AttemptRequest
from tests.unit.reconcile.conftest import Cluster


def tokens_of(attempt_id: int) -> list[ApiToken]:
    with session_scope() as session:
        return list(session.scalars(select(ApiToken).where(ApiToken.attempt_id == attempt_id)))


def test_a_job_queued_before_a_crash_is_adopted_not_submitted_again(cluster: Cluster) -> None:
    run_id = cluster.submit_run("adopted")
    job = cluster.crash_after_sbatch(run_id)
    cluster.slurm.calls.clear()
    cluster.tick()
    (attempt,) = cluster.attempts(run_id)
    assert attempt.slurm_job_id == job and attempt.state == AttemptState.PENDING
    assert cluster.slurm.calls["submit"] == 0 and len(cluster.slurm.jobs) == 1
    # Minting would revoke the token the job already runs with: none is minted.
    assert tokens_of(attempt.id) == []
    cluster.slurm.schedule()
    cluster.tick()
    assert cluster.run(run_id).state == RunState.RUNNING


def test_a_job_that_ended_before_the_service_came_back_is_adopted_too(cluster: Cluster) -> None:
    run_id = cluster.submit_run("ended-while-down")
    job = cluster.crash_after_sbatch(run_id, cut_short=False)  # it ran, then failed
    cluster.slurm.schedule()
    cluster.slurm.finish(job, exit_code=1)
    cluster.tick()
    (attempt,) = cluster.attempts(run_id)
    assert attempt.slurm_job_id == job and attempt.state == AttemptState.FAILED
    assert cluster.slurm.calls["submit"] == 1  # only the dead service's


def test_a_job_whose_worker_reports_before_the_adopting_tick_is_still_adopted(
    cluster: Cluster,
) -> None:
    """The service died after sbatch and submitit's last step; the job started and its
    worker reported progress before a tick ran. The report must not move the attempt on
    from SUBMITTING: a RUNNING attempt without a job id is never adopted, never polled,
    never cancelled."""
    run_id = cluster.submit_run("reported-first")
    job = cluster.crash_after_sbatch(run_id, cut_short=False)
    cluster.slurm.schedule()
    cluster.train(run_id, 5, committed=False)
    (attempt,) = cluster.attempts(run_id)
    assert attempt.state == AttemptState.SUBMITTING and attempt.last_heartbeat_at is not None
    cluster.tick()
    (attempt,) = cluster.attempts(run_id)
    assert attempt.slurm_job_id == job, "adopted, so it is polled and can be cancelled"
    assert cluster.slurm.calls["submit"] == 1  # only the dead service's
    cluster.train(run_id, 6, committed=False)
    assert cluster.attempts(run_id)[0].state == AttemptState.RUNNING
    assert cluster.run(run_id).state == RunState.RUNNING
    cluster.slurm.finish(job, exit_code=1)
    cluster.tick()
    assert cluster.attempts(run_id)[0].state == AttemptState.FAILED, "its end is seen"


def test_an_sbatch_slurmctld_did_not_answer_is_tried_again_not_failed(cluster: Cluster) -> None:
    """No answer is not a refusal: the run does not fail for a slurmctld restart."""
    run_id = cluster.submit_run("no-answer")
    cluster.slurm.break_call("submit")  # "slurmctld not responding": nothing was queued
    cluster.tick()
    (attempt,) = cluster.attempts(run_id)
    assert (
        attempt.state == AttemptState.SUBMITTING and cluster.run(run_id).state == RunState.PENDING
    )
    cluster.slurm.heal_call("submit")
    cluster.tick()
    (attempt,) = cluster.attempts(run_id)
    assert attempt.state == AttemptState.PENDING and len(cluster.slurm.jobs) == 1


def test_an_sbatch_whose_answer_was_lost_is_adopted_not_queued_twice(cluster: Cluster) -> None:
    """sbatch timed out after slurmctld had queued the job: the next pass finds the job by
    its name and records it; nothing is submitted a second time, no token minted again."""
    run_id = cluster.submit_run("answer-lost")
    cluster.slurm.lose_submit_answer()
    cluster.tick()
    (attempt,) = cluster.attempts(run_id)
    (queued,) = cluster.slurm.jobs
    assert attempt.state == AttemptState.SUBMITTING and attempt.slurm_job_id is None
    (token,) = tokens_of(attempt.id)
    cluster.slurm.heal_call("submit")
    cluster.tick()
    (attempt,) = cluster.attempts(run_id)
    assert attempt.slurm_job_id == queued and attempt.state == AttemptState.PENDING
    assert cluster.slurm.calls["submit"] == 1 and len(cluster.slurm.jobs) == 1
    (still,) = tokens_of(attempt.id)  # the job runs on the token written before sbatch
    assert still.id == token.id and still.revoked_at is None


def test_when_slurm_cannot_list_the_queue_nothing_is_submitted_blind(cluster: Cluster) -> None:
    run_id = cluster.submit_run("blind")
    cluster.slurm.break_call("jobs_by_name")
    cluster.tick(2)
    (attempt,) = cluster.attempts(run_id)
    assert attempt.state == AttemptState.SUBMITTING and cluster.slurm.calls["submit"] == 0
    cluster.slurm.heal_call("jobs_by_name")
    cluster.tick()
    assert cluster.slurm.calls["submit"] == 1
    assert cluster.attempts(run_id)[0].state == AttemptState.PENDING
    # A fresh submission gets a worker token, handed to the submission made as the owner
    # (which writes it where the batch script reads it), and the job runs as the owner.
    (token,) = tokens_of(attempt.id)
    assert token.revoked_at is None
    (job,) = cluster.slurm.jobs.values()
    assert hash_token(job.worker_token) == token.token_hash
    run = cluster.run(run_id)
    assert (job.user, job.account) == (run.unix_user, run.slurm_account) != ("", "")


def test_a_refused_sbatch_fails_the_run_with_slurms_reason(cluster: Cluster) -> None:
    run_id = cluster.submit_run("refused")
    cluster.slurm.break_call("submit", "Batch job submission failed: Invalid account")
    cluster.tick()
    run = cluster.run(run_id)
    (attempt,) = cluster.attempts(run_id)
    assert run.state == RunState.FAILED and "Invalid account" in run.state_reason
    assert attempt.stop_reason == StopReason.SUBMISSION_FAILED


def test_a_job_of_another_user_named_like_an_attempt_is_not_adopted(cluster: Cluster) -> None:
    """Job names and ids are visible to every user: bob queues a job named like the next
    attempt of alice's run before the service submits it. It must not stand in for the
    attempt (alice's run would wait on bob's held job); the attempt is submitted as alice."""
    run_id = cluster.submit_run("squatted")
    cluster.reconciler.sync_nodes(take_snapshot(cluster.slurm))
    placement.place_pending(cluster.settings, take_snapshot(cluster.slurm))
    with session_scope() as session:
        run = repository.get_run(session, run_id, for_update=True)
        assert run is not None
        attempt = submission.new_attempt(session, run, cluster.settings)
        name = attempt.job_name
    impostor = cluster.slurm.submit(
        AttemptRequest(run_id=0, attempt_id=0, job_name=name, job_folder=Path("/tmp/bob"),
                       num_nodes=1, ranks_per_node=1, time_limit_min=10,
                       owner=RunOwner(unix_user="bob", slurm_account="speech")),
        "bob's",
    )  # fmt: skip
    cluster.tick()
    (attempt,) = cluster.attempts(run_id)
    assert attempt.slurm_job_id not in (None, impostor)
    ours = cluster.slurm.jobs[attempt.slurm_job_id]
    assert (ours.name, ours.user) == (name, "alice")
    assert cluster.slurm.calls["submit"] == 2  # bob's, then the attempt's own
