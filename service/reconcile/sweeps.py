"""Submit each sweep's first attempts as one Slurm job array, and hold what Slurm gave them.

The same two-transaction rule as submission.py: the attempts (and their order in the array)
are recorded before sbatch, so a service that dies mid-submit finds the array by its unique
name and maps its tasks back instead of submitting twice.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import select

from contract import StopReason
from service.config import Settings
from service.db import session_scope
from service.identity.owner_folders import checkpoint_folder, owner_roots
from service.identity.service import owner_of
from service.models import AttemptState, Run, RunState, Sweep
from service.models.base import utcnow
from service.reconcile.submission import (
    NICE_BY_PRIORITY,
    check_submitted,
    mint_worker_token,
    new_attempt,
    owners_own,
)
from service.recovery import incident_timeline
from service.recovery.restart import set_stop_reason
from service.runs import repository
from service.runs.run_state_machine import set_attempt_state, set_run_state
from service.runs.schemas import RunSpec
from service.slurm.client import SlurmClient, SlurmError, SlurmUnreachable
from service.slurm.reservations import ensure_reservation
from service.slurm.snapshot import ClusterSnapshot
from service.slurm.submit import ArrayRequest

log = logging.getLogger(__name__)


def submit_sweeps(settings: Settings, slurm: SlurmClient) -> None:
    """One sbatch --array per sweep not yet queued; task i is its i-th still-pending run.
    The sweeps whose runs are on `slurm`'s cluster (a sweep's runs share one cluster)."""
    for req in _prepare(settings, slurm.cluster_name):
        try:
            array_id = slurm.array_job_by_name(req.job_name)
            if array_id is not None and not owners_own(
                slurm, {req.job_name: req.task_job_ids(array_id)[req.attempt_ids[0]]},
                {req.job_name: req.owner.unix_user},
            ):  # fmt: skip
                array_id = None  # someone else's job under the sweep's name: not adopted
        except SlurmError as exc:
            log.warning("sweep %d: cannot tell whether its array is queued: %s", req.sweep_id, exc)
            continue  # next pass; submitting now could queue it twice
        if array_id is None:
            # Tokens are minted only for a fresh submission: minting revokes the earlier
            # ones, which the tasks of an adopted array are already using.
            tokens = [
                mint_worker_token(*pair) for pair in zip(req.run_ids, req.attempt_ids, strict=True)
            ]
            try:
                array_id = slurm.submit_array(req, tokens)
                first_task = req.task_job_ids(array_id)[req.attempt_ids[0]]
                check_submitted(slurm, first_task, req.owner.unix_user, req.job_name)
            except SlurmUnreachable as exc:  # not a refusal: found by name or sent again
                log.warning("sweep %d: Slurm did not answer, next pass: %s", req.sweep_id, exc)
                continue
            except SlurmError as exc:
                _array_failed(req, str(exc))
                continue
        else:  # the crash may have come between sbatch and submitit's last step
            slurm.finish_submission(req.owner, req.job_folder, req.task_job_ids(array_id))
        _record_array(req, array_id, slurm)
        log.info("submitted sweep %d as Slurm job array %s", req.sweep_id, array_id)


def _prepare(settings: Settings, cluster: str) -> list[ArrayRequest]:
    """Create the first attempts (SUBMITTING) of every unsubmitted sweep on `cluster`, in
    array order."""
    todo = []
    with session_scope() as session:
        on_cluster = select(Run.sweep_id).where(Run.cluster == cluster)
        sweeps = session.scalars(
            select(Sweep)
            .where(Sweep.submitted_at.is_(None), Sweep.id.in_(on_cluster))
            .order_by(Sweep.id)
            .with_for_update()
        ).all()
        for sweep in sweeps:
            # Locked: a member cancelled meanwhile is not given an attempt (submission.py).
            runs = repository.sweep_runs(session, sweep.id, for_update=True)
            run_of = {a.id: r.id for r in runs for a in r.attempts}
            if not sweep.array_attempt_ids:
                waiting = [r for r in runs if r.state == RunState.PENDING and not r.attempts]
                if not waiting:  # every member was cancelled before it was queued
                    sweep.submitted_at = utcnow()
                    continue
                attempts = []
                for run in waiting:
                    attempt = new_attempt(session, run, settings)
                    attempt.job_name, attempt.job_folder = sweep.job_name, sweep.job_folder
                    attempts.append(attempt)
                    run_of[attempt.id] = run.id
                sweep.array_attempt_ids = [a.id for a in attempts]
            spec = RunSpec.model_validate(runs[0].spec)
            todo.append(
                ArrayRequest(
                    sweep_id=sweep.id,
                    attempt_ids=tuple(sweep.array_attempt_ids),
                    run_ids=tuple(run_of[a] for a in sweep.array_attempt_ids),
                    job_name=sweep.job_name,
                    job_folder=Path(sweep.job_folder),
                    num_nodes=spec.nodes,
                    ranks_per_node=spec.gpus_per_node,
                    time_limit_min=spec.time_limit_min,
                    max_parallel=sweep.max_parallel,
                    nice=NICE_BY_PRIORITY.get(spec.priority, 0),
                    owner=owner_of(sweep, settings),
                    checkpoint_folders=tuple(
                        checkpoint_folder(settings, r)
                        for r in runs
                        if r.id in {run_of[a] for a in sweep.array_attempt_ids}
                    ),
                    owner_roots=owner_roots(settings, sweep),
                )
            )
    return todo


def _record_array(req: ArrayRequest, array_id: str, slurm: SlurmClient) -> None:
    """Every task's job id goes on its attempt. A member cancelled while sbatch ran is
    CANCELLING with its attempt still live (stop_cancelling waits for this), so the
    cancellation pass that follows scancels its task from what is stored here."""
    orphaned = []
    with session_scope() as session:
        sweep = session.get(Sweep, req.sweep_id, with_for_update=True)
        assert sweep is not None
        sweep.slurm_array_job_id, sweep.submitted_at = array_id, utcnow()
        for task, (attempt_id, job_id) in enumerate(req.task_job_ids(array_id).items()):
            locked = repository.lock_run_and_attempt(session, attempt_id)
            if locked is None or locked[1].state != AttemptState.SUBMITTING:
                orphaned.append(job_id)  # not reachable through stop_cancelling's wait
                continue
            run, attempt = locked
            attempt.slurm_job_id, attempt.submitted_at = job_id, utcnow()
            set_attempt_state(
                session,
                run,
                attempt,
                AttemptState.PENDING,
                f"Slurm job {job_id} queued: task {task} of sweep {req.sweep_id}'s job array "
                f"(at most {req.max_parallel} at once)",
            )
            if run.state == RunState.PENDING:
                incident_timeline.attempt_submitted(session, run.id)
    if orphaned:
        slurm.cancel(dict.fromkeys(orphaned, req.owner.unix_user))


def _array_failed(req: ArrayRequest, reason: str) -> None:
    """sbatch refused the array: every member fails with Slurm's reason (nothing is queued)."""
    with session_scope() as session:
        sweep = session.get(Sweep, req.sweep_id, with_for_update=True)
        assert sweep is not None
        sweep.submitted_at = utcnow()
        for attempt_id in req.attempt_ids:
            locked = repository.lock_run_and_attempt(session, attempt_id)
            if locked is None or locked[1].state.is_terminal:
                continue
            run, attempt = locked
            if run.state == RunState.CANCELLING:  # the user's cancel wins over the failure
                set_stop_reason(attempt, StopReason.CANCELLED)
                set_attempt_state(session, run, attempt, AttemptState.CANCELLED, reason)
                set_run_state(session, run, RunState.CANCELLED, "cancelled by the user")
                continue
            set_stop_reason(attempt, StopReason.SUBMISSION_FAILED)
            set_attempt_state(session, run, attempt, AttemptState.FAILED, reason)
            if not run.state.is_terminal:
                set_run_state(session, run, RunState.FAILED, f"submission failed: {reason}")


def hold_array_nodes(snapshot: ClusterSnapshot, slurm: SlurmClient) -> None:
    """A running array task's nodes go into its run's own reservation at once, so a failed
    task's healthy nodes are not taken by other pending jobs before the retry is queued.
    The snapshot's cluster's runs."""
    with session_scope() as session:
        want = [
            (r.reservation, list(r.nodes), r.unix_user)
            for r in session.scalars(
                select(Run).where(
                    Run.sweep_id.is_not(None),
                    Run.state == RunState.RUNNING,
                    Run.reservation.is_not(None),
                    Run.cluster == snapshot.cluster,
                )
            )
        ]
    for name, nodes, unix_user in want:
        assert name is not None
        if nodes and name not in snapshot.reservations:
            ensure_reservation(slurm, name, nodes, snapshot.reservations, [unix_user])
