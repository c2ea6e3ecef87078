"""What the service does with worker reports: metrics, heartbeats, checkpoint commits."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session

from service.config import Settings, get_settings
from service.errors import Conflict, InvalidSpec, NotFound
from service.identity.owner_folders import checkpoint_folder
from service.models import (
    Attempt,
    AttemptState,
    Checkpoint,
    CheckpointState,
    Metric,
    NodeEvent,
    Run,
    RunState,
)
from service.models.base import utcnow
from service.nodes import repository as nodes_repo
from service.nodes import stragglers
from service.recovery import incident_timeline, sdc, slow_nodes
from service.recovery.checkpoints import mark_corrupt
from service.runs import live_interval, plan_outcomes, repository
from service.runs.run_state_machine import record_event, set_attempt_state, set_run_state
from service.runs.schemas import RunSpec
from service.worker_protocol.schemas import (
    CheckpointReport,
    ErrorReport,
    FinishReport,
    ProgressReport,
)


def live_attempt_and_run(session: Session, attempt_id: int) -> tuple[Attempt, Run]:
    """The attempt a worker speaks for, refusing ones that already ended (a zombie rank)."""
    locked = repository.lock_run_and_attempt(session, attempt_id)
    if locked is None:
        raise NotFound(f"no attempt with id {attempt_id}")
    run, attempt = locked
    assert run is not None  # foreign key
    if attempt.state.is_terminal:
        raise Conflict(f"attempt {attempt_id} already ended ({attempt.state}); stop training")
    return attempt, run


def mark_running(session: Session, run: Run, attempt: Attempt) -> None:
    """A rank that reports is proof the allocation runs, even before squeue says so.

    Not for an attempt still SUBMITTING: its Slurm job id is not recorded yet (a fast job,
    or a service that died after sbatch). The reconciler records it, or adopts the job by
    name after a crash, only while the attempt is SUBMITTING and its run PENDING; moved on
    now, the job would never be polled or cancelled. The report's steps still count."""
    if attempt.state == AttemptState.SUBMITTING:
        return
    if attempt.state == AttemptState.PENDING:
        set_attempt_state(session, run, attempt, AttemptState.RUNNING)
        incident_timeline.attempt_running(session, run.id)
    if run.state == RunState.PENDING:
        set_run_state(session, run, RunState.RUNNING, f"attempt {attempt.number} running", attempt)


def record_progress(
    session: Session, attempt_id: int, report: ProgressReport, settings: Settings | None = None
) -> tuple[Run, Attempt]:
    """Store the reported steps and keep the run's and the attempt's summaries current in
    the same transaction, so readers (goodput, `run watch`) never scan the metric rows."""
    attempt, run = live_attempt_and_run(session, attempt_id)
    mark_running(session, run, attempt)
    now = utcnow()
    attempt.last_heartbeat_at = now
    # A report whose answer was lost is sent again (worker/reporter.py), perhaps with newer
    # rows after the old ones: an attempt's steps only go up, so the rows at or below its
    # highest recorded step are already stored, and are not stored twice.
    seen = attempt.last_step
    fresh = [m for m in report.metrics if seen is None or m.step > seen]
    for m in fresh:
        session.add(
            Metric(
                run_id=run.id,
                attempt_id=attempt.id,
                step=m.step,
                loss=m.loss,
                tokens_per_s=m.tokens_per_s,
                step_time_s=m.step_time_s,
                lr=m.lr,
                recorded_at=now,
            )
        )
    for held_out in report.validation:
        record_event(
            session,
            run,
            "run.validation",
            f"held-out loss {held_out.loss:.4f} after step {held_out.step}",
            attempt,
            data={"step": held_out.step, "loss": held_out.loss},
        )
    sdc.note_clean_step(run, report.sdc_clean_step)
    if report.node_update_s is not None:
        # Slow nodes: the straggler rule on this report's per-node update times.
        settings = settings or get_settings()
        stragglers.record_update_times(
            session,
            run.id,
            attempt.cluster,
            {n: t for n, t in report.node_update_s.update_s.items() if n in run.nodes},
            settings,
            slow_nodes.on_flagged(session, run, attempt, settings, report.node_update_s.step),
        )
    if fresh:
        last = max(fresh, key=lambda m: m.step)
        run.last_step, run.last_loss = last.step, last.loss
        run.tokens_per_s = last.tokens_per_s
        run.last_progress_at = now
        _summarise_progress(attempt, last.step, now)
        if attempt.first_step is None:
            attempt.first_step = min(m.step for m in fresh)
            attempt.first_step_at = now
            incident_timeline.first_step(session, run.id, attempt.first_step)
        # Predicted vs measured (runs/plan_outcomes.py); with a fresh measurement, the run's
        # checkpoint interval from the failures the cluster has (runs/live_interval.py).
        if plan_outcomes.refresh_measurements(session, run):
            live_interval.rederive(session, run, settings or get_settings())
    return run, attempt


def _summarise_progress(attempt: Attempt, step: int, at: datetime) -> None:
    """The attempt's highest step and its newest report: what goodput reads (runs/goodput.py)
    instead of the metric rows. Reports may race each other, so both only move forward."""
    attempt.last_step = max(attempt.last_step or step, step)
    if attempt.last_progress_at is None or attempt.last_progress_at < at:
        attempt.last_progress_at = at


def check_checkpoint_path(run: Run, path: str, settings: Settings) -> None:
    """Refuse a reported checkpoint path outside the run's own checkpoint folder.

    The path is stored and handed on: the next attempt resumes from it, and `runyard run
    export` reads it as whoever types it. A worker (its owner's code) reporting another
    folder could have a colleague's export read files it planted there. So the path must be
    absolute, name no `..`, and lie strictly inside the folder once both are resolved,
    which follows every link the service can see; links inside the owner's folder, which the
    service usually cannot list (mode 0750), are the export's to refuse
    (worker/hf/dcp_reader.py). Workers report resolved paths (worker/train.py), so a link
    in the roots (/shared -> /mnt/lustre) resolves alike on both sides."""
    folder = Path(os.path.realpath(checkpoint_folder(settings, run)))
    reported = Path(path)
    if not reported.is_absolute() or ".." in reported.parts:
        raise InvalidSpec(f"path: {path!r} must be an absolute path inside {folder}")
    resolved = Path(os.path.realpath(reported))
    if resolved == folder or not resolved.is_relative_to(folder):
        raise InvalidSpec(
            f"path: {path} is not inside run {run.id}'s checkpoint folder {folder}"
            + (f" (it resolves to {resolved})" if resolved != reported else "")
        )


def record_checkpoint(
    session: Session, attempt_id: int, report: CheckpointReport, settings: Settings | None = None
) -> Checkpoint:
    attempt, run = live_attempt_and_run(session, attempt_id)
    check_checkpoint_path(run, report.path, settings or get_settings())
    if report.state == "CORRUPT":
        return mark_corrupt(session, run, attempt, report.step, report.path, report.detail)
    checkpoint = repository.get_checkpoint(session, run.id, report.step)
    if checkpoint is None:
        checkpoint = Checkpoint(
            run_id=run.id,
            attempt_id=attempt.id,
            step=report.step,
            path=report.path,
            state=CheckpointState.WRITING,
        )
        session.add(checkpoint)
    elif checkpoint.state == CheckpointState.COMMITTED and report.state == "WRITING":
        raise Conflict(f"checkpoint at step {report.step} is already COMMITTED")
    checkpoint.attempt_id, checkpoint.path = attempt.id, report.path
    checkpoint.num_bytes = (
        report.num_bytes if report.num_bytes is not None else checkpoint.num_bytes
    )
    checkpoint.write_s = report.write_s if report.write_s is not None else checkpoint.write_s
    checkpoint.stall_s = report.stall_s if report.stall_s is not None else checkpoint.stall_s
    if report.state == "COMMITTED" and checkpoint.state != CheckpointState.COMMITTED:
        checkpoint.state, checkpoint.committed_at = CheckpointState.COMMITTED, utcnow()
        session.flush()
        record_event(
            session,
            run,
            "checkpoint.committed",
            f"checkpoint at step {report.step} committed",
            attempt,
            {
                "step": report.step,
                "path": report.path,
                "num_bytes": report.num_bytes,
                "write_s": report.write_s,
                "stall_s": report.stall_s,
            },
        )
        _mark_pruned(session, run)
    session.flush()
    return checkpoint


def _mark_pruned(session: Session, run: Run) -> None:
    """Mirror the worker's retention: only the newest K committed checkpoints stay."""
    keep = RunSpec.model_validate(run.spec).keep_checkpoints
    committed = [
        c for c in repository.checkpoints(session, run.id) if c.state == CheckpointState.COMMITTED
    ]
    for old in committed[:-keep]:
        old.state = CheckpointState.DELETED


def record_finish(session: Session, attempt_id: int, report: FinishReport) -> Run:
    attempt, run = live_attempt_and_run(session, attempt_id)
    run.final_step = report.final_step
    record_event(
        session,
        run,
        "run.final_step",
        f"worker finished step {report.final_step} of {run.total_steps}",
        attempt,
        report.model_dump(),
    )
    plan_outcomes.refresh_measurements(session, run, force=True)  # with every step reported
    return run


def record_error(
    session: Session, attempt_id: int, report: ErrorReport, settings: Settings | None = None
) -> None:
    """Keep what the rank saw on the run's timeline and the node's history.

    The restart itself follows from the job ending (the rank exits after reporting): this
    only makes the cause visible, and drains only what an SDC report names, within the
    run's cap (recovery/claims.py). A report names only the attempt's own nodes: a run's
    code writes no history, and causes no drain, for a node it was not given.
    """
    attempt, run = live_attempt_and_run(session, attempt_id)
    for field, names in (("node", [report.node] if report.node else []), ("nodes", report.nodes)):
        # (a sweep task's attempt learns its node from Slurm a moment after it starts)
        if attempt.nodes and (strangers := sorted(set(names) - set(attempt.nodes))):
            raise InvalidSpec(
                f"{field}: {', '.join(strangers)} not among attempt {attempt.id}'s nodes "
                f"({', '.join(attempt.nodes)})"
            )
    if report.kind == sdc.REPORT:  # drain the odd nodes
        sdc.record_report(session, run, attempt, report, settings or get_settings())
    if report.kind == "worker:do_not_retry":
        # Read when the job ends (reconcile/verdict.py): the run fails instead of retrying.
        # Its own column: the job still runs, so it has no exit code yet.
        attempt.do_not_retry = True
    record_event(
        session,
        run,
        "worker.error",
        f"rank {report.rank} on {report.node or '?'}: {report.kind}: {report.message[:300]}",
        attempt,
        report.model_dump(),
    )
    node = nodes_repo.get_node(session, attempt.cluster, report.node) if report.node else None
    # An exception in the run's own code (or a checkpoint that fails to load, or a loss
    # spike: service/runs/rollback.py) says nothing about the node: it stays out of the
    # node's history (recovery/repeats.py reads it).
    if node is not None and report.kind not in (
        "worker:exception",
        "worker:checkpoint_load",
        "worker:anomaly",
        sdc.REPORT,  # the node's history gets the drain with its reason instead
    ):
        session.add(
            NodeEvent(
                cluster=node.cluster,
                node_name=node.name,
                kind=report.kind,
                action="RESTART",
                message=f"run {run.id} rank {report.rank}: {report.message}"[:4000],
                data={"run_id": run.id, "attempt_id": attempt.id},
            )
        )
