"""Hangs: a step counter that stopped moving looks exactly like a stalled collective."""

from __future__ import annotations

import shutil
import statistics
import sys
from collections.abc import Collection
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select, true

from contract import MAX_REPORT_BACKOFF_S, REPORT_REQUEST_TIMEOUT_S
from service.config import Settings
from service.db import session_scope
from service.models import Attempt, AttemptState, Metric, RecoveryAction, Run, RunState
from service.models.base import utcnow
from service.recovery.signals import open_incident
from service.slurm.client import SlurmClient, SlurmError
from service.slurm.owner import RunOwner

STACKS_TIMEOUT_S = 20


def hang_threshold_s(step_times: list[float], settings: Settings) -> float:
    """How long without a step before a run counts as hung."""
    typical = statistics.median(step_times) if step_times else 0.0
    return max(settings.hang_factor * typical, settings.hang_min_s)


def check_hangs(
    settings: Settings, watching_since: datetime, clusters: Collection[str] | None = None
) -> None:
    """Open a RESTART incident for each running attempt whose progress stopped, of the runs
    on `clusters` (None: every cluster): a run's incident is carried out on its cluster,
    and one whose controller does not answer waits for it (service/reconcile/loop.py).

    `watching_since` is when this service last began to see everything (its start, or its
    return after losing Postgres): a service that was down, or whose database was, has not
    seen progress that happened meanwhile, and a worker whose reports failed meanwhile may
    deliver only after its longest retry wait and one request's timeout. So silence counts
    from no earlier than `watching_since` plus those.
    """
    now = utcnow()
    with session_scope() as session:
        rows = session.execute(
            select(Run, Attempt)
            .join(Attempt, Attempt.run_id == Run.id)
            .where(
                Run.state == RunState.RUNNING,
                Attempt.state == AttemptState.RUNNING,
                Attempt.first_step_at.is_not(None),
                Run.cluster.in_(clusters) if clusters is not None else true(),
            )
        ).all()
        # The earliest moment silence can count from: the workers' longest retry wait after
        # this service began to see again.
        seen_from = watching_since + timedelta(
            seconds=MAX_REPORT_BACKOFF_S + REPORT_REQUEST_TIMEOUT_S
        )
        for run, attempt in rows:
            progressed = max(run.last_progress_at or attempt.first_step_at or now, watching_since)
            last = max(progressed, seen_from)
            recent = session.scalars(
                select(Metric.step_time_s)
                .where(Metric.attempt_id == attempt.id)
                .order_by(Metric.id.desc())
                .limit(50)
            ).all()
            threshold = hang_threshold_s([t for t in recent if t], settings)
            if now - last > timedelta(seconds=threshold):
                open_incident(
                    session,
                    kind="hang",
                    signal="hang:no_progress",
                    action=RecoveryAction.RESTART,
                    cluster=run.cluster,
                    run_id=run.id,
                    attempt_id=attempt.id,
                    signal_at=progressed,  # the last step seen, not the allowance
                    message=f"run {run.id}: no step for {(now - progressed).total_seconds():.0f} s "
                    f"(threshold {threshold:.0f} s) at step {run.last_step}",
                )


def collect_stacks(
    slurm: SlurmClient, owner: RunOwner, job_id: str, attempt_id: int, num_nodes: int
) -> str | None:
    """py-spy dump of every rank, run on the job's own nodes through an overlapping step, as
    the job's owner (Slurm starts steps in a job for its owner only; py-spy then needs the
    owner's right to trace their own processes: kernel.yama.ptrace_scope 0)."""
    beside = Path(sys.executable).parent / "py-spy"  # installed with runyard[worker]
    py_spy = str(beside) if beside.exists() else (shutil.which("py-spy") or "py-spy")
    script = (
        f'for p in $(pgrep -f "worker.entry .*--attempt-id {attempt_id}$"); do '
        f'echo "== $(hostname) pid $p"; {py_spy} dump --nonblocking --pid "$p" 2>&1; done'
    )
    try:
        out = slurm.run_in_job(owner, job_id, num_nodes, script, STACKS_TIMEOUT_S)
    except SlurmError as exc:
        return f"stack collection failed: {exc}"
    return out.strip() or None
