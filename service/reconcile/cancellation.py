"""Cancellation: stop the Slurm jobs of CANCELLING runs, then mark the runs CANCELLED.

The user's cancel marks the run CANCELLING and asks its training ranks to stop
(runs/service.py): they save a checkpoint through their own framework and exit 0. A job
is scancelled here, outside any transaction, as the run owner's only (SlurmClient.cancel),
once nothing more is to be saved: its attempt is not training, no stop was asked of it
(`cancel --now`), or its ranks left at last (ranks that let `stop_grace_s` pass are
scancelled by preemption.enforce_stop_deadlines, as any stop's). An attempt
recorded SUBMITTING without a job id may have been sbatched by a service that died: its job
is found by its unique name, if it runs as the owner. A sweep task waits for its array's job
id (reconcile/sweeps.py) so it cannot be forgotten.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from contract import StopReason
from service.config import Settings
from service.db import session_scope
from service.models import AttemptState, RunState, Sweep
from service.models.base import utcnow
from service.reconcile.submission import owners_own
from service.recovery.restart import set_stop_reason
from service.runs import repository
from service.runs.run_state_machine import set_attempt_state, set_run_state
from service.slurm.client import SlurmClient, SlurmError

log = logging.getLogger(__name__)


def stop_cancelling(settings: Settings, slurm: SlurmClient) -> None:
    """scancel the jobs of `slurm`'s cluster's CANCELLING runs; once they left the queue,
    the run is CANCELLED. A run's attempts are on its cluster: it never spans clusters."""
    targets: dict[int, list[str]] = {}
    # Jobs whose ranks were asked to save: past their grace, preemption.enforce_stop_deadlines
    # scancels them (earlier in the same tick).
    saving: set[str] = set()
    grace_since = utcnow() - timedelta(seconds=settings.stop_grace_s)
    unnamed: dict[int, list[str]] = {}  # run -> names of jobs maybe queued before a crash
    owners: dict[int, str] = {}  # run -> its owner's Unix user, whom its jobs run as
    with session_scope() as session:
        for r in repository.runs_in_states(session, [RunState.CANCELLING], [slurm.cluster_name]):
            live = [a for a in r.attempts if not a.state.is_terminal]
            targets[r.id] = [a.slurm_job_id for a in live if a.slurm_job_id]
            saving.update(a.slurm_job_id for a in live if a.slurm_job_id and a.stop_requested_at)
            owners[r.id] = r.unix_user
            for a in live:
                if a.slurm_job_id is not None or a.state != AttemptState.SUBMITTING:
                    continue
                sweep = session.get(Sweep, r.sweep_id) if r.sweep_id else None
                if sweep is None or a.id not in sweep.array_attempt_ids:
                    unnamed.setdefault(r.id, []).append(a.job_name)
                elif sweep.submitted_at is None:
                    # Its task's job id comes with the array (sweeps.py); until then the
                    # run stays CANCELLING, so the task cannot be forgotten.
                    del targets[r.id]
                    break
    if unnamed:
        # Names are no secret: another user's job named like the attempt is not the run's,
        # and waiting for it to leave the queue would keep the run CANCELLING.
        owner_of_name = {n: owners[run_id] for run_id, names in unnamed.items() for n in names}
        try:
            queued = slurm.jobs_by_name(f"{settings.slurm_job_prefix}-")
            queued = owners_own(slurm, queued, owner_of_name)
        except SlurmError as exc:
            log.warning("cannot list the queued jobs, cancelling next pass: %s", exc)
            queued = None
        for run_id, names in unnamed.items():
            if queued is None:
                targets.pop(run_id, None)
            elif run_id in targets:
                targets[run_id] += [queued[n] for n in names if n in queued]
    owner_of_job = {job: owners[run_id] for run_id, jobs in targets.items() for job in jobs}
    to_cancel = {job: owner for job, owner in owner_of_job.items() if job not in saving}
    if to_cancel:
        slurm.cancel(to_cancel)
    still_live = slurm.queue(list(owner_of_job)) if owner_of_job else {}
    for run_id, jobs in targets.items():
        if any(job in still_live and still_live[job].is_live for job in jobs):
            continue
        with session_scope() as session:
            run = repository.get_run(session, run_id, for_update=True)
            if run is None or run.state != RunState.CANCELLING:
                continue
            saved = repository.newest_committed_checkpoint(session, run_id)
            for attempt in run.attempts:
                if not attempt.state.is_terminal:
                    # Within its grace it was never scancelled: it saved and left by itself.
                    asked = attempt.stop_requested_at
                    how = "saved and exited" if asked and asked > grace_since else "scancelled"
                    set_stop_reason(attempt, StopReason.CANCELLED)
                    set_attempt_state(
                        session, run, attempt, AttemptState.CANCELLED,
                        f"cancelled by the user ({how})",
                    )  # fmt: skip
            kept = f"; its newest checkpoint is step {saved.step}" if saved else ""
            set_run_state(session, run, RunState.CANCELLED, f"cancelled by the user{kept}")
