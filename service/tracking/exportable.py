"""What of a run is ready for its trackers: settled steps of its surviving timeline, its
events, its parameters, and at the end its final state. All read from Postgres.

A tracker keeps whatever it is sent (MLflow appends a second value for a step, W&B drops a
step lower than its last), so a step is sent only once nothing can train it again: when it
is at or below the newest COMMITTED checkpoint (every later attempt resumes from there or
above; the worker delivers a checkpoint's steps before its commit, worker/reporter.py),
and, where the run compares replicas for silent data corruption, at or below the last
clean comparison (a mismatch distrusts the checkpoints after it, service/recovery/sdc.py).
Once the run has ended, every step is settled. A step trained by several attempts (the
steps after a checkpoint that a failed attempt reached, trained again by the next) is sent
as the newest attempt trained it: that is the timeline the weights descend from.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.orm import Session

from service.models import Attempt, Metric, Run, RunEvent
from service.runs.goodput import achieved_mfu, compute_goodput
from service.runs.repository import checkpoints, newest_committed_checkpoint
from service.runs.tracking_spec import TrackingSpec
from service.tracking.records import (
    MAX_EVENTS_PER_BATCH,
    MAX_STEPS_PER_BATCH,
    FinalSummary,
    StepRow,
    TrackedEvent,
    TrackedRun,
)

# The timeline entries a tracker shows as events: recoveries, rollbacks, preemptions,
# segment boundaries (an attempt stopping and the next one starting), and the end.
EXPORTED_EVENT_KINDS = (
    "attempt.failed",
    "attempt.stopped",
    "attempt.running",
    "recovery.spare_assigned",
    "recovery.no_spare",
    "recovery.fast_path",
    "recovery.classic_path",
    "recovery.slow_node",
    "run.rolled_back",
    "run.preempting",
    "run.shrunk",
    "checkpoint.corrupt",
    "run.succeeded",
    "run.failed",
    "run.cancelled",
)
PLAN_PARAMS = ("step_time_s", "tokens_per_s", "mfu", "goodput", "spare_nodes")
MAX_PARAM_CHARS = 500  # MLflow's params hold up to 6,000 characters; a spec field is short


def tracking_spec(run: Run) -> TrackingSpec | None:
    section = run.spec.get("tracking")
    return TrackingSpec.model_validate(section) if section else None


def flatten(prefix: str, value: Any, into: dict[str, str]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            flatten(f"{prefix}.{key}" if prefix else str(key), inner, into)
    elif value is not None:
        into[prefix] = str(value)[:MAX_PARAM_CHARS]


def tracked_run(run: Run) -> TrackedRun:
    """The run's names and parameters: the spec, the resolved layout, the plan's figures."""
    spec = tracking_spec(run) or TrackingSpec()
    params: dict[str, str] = {"runyard.run_id": str(run.id), "runyard.team": run.team}
    flatten("spec", {k: v for k, v in run.spec.items() if k != "tracking"}, params)
    flatten("layout", run.config.get("layout") or {}, params)
    plan = run.config.get("plan") or {}
    for key in PLAN_PARAMS:
        if plan.get(key) is not None:
            params[f"plan.{key}"] = str(plan[key])
    memory = (plan.get("memory_gib_per_gpu") or {}).get("total")
    if memory is not None:
        params["plan.memory_gib_per_gpu"] = str(memory)
    interval = (plan.get("checkpoint") or {}).get("interval_steps")
    if interval is not None:
        params["plan.checkpoint_interval_steps"] = str(interval)
    return TrackedRun(
        run_id=run.id,
        name=run.name,
        team=run.team,
        owner=run.owner,
        mlflow_experiment=(spec.mlflow.experiment if spec.mlflow else None) or run.team or None,
        wandb_project=spec.wandb.project if spec.wandb else None,
        wandb_entity=spec.wandb.entity if spec.wandb else None,
        params=params,
    )


def settled_step(session: Session, run: Run) -> int:
    """The highest step no attempt can train again (module docstring)."""
    if run.state.is_terminal:
        return int(
            session.scalar(select(func.max(Metric.step)).where(Metric.run_id == run.id)) or 0
        )
    newest = newest_committed_checkpoint(session, run.id)
    settled = newest.step if newest is not None else 0
    clean = run.config.get("sdc_clean_step")
    return min(settled, int(clean)) if clean is not None else settled


def step_rows(session: Session, run: Run, after: int, through: int) -> list[StepRow]:
    """The surviving timeline's steps in (after, through], at most MAX_STEPS_PER_BATCH."""
    newest_first = (
        select(Metric)
        .where(Metric.run_id == run.id, Metric.step > after, Metric.step <= through)
        .order_by(Metric.step, Metric.attempt_id.desc(), Metric.id.desc())
        .ext(distinct_on(Metric.step))
        .limit(MAX_STEPS_PER_BATCH)
    )
    metrics = session.scalars(newest_first).all()
    if not metrics:
        return []
    held_out = validation_losses(session, run.id, after, metrics[-1].step)
    plan = run.config.get("plan")
    rows = []
    for m in metrics:
        figures = {"loss": m.loss}
        for key, value in (
            ("tokens_per_s", m.tokens_per_s),
            ("step_time_s", m.step_time_s),
            ("lr", m.lr),
            ("mfu", achieved_mfu(plan, m.tokens_per_s)),
            ("val_loss", held_out.get(m.step)),
        ):
            if value is not None:
                figures[key] = float(value)
        rows.append(StepRow(m.step, figures))
    return rows


def validation_losses(session: Session, run_id: int, after: int, through: int) -> dict[int, float]:
    """Held-out losses by step (run.validation events; the newest where steps repeat)."""
    step = RunEvent.data["step"].as_integer()
    rows = session.execute(
        select(step, RunEvent.data["loss"].as_float())
        .where(
            RunEvent.run_id == run_id,
            RunEvent.kind == "run.validation",
            step > after,
            step <= through,
        )
        .order_by(RunEvent.id)
    ).all()
    return {int(s): float(loss) for s, loss in rows if s is not None and loss is not None}


def goodput_figures(session: Session, run: Run) -> dict[str, float]:
    """Goodput so far and its badput breakdown (lost/<cause>_s), as `run show` has them."""
    attempts = session.scalars(
        select(Attempt).where(Attempt.run_id == run.id).order_by(Attempt.number)
    ).all()
    figures = compute_goodput(run, attempts, checkpoints(session, run.id))
    if figures.goodput is None:
        return {}
    lost = {f"lost/{cause}": float(s) for cause, s in figures.lost.model_dump().items()}
    return {"goodput": figures.goodput, "allocated_s": figures.allocated_s, **lost}


def new_events(session: Session, run_id: int, sent: set[int]) -> list[TrackedEvent]:
    """Events of the exported kinds not in the tracker yet, oldest first."""
    rows = session.scalars(
        select(RunEvent)
        .where(RunEvent.run_id == run_id, RunEvent.kind.in_(EXPORTED_EVENT_KINDS))
        .order_by(RunEvent.id)
    ).all()
    fresh = [e for e in rows if e.id not in sent][:MAX_EVENTS_PER_BATCH]
    return [TrackedEvent(e.id, event_step(session, e), e.kind, e.message) for e in fresh]


def event_step(session: Session, event: RunEvent) -> int:
    """The step an event happened at: its own, else an attempt's resume step for its
    start, else the highest step the run had reported by then."""
    for key in ("step", "anomaly_step", "resume_step"):
        if isinstance(event.data.get(key), int):
            return int(event.data[key])
    if event.kind == "attempt.running" and event.attempt_id is not None:
        attempt = session.get(Attempt, event.attempt_id)
        if attempt is not None and attempt.resume_step is not None:
            return attempt.resume_step
    reached = session.scalar(
        select(func.max(Metric.step)).where(
            Metric.run_id == event.run_id, Metric.recorded_at <= event.created_at
        )
    )
    return int(reached or 0)


def final_summary(session: Session, run: Run) -> FinalSummary:
    """The end: the final state and why, the newest committed checkpoint and how to export it."""
    newest = newest_committed_checkpoint(session, run.id)
    command = (
        f"runyard run export {run.id} --step {newest.step} --format hf --out ./{run.name}-hf"
        if newest is not None
        else None
    )
    return FinalSummary(
        state=run.state.value,
        reason=run.state_reason,
        last_step=run.last_step,
        checkpoint_step=newest.step if newest is not None else None,
        checkpoint_path=newest.path if newest is not None else None,
        export_command=command,
    )
