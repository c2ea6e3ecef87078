"""A checkpoint whose files fail their checksums: marked CORRUPT, with an incident.

The worker checks each checkpoint twice (worker/checkpoint.py): rank 0 before it commits
one, every rank before it loads one. Either failure reaches `mark_corrupt` through the
worker's checkpoint report. A CORRUPT checkpoint is never resumed from (the newest commit
is read by state: runs/repository.py), never counted among the `keep_checkpoints` newest
(so the one before it stays), and an attempt that failed because its resume checkpoint was
corrupt uses up no restart (recovery/restart.py). Only one thing is proved by a checksum:
the bytes changed after they were written; why (disk, filesystem, a copy) is for the admin,
who is told by an incident and the alert on it (docs/operations.md).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import (
    Attempt,
    Checkpoint,
    CheckpointState,
    Incident,
    IncidentState,
    RecoveryAction,
    Run,
)
from service.models.base import utcnow
from service.observability import metrics
from service.recovery.signals import OPEN_STATES, open_incident
from service.runs import repository
from service.runs.run_state_machine import record_event

SIGNAL = "checkpoint:corrupt"  # the incidents' signal, and the alert's label


def mark_corrupt(
    session: Session, run: Run, attempt: Attempt, step: int, path: str, detail: str
) -> Checkpoint:
    """Mark the checkpoint at `step` CORRUPT (idempotent: the worker's report is retried).

    Found at the commit (it was still WRITING) training goes on and the next save replaces
    it; found at a load (it was COMMITTED) the attempt fails, and the next one resumes from
    the newest checkpoint before it."""
    checkpoint = repository.get_checkpoint(session, run.id, step)
    if checkpoint is None:  # the WRITING report is best-effort: it may never have arrived
        checkpoint = Checkpoint(
            run_id=run.id,
            attempt_id=attempt.id,
            step=step,
            path=path,
            state=CheckpointState.WRITING,
        )
        session.add(checkpoint)
    if checkpoint.state == CheckpointState.CORRUPT:
        return checkpoint
    at_load = checkpoint.state in (CheckpointState.COMMITTED, CheckpointState.DELETED)
    checkpoint.state = CheckpointState.CORRUPT
    checkpoint.corrupt_reason = detail or "checksum mismatch"
    checkpoint.corrupt_at, checkpoint.corrupt_attempt_id = utcnow(), attempt.id
    session.flush()
    previous = repository.newest_committed_checkpoint(session, run.id)
    fallback = f"step {previous.step}" if previous else "scratch (no older committed checkpoint)"
    where = "loading it" if at_load else "committing it"
    then = (
        f"attempt {attempt.number} stops; the next resumes from {fallback}"
        if at_load
        else "not committed; training goes on"
    )
    message = f"checkpoint at step {step} failed its checksums when {where}: {detail}; {then}"
    record_event(
        session,
        run,
        "checkpoint.corrupt",
        message,
        attempt,
        {
            "step": step,
            "path": path,
            "detail": detail,
            "found_at": "load" if at_load else "commit",
            "resume_step": previous.step if previous else None,
        },
    )
    incident = open_incident(
        session,
        kind="checkpoint",
        signal=SIGNAL,
        action=RecoveryAction.OBSERVE,
        message=f"run {run.id}: {message}"[:4000],
        cluster=attempt.cluster,
        run_id=run.id,
        attempt_id=attempt.id,
    )
    if incident is not None:
        incident.details = {"step": step, "path": path, "detail": detail}
        if not at_load:  # nothing to recover: the run never stopped
            incident.state, incident.resolved_at = IncidentState.RESOLVED, utcnow()
    return checkpoint


def found_corrupt_at_load(session: Session, attempt: Attempt) -> Checkpoint | None:
    """The checkpoint `attempt` resumed from, if the attempt found it corrupt."""
    if attempt.resume_step is None:
        return None
    return session.scalars(
        select(Checkpoint).where(
            Checkpoint.run_id == attempt.run_id,
            Checkpoint.step == attempt.resume_step,
            Checkpoint.state == CheckpointState.CORRUPT,
            Checkpoint.corrupt_attempt_id == attempt.id,
        )
    ).one_or_none()


def attempt_ended(session: Session, run: Run, attempt: Attempt) -> None:
    """The attempt that found its resume checkpoint corrupt has ended: its incident's
    recovery phase starts (recovery/incident_timeline.py stamps the rest and resolves it at the
    next attempt's first step)."""
    incidents = session.scalars(
        select(Incident).where(
            Incident.run_id == run.id,
            Incident.attempt_id == attempt.id,
            Incident.signal == SIGNAL,
            Incident.state.in_(OPEN_STATES),
            Incident.attempt_ended_at.is_(None),
        )
    ).all()
    for incident in incidents:
        incident.attempt_ended_at = utcnow()
        metrics.observe_incident(incident, "stop")
