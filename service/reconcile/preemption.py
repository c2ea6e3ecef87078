"""Stopping attempts on purpose: preemption by a higher-priority run, and time-limited
segments. Both ask the ranks to stop through their progress replies (finish the step,
checkpoint, exit 0), never through a Slurm signal: submitit's own handler for USR2 would
requeue or fail the job under us."""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta

from sqlalchemy import select, true
from sqlalchemy.orm import Session, selectinload

from contract import StopReason
from service.config import Settings
from service.db import session_scope
from service.models import Attempt, AttemptState, Run, RunState
from service.models.base import utcnow
from service.recovery import slow_nodes
from service.runs import repository
from service.runs.run_state_machine import record_event, set_attempt_state, set_run_state
from service.runs.schemas import RunSpec
from service.runs.stop_requests import request_stop, stop_text
from service.slurm.client import SlurmClient
from service.slurm.reservations import ensure_reservation
from service.slurm.snapshot import ClusterSnapshot


def _rank(run: Run) -> int:
    return repository.PRIORITY_RANK.get(run.priority, 0)


def preempt_for_waiting_runs(snapshot: ClusterSnapshot) -> None:
    """A waiting run may take nodes from running runs of lower priority, lowest first, on
    its own cluster (the snapshot's): a run never takes another cluster's nodes."""
    with session_scope() as session:
        request_preemptions(session, len(snapshot.free_nodes()), snapshot.cluster)


def request_preemptions(session: Session, num_free_nodes: int, cluster: str | None = None) -> None:
    """Ask lower-priority running runs to yield to each waiting run that the free nodes
    cannot place; a run whose victims are still checkpointing is not given more. Runs of
    `cluster` only, when given."""
    on = [cluster] if cluster is not None else None
    running = [r for r in repository.runs_in_states(session, [RunState.RUNNING], on)]
    # Only a run that outranks some running run can preempt; loading the others (10,000
    # queued runs of one class) cost most of a tick and could never find a victim.
    lowest = min((_rank(r) for r in running), default=None)
    outranking = [
        p for p, rank in repository.PRIORITY_RANK.items() if lowest is not None and rank > lowest
    ]
    if not outranking:
        return
    waiting = [
        r
        for r in session.scalars(
            select(Run)
            .where(Run.state == RunState.PENDING, Run.priority.in_(outranking))
            .where(Run.cluster == cluster if cluster is not None else true())
            .options(selectinload(Run.attempts))
            .order_by(Run.id)
        ).all()
        if repository.needs_placement(r)
    ]
    making_room_for = {
        a.stopped_for_run_id
        for r in running
        for a in r.attempts
        if a.stop_requested_at and a.stop_reason == StopReason.PREEMPTED
        if not a.state.is_terminal
    }
    for run in sorted(waiting, key=lambda r: (-_rank(r), r.id)):
        need = run.num_nodes - len(run.nodes) - num_free_nodes
        if need <= 0 or run.id in making_room_for:
            continue
        victims, freed = [], 0
        for other in sorted(running, key=lambda r: (_rank(r), -r.id)):
            attempt = repository.live_attempt(other)
            if (
                _rank(other) >= _rank(run)
                or attempt is None
                or attempt.stop_requested_at
                or attempt.state != AttemptState.RUNNING
            ):
                continue
            victims.append((other, attempt))
            freed += len(other.nodes)
            if freed >= need:
                break
        if freed < need:
            continue
        for other, attempt in victims:
            request_stop(session, other, attempt, StopReason.PREEMPTED, for_run=run)
        record_event(
            session,
            run,
            "run.preempting",
            f"preempting run(s) {', '.join(str(o.id) for o, _ in victims)} "
            f"({victims[0][0].priority}) for {need} node(s)",
        )


def stop_segments_at_time_limit(
    settings: Settings, clusters: Collection[str] | None = None
) -> None:
    """A run longer than its Slurm time limit runs as segments: stop each one in time to
    checkpoint, and the next resumes from it. Runs on `clusters` only, when given."""
    now = utcnow()
    with session_scope() as session:
        for run in repository.runs_in_states(session, [RunState.RUNNING], clusters):
            attempt = repository.live_attempt(run)
            if attempt is None or attempt.started_at is None or attempt.stop_requested_at:
                continue
            limit = timedelta(minutes=RunSpec.model_validate(run.spec).time_limit_min)
            margin = timedelta(seconds=settings.segment_stop_margin_s)
            if attempt.started_at + limit - margin <= now:
                request_stop(session, run, attempt, StopReason.TIME_LIMIT)


def enforce_stop_deadlines(settings: Settings, slurm: SlurmClient) -> None:
    """Ranks that ignore a stop request for `stop_grace_s` are cancelled outright: a
    running run's (preemption, a segment's end, a slow node) and a cancelled one's; the
    jobs on `slurm`'s cluster (job ids are per cluster)."""
    deadline = utcnow() - timedelta(seconds=settings.stop_grace_s)
    with session_scope() as session:
        jobs = {
            a.slurm_job_id: r.unix_user
            for r in repository.runs_in_states(session, [RunState.RUNNING, RunState.CANCELLING])
            for a in r.attempts
            if a.cluster == slurm.cluster_name
            and a.stop_requested_at
            and a.stop_requested_at < deadline
            and not a.state.is_terminal
            and a.slurm_job_id
        }
    if jobs:
        slurm.cancel(jobs)


def attempt_stopped(session: Session, run: Run, attempt: Attempt, how: str) -> None:
    """The attempt yielded at a checkpoint: not a failure, nothing counted against restarts."""
    reason = stop_text(attempt)
    newest = repository.newest_committed_checkpoint(session, run.id)
    at = f"; resumes from step {newest.step}" if newest else ""
    set_attempt_state(session, run, attempt, AttemptState.STOPPED, f"{reason} ({how})")
    if attempt.stop_reason == StopReason.PREEMPTED:
        run.nodes = []  # hand the nodes over; it is placed again when nodes are free
        set_run_state(session, run, RunState.PENDING, f"{reason}{at}", attempt)
    elif attempt.stop_reason == StopReason.SLOW_NODE:
        # Incidents drain the slow nodes and swap in spares before the next submission
        # (the reconciler carries out incidents first in every tick).
        moved = slow_nodes.after_yield(session, run, attempt)
        off = f" {', '.join(moved)}" if moved else " (no node flagged any more: same nodes)"
        set_run_state(session, run, RunState.PENDING, f"{reason}{off}{at}", attempt)
    else:
        set_run_state(
            session, run, RunState.PENDING, f"segment ended at its time limit{at}", attempt
        )


def sync_run_reservations(snapshot: ClusterSnapshot, slurm: SlurmClient) -> None:
    """A run's reservation holds exactly its nodes (a preempted run's shrinks to none), on
    the snapshot's cluster, where the run's reservation is."""
    with session_scope() as session:
        held = session.scalars(  # queued runs hold no reservation: not loaded
            select(Run)
            .where(Run.state == RunState.PENDING, Run.reservation.is_not(None))
            .where(Run.cluster == snapshot.cluster)
            .options(selectinload(Run.attempts))
            .order_by(Run.id)
        ).all()
        want = {
            r.reservation: (list(r.nodes), r.unix_user)
            for r in held
            if r.reservation and repository.live_attempt(r) is None
        }
    for name, (nodes, unix_user) in want.items():
        assert name is not None
        if sorted(snapshot.reservations.get(name, [])) != sorted(nodes) and (
            nodes or name in snapshot.reservations
        ):
            ensure_reservation(slurm, name, nodes, snapshot.reservations, [unix_user])
