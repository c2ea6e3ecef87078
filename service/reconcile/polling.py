"""Polling: follow every queued or running attempt's Slurm job, once per tick, in a
bounded number of Slurm calls whatever the number of jobs.

A job that starts moves its attempt (and run) to RUNNING; a sweep's array task hands its
run the nodes Slurm chose; a job that left the queue goes to the verdict (verdict.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import session_scope
from service.models import Attempt, AttemptState, Run, RunState
from service.reconcile.placement import adopt_array_nodes
from service.reconcile.verdict import judge_ended_attempt
from service.recovery import incident_timeline
from service.runs import repository
from service.runs.run_state_machine import set_attempt_state, set_run_state
from service.slurm.client import JobStatus, SlurmClient
from service.slurm.hostlist import expand_hostlist


@dataclass(frozen=True)
class Watched:
    """A queued or running attempt's job, and what the database last recorded of it."""

    attempt_id: int
    job_id: str
    attempt_state: AttemptState
    node_list: str | None
    run_state: RunState
    awaits_array_nodes: bool  # a sweep's run whose nodes Slurm has yet to give it

    def unchanged(self, status: JobStatus) -> bool:
        """Nothing apply_observation would write: the same live state and nodes."""
        if not status.is_live:
            return False
        # A sweep's array task still queued has no nodes to adopt: nothing to write.
        if status.node_list and (self.awaits_array_nodes or status.node_list != self.node_list):
            return False
        if status.state == "RUNNING":
            return self.attempt_state == AttemptState.RUNNING and self.run_state == RunState.RUNNING
        return self.attempt_state == AttemptState.PENDING


@dataclass(frozen=True)
class Observed:
    """What Slurm says of one watched attempt's job this tick."""

    attempt_id: int
    status: JobStatus | None  # None: slurmctld forgot the job
    nodes: list[str]


def poll_attempts(settings: Settings, slurm: SlurmClient) -> None:
    """Read every queued or running attempt's job on `slurm`'s cluster (job ids are per
    cluster) and act on changes: one squeue for all of them, one `scontrol show job` for
    those that left the queue."""
    with session_scope() as session:
        # The attempts themselves, in SQL: loading every queued run to find them did not
        # scale to 10,000 queued runs. What we last recorded comes along, so a job that
        # did not change costs no transaction of its own.
        watched = [
            Watched(attempt_id, job, state, node_list, run_state, bool(awaits))
            for attempt_id, job, state, node_list, run_state, awaits in session.execute(
                select(
                    Attempt.id,
                    Attempt.slurm_job_id,
                    Attempt.state,
                    Attempt.node_list,
                    Run.state,
                    Run.sweep_id.is_not(None) & (func.cardinality(Run.nodes) == 0),
                )
                .join(Run, Run.id == Attempt.run_id)
                .where(
                    Run.state.in_([RunState.PENDING, RunState.RUNNING]),
                    Attempt.state.in_([AttemptState.PENDING, AttemptState.RUNNING]),
                    Attempt.slurm_job_id.is_not(None),
                    Attempt.cluster == slurm.cluster_name,
                )
                .order_by(Run.id, Attempt.number)
            ).all()
            if job
        ]
    if not watched:
        return
    job_ids = [w.job_id for w in watched]
    live = slurm.queue(job_ids)
    gone = [job for job in job_ids if job not in live]
    ended = slurm.job_details(gone) if gone else {}
    observed = []
    for w in watched:
        status = live.get(w.job_id) or ended.get(w.job_id)
        if status is not None and w.unchanged(status):
            continue
        nodes = expand_hostlist(status.node_list) if status and status.node_list else []
        observed.append(Observed(w.attempt_id, status, nodes))
    for obs in observed:
        with session_scope() as session:
            apply_observation(session, obs, settings.slurm_job_prefix)


def apply_observation(session: Session, obs: Observed, prefix: str) -> None:
    """Follow the job: its nodes once allocated, RUNNING once Slurm runs it, and the
    end-of-job verdict once it left the queue."""
    locked = repository.lock_run_and_attempt(session, obs.attempt_id)
    if locked is None or locked[1].state.is_terminal:
        return
    run, attempt = locked
    assert run is not None
    if run.state not in (RunState.PENDING, RunState.RUNNING):
        return  # cancel owns it now
    status = obs.status
    if status is not None and obs.nodes:
        attempt.node_list, attempt.nodes = status.node_list, obs.nodes
        if run.sweep_id is not None and not run.nodes:
            adopt_array_nodes(session, run, obs.nodes, prefix)
    if status is not None and status.is_live:
        if status.state == "RUNNING" and attempt.state == AttemptState.PENDING:
            set_attempt_state(session, run, attempt, AttemptState.RUNNING, f"on {status.node_list}")
            incident_timeline.attempt_running(session, run.id)
        if status.state == "RUNNING" and run.state == RunState.PENDING:
            set_run_state(
                session, run, RunState.RUNNING, f"attempt {attempt.number} running", attempt
            )
        return
    judge_ended_attempt(session, run, attempt, status)
