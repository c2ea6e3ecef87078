"""The run and attempt state machines: every transition goes through here and is recorded."""

from __future__ import annotations

from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from service.models import (
    Attempt,
    AttemptState,
    Incident,
    IncidentState,
    Run,
    RunEvent,
    RunState,
)
from service.models.base import utcnow
from service.notifications import outbox
from service.observability.metrics import count_run_event

RUN_TRANSITIONS: dict[RunState, set[RunState]] = {
    RunState.PENDING: {RunState.RUNNING, RunState.CANCELLING, RunState.FAILED, RunState.CANCELLED},
    RunState.RUNNING: {RunState.PENDING, RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLING},
    RunState.CANCELLING: {RunState.CANCELLED},
    RunState.SUCCEEDED: set(),
    RunState.FAILED: set(),
    RunState.CANCELLED: set(),
}

ATTEMPT_TRANSITIONS: dict[AttemptState, set[AttemptState]] = {
    AttemptState.SUBMITTING: {
        AttemptState.PENDING,
        AttemptState.RUNNING,
        AttemptState.FAILED,
        AttemptState.CANCELLED,
    },
    AttemptState.PENDING: {
        AttemptState.RUNNING,
        AttemptState.SUCCEEDED,
        AttemptState.FAILED,
        AttemptState.CANCELLED,
    },
    AttemptState.RUNNING: {
        AttemptState.SUCCEEDED,
        AttemptState.FAILED,
        AttemptState.CANCELLED,
        AttemptState.STOPPED,
    },
    AttemptState.SUCCEEDED: set(),
    AttemptState.FAILED: set(),
    AttemptState.CANCELLED: set(),
    AttemptState.STOPPED: set(),
}


class IllegalTransition(RuntimeError):
    """A bug: code asked for a transition the state machine does not allow."""


def record_event(
    session: Session,
    run: Run,
    kind: str,
    message: str,
    attempt: Attempt | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    session.add(
        RunEvent(
            run_id=run.id,
            attempt_id=attempt.id if attempt else None,
            kind=kind,
            message=message,
            data=data or {},
        )
    )
    count_run_event(kind)
    # Subscribers hear of it from the outbox row written in this same transaction.
    outbox.on_run_event(session, run, kind, message, attempt.id if attempt else None, data or {})


def set_run_state(
    session: Session, run: Run, new: RunState, reason: str, attempt: Attempt | None = None
) -> None:
    """Move `run` to `new`, stamping times and writing the timeline entry."""
    if new == run.state:
        return
    if new not in RUN_TRANSITIONS[run.state]:
        raise IllegalTransition(f"run {run.id}: {run.state} -> {new}")
    old, run.state, run.state_reason = run.state, new, reason
    now = utcnow()
    if new == RunState.RUNNING and run.started_at is None:
        run.started_at = now
    if new.is_terminal:
        run.ended_at = now
        # Nothing is left to recover once the run ended: close its incidents, so a new
        # signal from the same node opens a new one instead of being taken for a repeat.
        session.execute(
            update(Incident)
            .where(
                Incident.run_id == run.id,
                Incident.state.in_((IncidentState.OPEN, IncidentState.WAITING)),
            )
            .values(state=IncidentState.RESOLVED, resolved_at=now)
        )
    record_event(
        session, run, f"run.{new.lower()}", reason, attempt, {"from": old.value, "to": new.value}
    )


def set_attempt_state(
    session: Session,
    run: Run,
    attempt: Attempt,
    new: AttemptState,
    reason: str = "",
    exit_code: int | None = None,
) -> None:
    if new == attempt.state:
        return
    if new not in ATTEMPT_TRANSITIONS[attempt.state]:
        raise IllegalTransition(f"attempt {attempt.id}: {attempt.state} -> {new}")
    old, attempt.state = attempt.state, new
    now = utcnow()
    if new == AttemptState.RUNNING:
        attempt.started_at = attempt.started_at or now
    if new.is_terminal:
        attempt.ended_at = now
        attempt.end_reason = reason
        attempt.exit_code = exit_code
    message = f"attempt {attempt.number}: {new.lower()}" + (f" ({reason})" if reason else "")
    record_event(
        session,
        run,
        f"attempt.{new.lower()}",
        message,
        attempt,
        {
            "from": old.value,
            "to": new.value,
            "exit_code": exit_code,
            "slurm_job_id": attempt.slurm_job_id,
            "nodes": attempt.nodes,
        },
    )
