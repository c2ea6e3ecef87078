"""The end-of-job verdict: what an attempt whose Slurm job left the queue amounts to.

In order: a stop the service asked for that ended cleanly is a yield (STOPPED, the run
waits to be placed again); a run whose worker reported its final step with the final
checkpoint committed SUCCEEDED; anything else FAILED, and restart.py decides whether the
run goes again (do-not-retry fails it at once; max_restarts counts software failures).
Exit codes alone never make a success: a job can end COMPLETED after a rank gave up.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from contract import ExitCode, StopReason
from service.models import Attempt, AttemptState, CheckpointState, Run, RunState
from service.reconcile.preemption import attempt_stopped
from service.recovery.fast_path import judge_group_ended
from service.recovery.restart import end_attempt_and_restart, set_stop_reason
from service.runs import repository
from service.runs.run_state_machine import set_attempt_state, set_run_state
from service.slurm.client import JobStatus

NODE_FAIL = "NODE_FAIL"  # Slurm's JobState for a job ended by one of its nodes failing


def judge_ended_attempt(
    session: Session, run: Run, attempt: Attempt, status: JobStatus | None
) -> None:
    """The job left Slurm: succeed only if the worker said it finished; else maybe restart."""
    slurm_state = status.state if status else "UNKNOWN (slurmctld forgot the job)"
    exit_code = status.exit_code if status else None
    if attempt.replica_group is not None:  # one group of a replica-group run
        judge_group_ended(session, run, attempt, slurm_state, exit_code)
        return
    # A rank may have said so before exiting (workers/service.py): Slurm's code may be 1.
    do_not_retry = attempt.do_not_retry or exit_code == ExitCode.DO_NOT_RETRY
    asked_to_yield = attempt.stop_requested_at is not None and (
        attempt.stop_reason is not None and attempt.stop_reason.is_yield
    )
    if asked_to_yield and exit_code == 0 and not do_not_retry and run.final_step != run.total_steps:
        # We asked it to stop and it left cleanly after its checkpoint: a yield, not a failure.
        attempt_stopped(session, run, attempt, f"Slurm job {slurm_state}")
        return
    final = repository.get_checkpoint(session, run.id, run.total_steps)
    finished = (
        run.final_step == run.total_steps
        and final is not None
        and final.state in (CheckpointState.COMMITTED, CheckpointState.DELETED)
    )
    if finished:
        set_stop_reason(attempt, StopReason.COMPLETED)
        set_attempt_state(
            session, run, attempt, AttemptState.SUCCEEDED, f"Slurm job {slurm_state}", exit_code
        )
        if run.state == RunState.PENDING:
            set_run_state(session, run, RunState.RUNNING, "finished before it was seen running")
        set_run_state(
            session,
            run,
            RunState.SUCCEEDED,
            f"trained {run.total_steps} steps; final checkpoint committed",
            attempt,
        )
        return
    # Exit codes lie: a job can end COMPLETED after a rank gave up. Only the worker's
    # report of its final step counts as success.
    reason = f"Slurm job {attempt.slurm_job_id} ended {slurm_state}"
    reason += f" with exit code {exit_code}" if exit_code is not None else ""
    if run.final_step is None and slurm_state == "COMPLETED":
        reason += " before the worker reported its final step"
    if do_not_retry:
        cause = StopReason.DO_NOT_RETRY
    elif slurm_state == NODE_FAIL:
        # Slurm saw a node die before any agent said so: the hardware failed, not the run,
        # so it uses up none of the run's own restarts.
        cause = StopReason.NODE_FAILURE
    else:
        cause = StopReason.JOB_FAILED
    end_attempt_and_restart(session, run, attempt, reason, cause=cause, exit_code=exit_code)
