"""`runyard plan accuracy`: predicted against measured, per model size and layout family."""

from __future__ import annotations

import statistics
from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import PlanOutcome, Run
from service.plans.history import COMPARABLE_ACCELERATOR, cluster_calibration
from service.plans.schemas import AccuracyReport, GroupAccuracy, RunAccuracy


def model_size(num_params: int) -> str:
    """Parameters in the units people say them in: 8.03B, 405B, 1.05M."""
    if num_params >= 10**9:
        return f"{num_params / 1e9:.3g}B"
    return f"{num_params / 1e6:.3g}M"


def run_accuracy(outcome: PlanOutcome) -> RunAccuracy:
    measured = outcome.measured_step_s
    return RunAccuracy(
        run_id=outcome.run_id,
        hardware=outcome.hardware,
        accelerator=outcome.accelerator,
        comparable=outcome.accelerator == COMPARABLE_ACCELERATOR,
        model_size=model_size(outcome.num_params),
        layout_family=outcome.layout_family,
        num_gpus=outcome.num_gpus,
        seq_len=outcome.seq_len,
        predicted_step_s=outcome.predicted_step_s,
        measured_step_s=measured,
        step_error=outcome.predicted_step_s / measured - 1 if measured else None,
        predicted_tokens_per_s_per_gpu=outcome.predicted_tokens_per_s_per_gpu,
        measured_tokens_per_s_per_gpu=outcome.measured_tokens_per_s_per_gpu,
        predicted_mfu=outcome.predicted_mfu,
        measured_mfu=outcome.measured_mfu,
        predicted_checkpoint_s=outcome.predicted_checkpoint_s,
        measured_checkpoint_s=outcome.measured_checkpoint_s,
        predicted_restart_s=outcome.predicted_restart_s,
        measured_restart_s=outcome.measured_restart_s,
        recoveries=outcome.recoveries or [],
        num_measured_steps=outcome.num_measured_steps,
        calibrated=outcome.calibrated,
        calibration_runs=outcome.calibration_runs,
    )


def group_accuracy(runs: list[RunAccuracy]) -> list[GroupAccuracy]:
    """One row per (model size, layout family)."""
    grouped: dict[tuple[str, str], list[RunAccuracy]] = defaultdict(list)
    for run in runs:
        grouped[run.model_size, run.layout_family].append(run)
    rows = []
    for (size, family), members in grouped.items():
        errors = [r.step_error for r in members if r.step_error is not None]
        rows.append(
            GroupAccuracy(
                model_size=size,
                layout_family=family,
                num_runs=len(errors),
                median_abs_step_error=statistics.median(map(abs, errors)) if errors else None,
                worst_step_error=max(errors, key=abs) if errors else None,
            )
        )
    return sorted(rows, key=lambda g: (g.model_size, g.layout_family))


def accuracy_report(
    session: Session, settings: Settings, team: str | None, limit: int
) -> AccuracyReport:
    """The newest `limit` runs with a stored prediction (of `team`, or every team's)."""
    query = (
        select(PlanOutcome)
        .join(Run, Run.id == PlanOutcome.run_id)
        .order_by(PlanOutcome.run_id.desc())
        .limit(limit)
    )
    if team is not None:
        query = query.where(Run.team == team)
    runs = [run_accuracy(o) for o in session.scalars(query)]
    return AccuracyReport(
        calibration=cluster_calibration(session, settings).applied_schema(settings.hardware),
        groups=group_accuracy(runs),
        runs=runs,
    )
