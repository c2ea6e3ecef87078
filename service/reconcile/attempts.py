"""Reconcile runs and their attempts with Slurm.

dstack's rule holds throughout: no sbatch/squeue/scancel call while a database transaction
is open. Each step reads what to do in one short transaction, talks to Slurm, then writes
the outcome in another, re-reading rows under lock because they may have moved meanwhile.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from service.config import Settings
from service.db import session_scope
from service.models import Attempt, AttemptState, CheckpointState, Run, RunState
from service.models.base import utcnow
from service.runs import repository
from service.runs.lifecycle import record_event, set_attempt_state, set_run_state
from service.runs.schemas import RunSpec
from service.slurm import commands
from service.slurm.commands import JobStatus, SlurmError
from service.slurm.submit import AttemptRequest, job_name, submit_attempt
from worker.config import ExitCode

log = logging.getLogger(__name__)


def _request(run: Run, attempt: Attempt) -> AttemptRequest:
    spec = RunSpec.model_validate(run.spec)
    return AttemptRequest(
        run_id=run.id,
        attempt_id=attempt.id,
        job_name=attempt.job_name,
        job_folder=Path(attempt.job_folder),
        num_nodes=run.num_nodes,
        ranks_per_node=run.gpus_per_node,
        time_limit_min=spec.time_limit_min,
    )


def submit_pending(settings: Settings) -> None:
    """Give every PENDING run without a live attempt a new one, and submit it."""
    todo: list[AttemptRequest] = []
    with session_scope() as session:
        for run in repository.runs_in_states(session, [RunState.PENDING]):
            attempt = repository.live_attempt(run)
            if attempt is None:
                attempt = _new_attempt(session, run, settings)
            if attempt.state == AttemptState.SUBMITTING and attempt.slurm_job_id is None:
                todo.append(_request(run, attempt))
    if not todo:
        return
    # A service that died between recording SUBMITTING and storing the job id may already
    # have submitted: find such jobs by their unique name instead of submitting twice.
    orphans = commands.jobs_by_name(f"{settings.slurm_job_prefix}-")
    for req in todo:
        try:
            job_id = orphans.get(req.job_name) or submit_attempt(req, settings)
        except SlurmError as exc:
            _submission_failed(req, str(exc))
            continue
        with session_scope() as session:
            attempt = repository.get_attempt(session, req.attempt_id, for_update=True)
            owner = repository.get_run(session, req.run_id)
            if attempt is None or owner is None or attempt.state != AttemptState.SUBMITTING:
                continue
            attempt.slurm_job_id, attempt.submitted_at = job_id, utcnow()
            set_attempt_state(
                session, owner, attempt, AttemptState.PENDING, f"Slurm job {job_id} queued"
            )
        log.info("submitted %s as Slurm job %s", req.job_name, job_id)


def _new_attempt(session: Session, run: Run, settings: Settings) -> Attempt:
    number = len(run.attempts) + 1
    newest = repository.newest_committed_checkpoint(session, run.id)
    attempt = Attempt(
        run_id=run.id,
        number=number,
        state=AttemptState.SUBMITTING,
        job_name="",
        job_folder="",
        nodes=[],
        resume_step=newest.step if newest else None,
    )
    session.add(attempt)
    session.flush()
    attempt.job_name = job_name(settings.slurm_job_prefix, run.id, attempt.id)
    attempt.job_folder = str(settings.jobs_dir / f"run-{run.id:06d}" / f"attempt-{number:03d}")
    resume = f"resuming from step {newest.step}" if newest else "starting from scratch"
    record_event(
        session,
        run,
        "attempt.submitting",
        f"attempt {number}: submitting, {resume}",
        attempt,
        {"resume_step": attempt.resume_step},
    )
    session.flush()
    return attempt


def _submission_failed(req: AttemptRequest, reason: str) -> None:
    with session_scope() as session:
        attempt = repository.get_attempt(session, req.attempt_id, for_update=True)
        run = repository.get_run(session, req.run_id, for_update=True)
        if attempt is None or run is None or attempt.state.is_terminal:
            return
        set_attempt_state(session, run, attempt, AttemptState.FAILED, reason)
        set_run_state(session, run, RunState.FAILED, f"submission failed: {reason}", attempt)


def stop_cancelling() -> None:
    """scancel the jobs of CANCELLING runs; once they left the queue, the run is CANCELLED."""
    with session_scope() as session:
        targets = [
            (run.id, a.id, a.slurm_job_id)
            for run in repository.runs_in_states(session, [RunState.CANCELLING])
            for a in run.attempts
            if not a.state.is_terminal
        ]
        cancelling_runs = [r.id for r in repository.runs_in_states(session, [RunState.CANCELLING])]
    job_ids = [job for _, _, job in targets if job]
    for job in job_ids:
        commands.scancel(job)
    still_live = commands.squeue(job_ids)
    for run_id in cancelling_runs:
        mine = [t for t in targets if t[0] == run_id]
        if any(job in still_live and still_live[job].is_live for _, _, job in mine if job):
            continue
        with session_scope() as session:
            run = repository.get_run(session, run_id, for_update=True)
            if run is None or run.state != RunState.CANCELLING:
                continue
            for attempt in run.attempts:
                if not attempt.state.is_terminal:
                    set_attempt_state(
                        session, run, attempt, AttemptState.CANCELLED, "cancelled by the user"
                    )
            set_run_state(session, run, RunState.CANCELLED, "cancelled by the user")


@dataclass(frozen=True)
class _Observed:
    attempt_id: int
    status: JobStatus | None  # None: slurmctld forgot the job
    nodes: list[str]


def poll_attempts() -> None:
    """Read every queued or running attempt's job in one squeue call and act on changes."""
    with session_scope() as session:
        watched = [
            (a.id, a.slurm_job_id)
            for run in repository.runs_in_states(session, [RunState.PENDING, RunState.RUNNING])
            for a in run.attempts
            if a.state in (AttemptState.PENDING, AttemptState.RUNNING) and a.slurm_job_id
        ]
    if not watched:
        return
    live = commands.squeue([job for _, job in watched if job])
    observed = []
    for attempt_id, job in watched:
        assert job is not None
        status = live.get(job) or commands.show_job(job)
        nodes = commands.expand_hostlist(status.node_list) if status and status.node_list else []
        observed.append(_Observed(attempt_id, status, nodes))
    for obs in observed:
        with session_scope() as session:
            _apply(session, obs)


def _apply(session: Session, obs: _Observed) -> None:
    attempt = repository.get_attempt(session, obs.attempt_id, for_update=True)
    if attempt is None or attempt.state.is_terminal:
        return
    run = repository.get_run(session, attempt.run_id, for_update=True)
    assert run is not None
    if run.state not in (RunState.PENDING, RunState.RUNNING):
        return  # cancel owns it now
    status = obs.status
    if status is not None and obs.nodes:
        attempt.node_list, attempt.nodes = status.node_list, obs.nodes
    if status is not None and status.is_live:
        if status.state == "RUNNING" and attempt.state == AttemptState.PENDING:
            set_attempt_state(session, run, attempt, AttemptState.RUNNING, f"on {status.node_list}")
        if status.state == "RUNNING" and run.state == RunState.PENDING:
            set_run_state(
                session, run, RunState.RUNNING, f"attempt {attempt.number} running", attempt
            )
        return
    _attempt_ended(session, run, attempt, status)


def _attempt_ended(session: Session, run: Run, attempt: Attempt, status: JobStatus | None) -> None:
    """The job left Slurm: succeed only if the worker said it finished; else maybe restart."""
    slurm_state = status.state if status else "UNKNOWN (slurmctld forgot the job)"
    exit_code = status.exit_code if status else None
    final = repository.get_checkpoint(session, run.id, run.total_steps)
    finished = (
        run.final_step == run.total_steps
        and final is not None
        and final.state in (CheckpointState.COMMITTED, CheckpointState.DELETED)
    )
    if finished:
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
    set_attempt_state(session, run, attempt, AttemptState.FAILED, reason, exit_code)
    if exit_code == ExitCode.DO_NOT_RETRY:
        set_run_state(
            session,
            run,
            RunState.FAILED,
            f"{reason}: the worker refused to retry (bad spec or code bug)",
            attempt,
        )
    elif run.num_restarts < run.max_restarts:
        run.num_restarts += 1
        set_run_state(
            session,
            run,
            RunState.PENDING,
            f"{reason}; restart {run.num_restarts} of {run.max_restarts}",
            attempt,
        )
    else:
        set_run_state(
            session,
            run,
            RunState.FAILED,
            f"{reason}; no restarts left ({run.max_restarts} allowed)",
            attempt,
        )
