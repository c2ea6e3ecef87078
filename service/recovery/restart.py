"""Ending an attempt and deciding whether its run goes again: one place for the policy."""

from __future__ import annotations

from sqlalchemy.orm import Session

from contract import StopReason
from service.models import Attempt, AttemptState, CheckpointState, Run, RunState
from service.recovery import checkpoints, repeats, sdc
from service.runs import repository, rollback
from service.runs.run_state_machine import set_attempt_state, set_run_state

# Causes that may turn out to be a corrupt checkpoint or a repeat of the last failure.
_SOFTWARE = (StopReason.JOB_FAILED, StopReason.RECOVERY_RESTART)


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
    wrong; nor does an attempt whose resume checkpoint failed its checksums (it is marked
    CORRUPT, and the next attempt resumes from the one before). Everything else does, so a
    run that keeps failing in its own code stops instead of burning spares forever; a
    worker that said DO_NOT_RETRY fails the run at once, and so does the same failure at
    the same step as the attempt before (one retry, not max_restarts). A loss spike or
    non-finite value the worker stopped for rolls the run back past it without counting a
    restart (ROLLED_BACK), or stops it where rollbacks did not help (REPEATED_ANOMALY).
    Replicas that disagreed (silent data corruption) roll the run back to before the last
    clean comparison (SDC), one of max_restarts: the run's own report claimed it.
    Returns True if the run will restart.
    """
    if not attempt.state.is_terminal:
        cause, reason = _why_it_ended(session, run, attempt, cause, reason)
        set_stop_reason(attempt, cause)
        set_attempt_state(session, run, attempt, AttemptState.FAILED, reason, exit_code)
    if run.state.is_terminal or run.state == RunState.CANCELLING:
        return False
    return _restart_or_fail(session, run, attempt, cause, reason)


def _why_it_ended(
    session: Session, run: Run, attempt: Attempt, cause: StopReason, reason: str
) -> tuple[StopReason, str]:
    """The cause the attempt ended for, looked at closer before it is recorded: replicas
    that disagreed (SDC) or a loss spike the worker stopped for turn it into a rollback,
    and a software failure of a run without groups may be a corrupt checkpoint or a repeat
    of the attempt before (`_what_failed`). The run's fate follows from the cause decided
    here, and the attempt's stop reason and event text say it."""
    anomaly = None
    # A replica group's too: its ranks compare across groups and every group stops.
    corruption = sdc.report_of(session, attempt)
    if corruption is not None:
        # The replicas disagreed (service/recovery/sdc.py): however the attempt ended (its
        # ranks exited, or the drain of the odd node stopped it), roll back past it.
        cause, reason = sdc.decide(session, run, attempt, corruption, reason)
    elif cause in _SOFTWARE:
        # A loss spike or non-finite value the worker stopped for: roll back past it
        # (service/runs/rollback.py), before asking whether it repeats a failure. Replica
        # groups see the same losses, so every group stops for it.
        anomaly = rollback.anomaly_of(session, attempt)
    if anomaly is not None:
        cause, reason = rollback.decide(session, run, attempt, anomaly, reason)
    elif cause in _SOFTWARE and attempt.replica_group is None:
        cause, reason = _what_failed(session, run, attempt, cause, reason)
    return cause, reason


def _restart_or_fail(
    session: Session, run: Run, attempt: Attempt, cause: StopReason, reason: str
) -> bool:
    """The run's fate once `attempt` ended for `cause`, the run neither ended nor being
    cancelled. The causes that decide it outright come first (a refusal to retry, a
    deterministic failure and a rollback that did not help fail it; a rollback and a
    corrupt checkpoint send it back without using a restart), so that only the failures
    left spend from max_restarts (`_spend_restart`). Returns True if the run will restart."""
    if cause == StopReason.DO_NOT_RETRY:
        set_run_state(
            session,
            run,
            RunState.FAILED,
            f"{reason}: the worker refused to retry (bad spec or code bug)",
            attempt,
        )
        return False
    if cause == StopReason.DETERMINISTIC_FAILURE:
        software_restarts = run.num_restarts - run.num_hardware_restarts
        set_run_state(
            session,
            run,
            RunState.FAILED,
            f"{reason}; stopped after one retry instead of max_restarts "
            f"({software_restarts} of {run.max_restarts} used)",
            attempt,
        )
        return False
    if cause == StopReason.REPEATED_ANOMALY:
        set_run_state(session, run, RunState.FAILED, reason, attempt)
        return False
    if cause == StopReason.ROLLED_BACK:
        set_run_state(session, run, RunState.PENDING, reason, attempt)
        return True
    if cause == StopReason.CHECKPOINT_CORRUPT:
        checkpoints.attempt_ended(session, run, attempt)
        newest = repository.newest_committed_checkpoint(session, run.id)
        since = f"step {newest.step}" if newest else "scratch"
        set_run_state(
            session,
            run,
            RunState.PENDING,
            f"{reason}; resuming from {since}: does not count against max_restarts",
            attempt,
        )
        return True
    return _spend_restart(session, run, attempt, cause, reason)


def _spend_restart(
    session: Session, run: Run, attempt: Attempt, cause: StopReason, reason: str
) -> bool:
    """Restart the run after a failure of its own or of the cluster's: a hardware failure
    (a drained node) is counted apart and never uses up max_restarts, since the run did
    nothing wrong; any other failure does, so a run that keeps failing in its own code
    stops instead of burning spares forever. Returns True if the run will restart."""
    # Silent data corruption drains its node like a failed one, but only the run's own
    # report says so (recovery/claims.py): it is one of the run's max_restarts.
    hardware = cause in (StopReason.NODE_FAILURE, StopReason.CLUSTER_FAILOVER)
    software_restarts = run.num_restarts - run.num_hardware_restarts
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


def _what_failed(
    session: Session, run: Run, attempt: Attempt, cause: StopReason, reason: str
) -> tuple[StopReason, str]:
    """A software failure, looked at closer: the attempt's resume checkpoint failed its
    checksums (CHECKPOINT_CORRUPT), or it failed the same way at the same step as the
    attempt before (DETERMINISTIC_FAILURE). A checkpoint that failed to load the same way
    twice is taken for corrupt, unless the same error already condemned another one: then
    the code cannot load checkpoints, and walking back through them all would not help."""
    corrupt = checkpoints.found_corrupt_at_load(session, attempt)
    if corrupt is not None:
        return (
            StopReason.CHECKPOINT_CORRUPT,
            f"{reason}: its resume checkpoint (step {corrupt.step}) failed its checksums",
        )
    repeat = repeats.repeated(session, attempt)
    if repeat is None:
        return cause, reason
    if repeat.loads:
        why = f"failed to load twice: {repeat.text[:1000]}"
        target = repository.get_checkpoint(session, run.id, repeat.step)
        condemned = [
            c
            for c in repository.checkpoints(session, run.id)
            if c.state == CheckpointState.CORRUPT and c.corrupt_reason == why
        ]
        if target is not None and target.state == CheckpointState.COMMITTED and not condemned:
            checkpoints.mark_corrupt(session, run, attempt, repeat.step, target.path, why)
            return (
                StopReason.CHECKPOINT_CORRUPT,
                f"{reason}: the checkpoint at step {repeat.step} failed to load twice "
                "the same way; marked CORRUPT",
            )
    before = attempt.number - 1
    return (
        StopReason.DETERMINISTIC_FAILURE,
        f"{reason}: deterministic failure, the same as attempt {before}: {repeat.describe()}",
    )
