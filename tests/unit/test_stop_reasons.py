"""Why attempts stop is a typed column, never text matched by prefix; a worker's
do-not-retry is a column of its own, not an exit code written while the job still runs."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from contract import StopReason
from service.models import Attempt, AttemptState, Run, RunState
from service.reconcile.polling import Observed, apply_observation
from service.reconcile.preemption import request_preemptions
from service.runs.stop_requests import request_stop
from service.slurm.commands import JobStatus
from service.worker_protocol.schemas import ErrorReport, ProgressReport
from service.workers.endpoints import report_progress
from service.workers.service import record_error
from tests.fixtures.rows import add_attempt, add_run

NODES = ["gpu001", "gpu002"]


def running_scavenger(session: Session) -> tuple[Run, Attempt]:
    run = add_run(session, RunState.RUNNING, priority="scavenger", nodes=list(NODES))
    return run, add_attempt(session, run, 1, AttemptState.RUNNING, slurm_job_id="100")


def test_a_preemption_for_run_12_does_not_read_as_one_for_run_1(db_session: Session) -> None:
    """The old prefix match took "preempted by run 12" for run 1's and never freed its nodes."""
    # Ids that are prefixes of each other, as run 1 and run 12 are, past every existing one.
    base = (db_session.scalar(select(func.max(Run.id))) or 0) + 100
    small = add_run(db_session, RunState.PENDING, id=base, priority="prod")
    big = add_run(db_session, RunState.PENDING, id=base * 10 + 2, priority="prod")
    yielding_run, yielding = running_scavenger(db_session)
    _, other = running_scavenger(db_session)
    request_stop(db_session, yielding_run, yielding, StopReason.PREEMPTED, for_run=big)

    request_preemptions(db_session, num_free_nodes=0)

    assert other.stop_requested_at is not None
    assert (other.stop_reason, other.stopped_for_run_id) == (StopReason.PREEMPTED, small.id)
    assert (yielding.stop_reason, yielding.stopped_for_run_id) == (StopReason.PREEMPTED, big.id)
    ack = report_progress(other.id, ProgressReport(rank=0), db_session)
    assert ack.stop_requested and ack.stop_reason == StopReason.PREEMPTED
    assert ack.model_dump(mode="json")["stop_reason"] == "preempted"


def test_a_run_being_made_room_for_is_given_no_second_victim(db_session: Session) -> None:
    waiting = add_run(db_session, RunState.PENDING, priority="prod")
    yielding_run, yielding = running_scavenger(db_session)
    _, other = running_scavenger(db_session)
    request_stop(db_session, yielding_run, yielding, StopReason.PREEMPTED, for_run=waiting)

    request_preemptions(db_session, num_free_nodes=0)

    assert other.stop_requested_at is None and other.stop_reason is None


def test_the_yielded_attempt_hands_its_nodes_to_the_run_it_was_preempted_for(
    db_session: Session,
) -> None:
    waiting = add_run(db_session, RunState.PENDING, priority="prod")
    run, attempt = running_scavenger(db_session)
    request_stop(db_session, run, attempt, StopReason.PREEMPTED, for_run=waiting)

    _observe(db_session, attempt, "COMPLETED", exit_code=0)

    assert attempt.state == AttemptState.STOPPED and attempt.stop_reason == StopReason.PREEMPTED
    assert attempt.stopped_for_run_id == waiting.id
    assert run.state == RunState.PENDING and run.nodes == []
    assert f"preempted by run {waiting.id}" in (attempt.end_reason or "")
    assert run.num_restarts == 0


def test_only_a_preemption_names_the_run_it_stopped_for(db_session: Session) -> None:
    waiting = add_run(db_session, RunState.PENDING, priority="prod")
    _, attempt = running_scavenger(db_session)
    attempt.stop_reason, attempt.stopped_for_run_id = StopReason.TIME_LIMIT, waiting.id
    with (
        pytest.raises(IntegrityError, match="stopped_for_run_only_when_preempted"),
        db_session.begin_nested(),
    ):
        db_session.flush()


def _observe(session: Session, attempt: Attempt, state: str, exit_code: int | None = None) -> None:
    """What one reconcile pass does with the job's state as squeue/scontrol report it."""
    status = JobStatus("100", state, "gpu[001-002]", "", exit_code)
    apply_observation(session, Observed(attempt.id, status, list(NODES)), "runyard-test")


def test_do_not_retry_is_its_own_column_and_fails_the_run_once_the_job_ends(
    db_session: Session,
) -> None:
    run, attempt = running_scavenger(db_session)
    run.max_restarts = 3
    record_error(
        db_session,
        attempt.id,
        ErrorReport(rank=0, kind="worker:do_not_retry", message="fp8 needs an H100"),
    )
    assert attempt.do_not_retry and attempt.exit_code is None

    # Slurm still runs the job: nothing about the attempt has ended.
    _observe(db_session, attempt, "RUNNING")
    assert attempt.state == AttemptState.RUNNING and attempt.ended_at is None
    assert attempt.stop_reason is None and run.state == RunState.RUNNING
    assert not report_progress(attempt.id, ProgressReport(rank=1), db_session).stop_requested

    # srun reports 1 when one rank exits 3: the column, not the exit code, decides.
    _observe(db_session, attempt, "FAILED", exit_code=1)
    assert attempt.state == AttemptState.FAILED and attempt.exit_code == 1
    assert attempt.stop_reason == StopReason.DO_NOT_RETRY
    assert run.state == RunState.FAILED and run.num_restarts == 0


def test_the_same_failure_without_do_not_retry_is_retried(db_session: Session) -> None:
    run, attempt = running_scavenger(db_session)
    _observe(db_session, attempt, "FAILED", exit_code=1)
    assert attempt.stop_reason == StopReason.JOB_FAILED
    assert run.state == RunState.PENDING and run.num_restarts == 1
