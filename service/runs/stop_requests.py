"""Asking an attempt's ranks to stop at a checkpoint: the service records the request, the
ranks read it in their next progress reply (workers/endpoints.py), save, and exit 0.

Preemption, a segment's time limit, a slow node and a user's cancel all ask this way, never
through a Slurm signal (submitit's own USR2 handler would requeue or fail the job under
us); ranks that have not left within `Settings.stop_grace_s` are scancelled.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from contract import StopReason
from service.models import Attempt, Run
from service.models.base import utcnow
from service.runs.run_state_machine import record_event

STOP_TEXT = {
    StopReason.TIME_LIMIT: "segment time limit",
    StopReason.SLOW_NODE: "moving off a slow node",
    StopReason.CANCELLED: "cancelled by the user",
}


def stop_text(attempt: Attempt) -> str:
    """The attempt's stop reason in words, for people (code reads the enum)."""
    if attempt.stop_reason == StopReason.PREEMPTED:
        return f"preempted by run {attempt.stopped_for_run_id}"
    if attempt.stop_reason in STOP_TEXT:
        return STOP_TEXT[attempt.stop_reason]
    return str(attempt.stop_reason or "stopped")


def request_stop(
    session: Session, run: Run, attempt: Attempt, reason: StopReason, for_run: Run | None = None
) -> None:
    """Ask the ranks to checkpoint and exit 0 (they read it in their next progress reply)."""
    attempt.stop_reason, attempt.stop_requested_at = reason, utcnow()
    attempt.stopped_for_run_id = for_run.id if for_run else None
    text = stop_text(attempt) + (f" ({for_run.priority})" if for_run else "")
    record_event(
        session,
        run,
        "attempt.stop_requested",
        f"attempt {attempt.number}: {text}",
        attempt,
        {"reason": reason.value, "for_run_id": attempt.stopped_for_run_id},
    )
