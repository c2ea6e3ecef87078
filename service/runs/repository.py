"""All SQL about runs lives here."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from service.models import (
    Attempt,
    AttemptState,
    Checkpoint,
    CheckpointState,
    Metric,
    Run,
    RunEvent,
    RunState,
    Sweep,
)

LIVE_ATTEMPT_STATES = (AttemptState.SUBMITTING, AttemptState.PENDING, AttemptState.RUNNING)


def get_run(session: Session, run_id: int, *, for_update: bool = False) -> Run | None:
    stmt = select(Run).where(Run.id == run_id).options(selectinload(Run.attempts))
    if for_update:
        # populate_existing: a run this session loaded before waiting for the lock gets the
        # state the lock holder committed, not the stale copy it read earlier.
        stmt = stmt.with_for_update(of=Run).execution_options(populate_existing=True)
    return session.scalars(stmt).one_or_none()


def list_runs(
    session: Session,
    state: RunState | None,
    limit: int,
    offset: int,
    team: str | None = None,
    cluster: str | None = None,
) -> tuple[Sequence[Run], int]:
    """Newest first; only `team`'s runs unless team is None (an admin's view), and only
    `cluster`'s when given."""
    stmt = select(Run).options(selectinload(Run.attempts)).order_by(Run.id.desc())
    count = select(func.count()).select_from(Run)
    if state is not None:
        stmt, count = stmt.where(Run.state == state), count.where(Run.state == state)
    if team is not None:
        stmt, count = stmt.where(Run.team == team), count.where(Run.team == team)
    if cluster is not None:
        stmt, count = stmt.where(Run.cluster == cluster), count.where(Run.cluster == cluster)
    return session.scalars(stmt.limit(limit).offset(offset)).all(), session.scalar(count) or 0


PRIORITY_RANK = {"prod": 3, "research": 2, "scavenger": 1}


def runs_in_states(
    session: Session, states: Sequence[RunState], clusters: Collection[str] | None = None
) -> Sequence[Run]:
    """The runs in `states`, with their attempts; only those on `clusters` when given."""
    stmt = (
        select(Run)
        .where(Run.state.in_(states))
        .options(selectinload(Run.attempts))
        .order_by(Run.id)
    )
    if clusters is not None:
        stmt = stmt.where(Run.cluster.in_(clusters))
    return session.scalars(stmt).all()


def sweep_runs(session: Session, sweep_id: int, *, for_update: bool = False) -> Sequence[Run]:
    stmt = (
        select(Run)
        .where(Run.sweep_id == sweep_id)
        .options(selectinload(Run.attempts))
        .order_by(Run.sweep_index)
    )
    if for_update:  # in sweep_index order, as cancel_sweep takes them
        stmt = stmt.with_for_update(of=Run)
    return session.scalars(stmt).all()


def awaits_sweep_array(run: Run) -> bool:
    """A sweep member's first attempt is a task of the sweep's job array, not placed by us."""
    return run.sweep_id is not None and not run.attempts


def needs_placement(run: Run) -> bool:
    """A PENDING run that lacks nodes for its next attempt (and has none queued)."""
    return (
        live_attempt(run) is None and len(run.nodes) < run.num_nodes and not awaits_sweep_array(run)
    )


def get_attempt(session: Session, attempt_id: int, *, for_update: bool = False) -> Attempt | None:
    stmt = select(Attempt).where(Attempt.id == attempt_id)
    if for_update:
        stmt = stmt.with_for_update().execution_options(populate_existing=True)
    return session.scalars(stmt).one_or_none()


def next_attempt_number(run: Run) -> int:
    """The number the run's next attempt takes, whichever path makes it (a submission, a
    replica group's replacement): one past the highest so far. Attempts are never deleted,
    so it is also one past their count."""
    return max((a.number for a in run.attempts), default=0) + 1


def live_attempt(run: Run) -> Attempt | None:
    live = [a for a in run.attempts if a.state in LIVE_ATTEMPT_STATES]
    return live[-1] if live else None


def replaces_a_group(session: Session, attempt: Attempt) -> bool:
    """Whether an earlier attempt of the run trained the same replica group."""
    earlier = select(Attempt.id).where(
        Attempt.run_id == attempt.run_id,
        Attempt.replica_group == attempt.replica_group,
        Attempt.number < attempt.number,
    )
    return session.scalars(earlier.limit(1)).first() is not None


def checkpoints(session: Session, run_id: int) -> Sequence[Checkpoint]:
    stmt = select(Checkpoint).where(Checkpoint.run_id == run_id).order_by(Checkpoint.step)
    return session.scalars(stmt).all()


def get_checkpoint(session: Session, run_id: int, step: int) -> Checkpoint | None:
    stmt = select(Checkpoint).where(Checkpoint.run_id == run_id, Checkpoint.step == step)
    return session.scalars(stmt).one_or_none()


def newest_committed_checkpoint(session: Session, run_id: int) -> Checkpoint | None:
    stmt = (
        select(Checkpoint)
        .where(Checkpoint.run_id == run_id, Checkpoint.state == CheckpointState.COMMITTED)
        .order_by(Checkpoint.step.desc())
        .limit(1)
    )
    return session.scalars(stmt).one_or_none()


def events(session: Session, run_id: int, after_id: int, limit: int) -> Sequence[RunEvent]:
    stmt = (
        select(RunEvent)
        .where(RunEvent.run_id == run_id, RunEvent.id > after_id)
        .order_by(RunEvent.id)
        .limit(limit)
    )
    return session.scalars(stmt).all()


def worker_error_reports(
    session: Session, attempt_id: int, kinds: Sequence[str]
) -> list[dict[str, Any]]:
    """The error reports of those kinds (`worker:anomaly`, ...) that `attempt_id`'s ranks
    sent (POST .../errors, kept as `worker.error` events), oldest first."""
    reports = session.scalars(
        select(RunEvent.data)
        .where(RunEvent.attempt_id == attempt_id, RunEvent.kind == "worker.error")
        .order_by(RunEvent.id)
    ).all()
    return [r for r in reports if r and r.get("kind") in kinds]


def metrics(session: Session, run_id: int, after_step: int, limit: int) -> Sequence[Metric]:
    stmt = (
        select(Metric)
        .where(Metric.run_id == run_id, Metric.step > after_step)
        .order_by(Metric.step, Metric.id)
        .limit(limit)
    )
    return session.scalars(stmt).all()


def gpus_in_use(session: Session, team: str) -> int:
    """GPUs held or wanted by the team's runs that have not ended. A sweep counts only the
    members its array lets run at once (max_parallel), as its admission did."""
    active = (RunState.PENDING, RunState.RUNNING, RunState.CANCELLING)
    gpus = Run.num_nodes * Run.gpus_per_node
    mine = (Run.team == team, Run.state.in_(active))
    alone = session.scalar(
        select(func.coalesce(func.sum(gpus), 0)).where(*mine, Run.sweep_id.is_(None))
    )
    per_sweep = (
        select(Sweep.max_parallel, func.count().label("n"), func.max(gpus).label("each"))
        .join(Run, Run.sweep_id == Sweep.id)
        .where(*mine)
        .group_by(Sweep.id)
        .subquery()
    )
    in_sweeps = session.scalar(
        select(
            func.coalesce(
                func.sum(func.least(per_sweep.c.n, per_sweep.c.max_parallel) * per_sweep.c.each),
                0,
            )
        )
    )
    return int(alone or 0) + int(in_sweeps or 0)


def lock_run_and_attempt(session: Session, attempt_id: int) -> tuple[Run, Attempt] | None:
    """Lock a run, then its attempt: the one lock order every writer follows, so the
    reconciler and the workers' reports never deadlock on each other."""
    run_id = session.scalar(select(Attempt.run_id).where(Attempt.id == attempt_id))
    if run_id is None:
        return None
    run = get_run(session, run_id, for_update=True)
    attempt = get_attempt(session, attempt_id, for_update=True)
    if run is None or attempt is None:
        return None
    return run, attempt
