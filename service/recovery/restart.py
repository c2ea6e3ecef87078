"""Ending an attempt and deciding whether its run goes again: one place for the policy."""

from __future__ import annotations

from sqlalchemy.orm import Session

from contract import StopReason
from service.models import Attempt, AttemptState, Run, RunState
from service.runs.lifecycle import set_attempt_state, set_run_state


def set_stop_reason(attempt: Attempt, reason: StopReason) -> None:
    """Record why `attempt` ended (before its terminal transition). It replaces a stop the
    service asked for, since the attempt may have ended otherwise first (a node failed while
    it checkpointed to yield); only a preemption keeps the run it made room for."""
    attempt.stop_reason = reason
    if reason != StopReason.PREEMPTED:
        attempt.stopped_for_run_id = None


def end_attempt_and_restart(
    session: Session,
    run: Run,
    attempt: Attempt,
    reason: str,
    *,
    cause: StopReason,
    exit_code: int | None = None,
) -> bool:
    """Mark `attempt` FAILED for `cause` (`reason` says it in words) and send the run back
    to PENDING if it may go again.

    Hardware failures (a drained node) never use up `max_restarts`: the run did nothing
    wrong. Everything else does, so a run that keeps failing in its own code stops instead of
    burning spares forever; a worker that said DO_NOT_RETRY fails the run at once. Returns
    True if the run will restart.
    """
    if not attempt.state.is_terminal:
        set_stop_reason(attempt, cause)
        set_attempt_state(session, run, attempt, AttemptState.FAILED, reason, exit_code)
    if run.state.is_terminal or run.state == RunState.CANCELLING:
        return False
    hardware = cause == StopReason.NODE_FAILURE
    software_restarts = run.num_restarts - run.num_hardware_restarts
    if cause == StopReason.DO_NOT_RETRY:
        set_run_state(
            session,
            run,
            RunState.FAILED,
            f"{reason}: the worker refused to retry (bad spec or code bug)",
            attempt,
        )
        return False
    if not hardware and software_restarts >= run.max_restarts:
        set_run_state(
            session,
            run,
            RunState.FAILED,
            f"{reason}; no restarts left ({run.max_restarts} allowed)",
            attempt,
        )
        return False
    run.num_restarts += 1
    if hardware:
        run.num_hardware_restarts += 1
        budget = "hardware restart: does not count against max_restarts"
    else:
        budget = f"restart {software_restarts + 1} of {run.max_restarts}"
    set_run_state(session, run, RunState.PENDING, f"{reason}; {budget}", attempt)
    return True
