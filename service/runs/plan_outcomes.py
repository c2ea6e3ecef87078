"""Each run's plan beside what the service measured of it (the `plan_outcomes` table).

The prediction is stored when a run is admitted, from the plan kept with it. The
measurement is refreshed from the run's own rows while it trains (at most every
REFRESH_S, and once more when its final step is reported): the steady-state step time is
the median over every attempt's steps after its first WARMUP_STEPS (communicators being
built, the allocator warming up, compilation), so that a checkpoint's slow step or a
straggler's hiccup moves it little; checkpoint cost is the median save stall the workers
measured; each recovery's phases come from its incident's timestamps. The planner's
calibration learns from these rows (service/plans/history.py).
"""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from service.models import Attempt, Checkpoint, CheckpointState, Incident, Metric, PlanOutcome, Run
from service.models.base import utcnow
from service.runs.goodput_figures import checkpoint_stall_s

WARMUP_STEPS = 2  # each attempt's first steps are not steady state (see the docstring)
REFRESH_S = 15.0  # a running run's measurement is at most this old
# An incident's timestamps in order: each phase of a recovery ends at the next one.
RECOVERY_PHASES = (
    ("detect", "signal_at", "detected_at"),
    ("drain", "detected_at", "drained_at"),
    ("end", "drained_at", "attempt_ended_at"),
    ("resubmit", "attempt_ended_at", "submitted_at"),
    ("start", "submitted_at", "running_at"),
    ("first_step", "running_at", "first_step_at"),
)


def layout_family(layout: dict[str, Any]) -> str:
    """The accuracy report's grouping of layouts: how the data-parallel side shards (ddp,
    zero1, zero2, fsdp), then each model-parallel kind used (tp, pp, cp)."""
    sharding = ("ddp", "zero1", "zero2", "fsdp")[int(layout.get("zero_stage", 0))]
    parallel = [kind for kind in ("tp", "pp", "cp") if int(layout.get(kind, 1)) > 1]
    return "+".join([sharding, *parallel])


def record_prediction(session: Session, run: Run, accelerator: str) -> PlanOutcome | None:
    """Store (or replace, after a re-plan) what the run's plan predicts. None for a run
    without a plan (an older row)."""
    plan = run.config.get("plan")
    if not plan:
        return None
    outcome = session.get(PlanOutcome, run.id) or PlanOutcome(run_id=run.id)
    calibration = plan.get("calibration") or {}
    applied = bool(calibration.get("applied"))
    terms = plan.get("step_terms_s") or {}
    uncalibrated = plan.get("uncalibrated_step_time_s") or plan["step_time_s"]
    checkpoint_factor = float(calibration.get("checkpoint", 1.0)) if applied else 1.0
    outcome.hardware = plan["hardware"]
    outcome.accelerator = accelerator
    outcome.num_params = int(plan["num_params"])
    outcome.layout_family = layout_family(run.config["layout"])
    outcome.num_gpus = int(plan["num_gpus"])
    outcome.seq_len = int(plan["seq_len"])
    outcome.global_batch_tokens = int(plan["global_batch_tokens"])
    outcome.predicted_step_s = float(plan["step_time_s"])
    outcome.predicted_tokens_per_s_per_gpu = float(plan["tokens_per_s_per_gpu"])
    outcome.predicted_mfu = float(plan["mfu"])
    # What a save costs training, as the measured stall does (plans before it: the write).
    checkpoint = plan["checkpoint"]
    outcome.predicted_checkpoint_s = float(checkpoint.get("stall_s") or checkpoint["write_s"])
    outcome.predicted_restart_s = calibration.get("restart_s") if applied else None
    outcome.uncalibrated_step_s = float(uncalibrated)
    outcome.uncalibrated_compute_s = float(terms.get("compute_s", uncalibrated))
    outcome.uncalibrated_communication_s = float(terms.get("communication_s", 0.0))
    outcome.uncalibrated_checkpoint_s = outcome.predicted_checkpoint_s / checkpoint_factor
    outcome.calibrated = applied
    outcome.calibration_runs = int(calibration.get("num_runs", 0)) if applied else 0
    outcome.recoveries = outcome.recoveries or []
    session.add(outcome)
    return outcome


def steady_step_s(session: Session, run_id: int) -> tuple[float | None, int]:
    """(median step time, steps it is over) of the run's steps past each attempt's warm-up."""
    past_warmup = and_(
        Metric.run_id == run_id,
        Metric.step_time_s.is_not(None),
        Metric.step > func.coalesce(Attempt.first_step, 0) + WARMUP_STEPS - 1,
    )
    row = session.execute(
        select(
            func.percentile_cont(0.5).within_group(Metric.step_time_s),
            func.count(Metric.id),
        )
        .join(Attempt, Attempt.id == Metric.attempt_id)
        .where(past_warmup)
    ).one()
    median, count = row
    return (float(median) if median is not None else None), int(count)


def recovery_phases(incident: Incident) -> dict[str, Any]:
    """One recovery's phases in seconds (None where a stamp is missing), and its total from
    the failure signal to the first step trained again."""
    phases: dict[str, Any] = {"incident_id": incident.id, "signal": incident.signal}
    for name, start, end in RECOVERY_PHASES:
        begin, finish = getattr(incident, start), getattr(incident, end)
        phases[name] = _seconds(begin, finish)
    phases["total"] = _seconds(incident.signal_at, incident.first_step_at)
    return phases


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return round(max((end - start).total_seconds(), 0.0), 3)


def refresh_measurements(session: Session, run: Run, *, force: bool = False) -> bool:
    """Measure the run again from its rows, unless its measurement is fresher than
    REFRESH_S (`force`: the run just reported its final step); True when it did."""
    outcome = session.get(PlanOutcome, run.id)
    if outcome is None:
        return False
    now = utcnow()
    if (
        not force
        and outcome.measured_at is not None
        and now - outcome.measured_at < timedelta(seconds=REFRESH_S)
    ):
        return False
    step_s, count = steady_step_s(session, run.id)
    outcome.num_measured_steps = count
    if step_s is not None and step_s > 0:
        outcome.measured_step_s = step_s
        outcome.measured_tokens_per_s_per_gpu = outcome.global_batch_tokens / (
            step_s * outcome.num_gpus
        )
        # MFU is proportional to tokens/s for a fixed model, batch and GPU count.
        outcome.measured_mfu = (
            outcome.predicted_mfu
            * outcome.measured_tokens_per_s_per_gpu
            / outcome.predicted_tokens_per_s_per_gpu
        )
    stalls = [
        checkpoint_stall_s(c)
        for c in session.scalars(
            select(Checkpoint).where(
                Checkpoint.run_id == run.id, Checkpoint.state != CheckpointState.WRITING
            )
        )
        if c.stall_s is not None or c.write_s is not None
    ]
    outcome.num_checkpoints = len(stalls)
    outcome.measured_checkpoint_s = statistics.median(stalls) if stalls else None
    recovered = session.scalars(
        select(Incident)
        .where(Incident.run_id == run.id, Incident.first_step_at.is_not(None))
        .order_by(Incident.id)
    ).all()
    outcome.recoveries = [recovery_phases(i) for i in recovered]
    totals = [r["total"] for r in outcome.recoveries if r["total"] is not None]
    outcome.measured_restart_s = statistics.median(totals) if totals else None
    outcome.measured_at = now
    return True
