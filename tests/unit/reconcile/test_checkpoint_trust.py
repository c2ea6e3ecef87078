"""Checkpoints you can trust and restart loops, decided against the fake Slurm.

A checkpoint found corrupt is marked CORRUPT, never resumed from, keeps the one before it
from pruning, opens an incident, and the attempt that found it costs no restart. The same
failure at the same step twice stops the run after one retry, with its reason."""

from __future__ import annotations

from sqlalchemy import select

from contract import StopReason
from service.db import session_scope
from service.models import CheckpointState, Incident, IncidentState, RunEvent, RunState
from service.runs import repository
from service.worker_protocol.schemas import CheckpointReport, ErrorReport, ProgressReport
from service.workers import service as workers
from tests.fixtures.rows import checkpoint_path
from tests.unit.reconcile.conftest import Cluster


def running(cluster: Cluster, name: str, **spec: object) -> int:
    run_id = cluster.submit_run(name, **spec)
    cluster.cycle()
    assert cluster.run(run_id).state == RunState.RUNNING
    return run_id


def live_attempt_id(cluster: Cluster, run_id: int) -> int:
    attempt = repository.live_attempt(cluster.run(run_id))
    assert attempt is not None
    return attempt.id


def report_corrupt(cluster: Cluster, run_id: int, step: int, detail: str) -> None:
    """Rank 0 reports a checkpoint that failed its checksums (train.py, at load or commit)."""
    path = checkpoint_path(cluster.run(run_id), step, cluster.settings)
    report = CheckpointReport(step=step, path=path, state="CORRUPT", detail=detail)
    with session_scope() as session:
        attempt_id = live_attempt_id(cluster, run_id)
        workers.record_checkpoint(session, attempt_id, report, cluster.settings)


def report_exception(cluster: Cluster, run_id: int, step: int, message: str, rank: int = 0) -> None:
    """What worker/entry.py posts for an exception that escaped training at `step`."""
    report = ErrorReport(rank=rank, kind="worker:exception", message=message, step=step)
    with session_scope() as session:
        workers.record_error(session, live_attempt_id(cluster, run_id), report)


def fail_job(cluster: Cluster, run_id: int) -> None:
    """The job exits 1 (an exception), the verdict, and the next attempt if any."""
    cluster.slurm.finish(cluster.live_job(run_id), exit_code=1)
    cluster.tick(2)
    cluster.slurm.schedule()
    cluster.tick()


def states(cluster: Cluster, run_id: int) -> dict[int, CheckpointState]:
    with session_scope() as session:
        return {c.step: c.state for c in repository.checkpoints(session, run_id)}


def checkpoint_incidents(run_id: int) -> list[Incident]:
    with session_scope() as session:
        return list(
            session.scalars(
                select(Incident).where(
                    Incident.run_id == run_id, Incident.signal == "checkpoint:corrupt"
                )
            )
        )


def test_a_checkpoint_corrupt_at_load_is_skipped_and_costs_no_restart(cluster: Cluster) -> None:
    run_id = running(cluster, "corrupt-at-load", keep_checkpoints=2, max_restarts=1)
    cluster.train(run_id, 20)
    cluster.train(run_id, 40)
    fail_job(cluster, run_id)  # a crash: restart 1 of 1, from step 40
    _, loads_40 = cluster.attempts(run_id)
    assert loads_40.resume_step == 40 and cluster.run(run_id).num_restarts == 1

    # Attempt 2's ranks verify step 40 before loading it: a byte changed since it was written.
    report_corrupt(cluster, run_id, 40, "/ckpt/40/__0_0.distcp: sha256 ab..., 12... when written")
    assert states(cluster, run_id) == {20: CheckpointState.COMMITTED, 40: CheckpointState.CORRUPT}
    fail_job(cluster, run_id)  # the ranks raise CheckpointCorruptError and exit 1

    run = cluster.run(run_id)
    _, refused, resumed = cluster.attempts(run_id)
    assert refused.stop_reason == StopReason.CHECKPOINT_CORRUPT
    assert "failed its checksums" in (refused.end_reason or "")
    # No restart was wasted: max_restarts was 1 and already used by the crash.
    assert run.state == RunState.RUNNING and run.num_restarts == 1
    assert resumed.resume_step == 20  # the corrupt one is never loaded again

    with session_scope() as session:
        newest = repository.newest_committed_checkpoint(session, run_id)
        assert newest is not None and newest.step == 20
        corrupt = repository.get_checkpoint(session, run_id, 40)
        assert corrupt is not None and corrupt.corrupt_attempt_id == refused.id
        assert "sha256" in (corrupt.corrupt_reason or "")
    (incident,) = checkpoint_incidents(run_id)
    assert incident.attempt_ended_at is not None and incident.details["step"] == 40
    assert "checkpoint.corrupt" in cluster.events(run_id)

    # The resumed attempt trains: the incident is resolved at its first step.
    with session_scope() as session:
        workers.record_progress(
            session, resumed.id, ProgressReport(rank=0, metrics=[{"step": 21, "loss": 1.0}])
        )
    (incident,) = checkpoint_incidents(run_id)
    assert incident.state == IncidentState.RESOLVED and incident.resume_step == 20


def test_a_checkpoint_corrupt_at_commit_is_never_the_newest_and_keeps_the_one_before(
    cluster: Cluster,
) -> None:
    run_id = running(cluster, "corrupt-at-commit", keep_checkpoints=1)
    cluster.train(run_id, 20)
    cluster.train(run_id, 40, committed=False)  # WRITING: its files are being written
    report_corrupt(cluster, run_id, 40, "/ckpt/40/__1_0.distcp: 100 bytes, 120 when written")
    # keep_checkpoints=1, yet step 20 is kept: the corrupt one does not count.
    assert states(cluster, run_id) == {20: CheckpointState.COMMITTED, 40: CheckpointState.CORRUPT}
    report_corrupt(cluster, run_id, 40, "the reporter retried")  # idempotent
    (incident,) = checkpoint_incidents(run_id)
    assert incident.state == IncidentState.RESOLVED  # training went on: nothing to recover
    assert cluster.run(run_id).state == RunState.RUNNING

    fail_job(cluster, run_id)  # a later crash resumes from 20, not from the corrupt 40
    assert cluster.attempts(run_id)[-1].resume_step == 20
    # The next save at step 60 commits, and only then is 20 pruned (keep_checkpoints=1).
    cluster.train(run_id, 60)
    assert states(cluster, run_id) == {
        20: CheckpointState.DELETED,
        40: CheckpointState.CORRUPT,
        60: CheckpointState.COMMITTED,
    }


def test_the_same_failure_at_the_same_step_stops_after_one_retry(cluster: Cluster) -> None:
    run_id = running(cluster, "deterministic", max_restarts=5)
    cluster.train(run_id, 20)
    report_exception(cluster, run_id, 30, "RuntimeError: shape mismatch [4, 4096] pid 4711")
    fail_job(cluster, run_id)
    first, _ = cluster.attempts(run_id)
    assert first.stop_reason == StopReason.JOB_FAILED and cluster.run(run_id).num_restarts == 1

    # The retry resumes from 20 and fails at 30 again (its numbers differ: same signature).
    report_exception(cluster, run_id, 30, "RuntimeError: shape mismatch [4, 4096] pid 4712")
    fail_job(cluster, run_id)

    run = cluster.run(run_id)
    assert len(cluster.attempts(run_id)) == 2  # no third attempt
    assert run.state == RunState.FAILED and run.num_restarts == 1  # not max_restarts (5)
    stopped = cluster.attempts(run_id)[1]
    assert stopped.stop_reason == StopReason.DETERMINISTIC_FAILURE
    assert "the same as attempt 1" in run.state_reason and "at step 30" in run.state_reason
    assert "stopped after one retry" in run.state_reason


def test_different_failures_or_steps_are_bad_luck_and_retried(cluster: Cluster) -> None:
    run_id = running(cluster, "not-deterministic", max_restarts=5)
    report_exception(cluster, run_id, 30, "RuntimeError: shape mismatch")
    fail_job(cluster, run_id)
    report_exception(cluster, run_id, 31, "RuntimeError: shape mismatch")  # another step
    fail_job(cluster, run_id)
    report_exception(cluster, run_id, 31, "OSError: disk full")  # another error
    fail_job(cluster, run_id)
    fail_job(cluster, run_id)  # no report at all (killed): no signature
    run = cluster.run(run_id)
    assert run.state == RunState.RUNNING and run.num_restarts == 4
    assert {a.stop_reason for a in cluster.attempts(run_id)[:-1]} == {StopReason.JOB_FAILED}


def test_a_checkpoint_that_fails_to_load_twice_the_same_way_is_marked_corrupt(
    cluster: Cluster,
) -> None:
    """The signature points at the checkpoint: mark it CORRUPT and go back one, once; the
    same error on the checkpoint before is the code's, not the checkpoint's: stop."""
    run_id = running(cluster, "fails-to-load", keep_checkpoints=3, max_restarts=5)
    cluster.train(run_id, 20)
    cluster.train(run_id, 40)
    fail_job(cluster, run_id)  # restart 1, from 40

    def load_fails(step: int) -> None:
        report = ErrorReport(
            rank=0, kind="worker:checkpoint_load", message="KeyError: 'model.w'", step=step
        )
        with session_scope() as session:
            workers.record_error(session, live_attempt_id(cluster, run_id), report)
        fail_job(cluster, run_id)

    load_fails(40)  # restart 2, from 40 again
    load_fails(40)  # twice: 40 is CORRUPT, free restart from 20
    assert states(cluster, run_id)[40] == CheckpointState.CORRUPT
    attempts = cluster.attempts(run_id)
    assert attempts[2].stop_reason == StopReason.CHECKPOINT_CORRUPT
    assert attempts[-1].resume_step == 20 and cluster.run(run_id).num_restarts == 2

    load_fails(20)  # restart 3, from 20 again
    load_fails(20)  # the same error condemned 40 already: the code, not the checkpoints
    run = cluster.run(run_id)
    assert run.state == RunState.FAILED
    assert cluster.attempts(run_id)[-1].stop_reason == StopReason.DETERMINISTIC_FAILURE
    assert states(cluster, run_id)[20] == CheckpointState.COMMITTED
    with session_scope() as session:
        kinds = session.scalars(select(RunEvent.kind).where(RunEvent.run_id == run_id)).all()
    assert kinds.count("checkpoint.corrupt") == 1
