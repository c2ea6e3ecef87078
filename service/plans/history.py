"""The cluster's history as the planner's calibration sees it (planner/calibration.py).

Only runs whose ranks ran on the GPUs their plan costed count: on the CPU dev cluster the
plan says what the same run would do on the cluster's GPU type, so a CPU step time says
nothing about the planner's error. The newest HISTORY_RUNS runs of this cluster's
hardware are used, so that the corrections follow the cluster as it changes (a driver or
PyTorch upgrade, a new network) instead of averaging over its whole life.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from planner.calibration import Calibration, StepObservation, calibrate
from service.config import Settings
from service.models import PlanOutcome

HISTORY_RUNS = 200  # the newest runs the corrections are fitted from
COMPARABLE_ACCELERATOR = "gpu"


def history(session: Session, hardware: str) -> list[PlanOutcome]:
    """This hardware's newest measured runs that ran on GPUs, newest first."""
    return list(
        session.scalars(
            select(PlanOutcome)
            .where(
                PlanOutcome.hardware == hardware,
                PlanOutcome.accelerator == COMPARABLE_ACCELERATOR,
                PlanOutcome.measured_at.is_not(None),
            )
            .order_by(PlanOutcome.measured_at.desc())
            .limit(HISTORY_RUNS)
        ).all()
    )


def cluster_calibration(session: Session, settings: Settings) -> Calibration:
    """The corrections this cluster's own runs support (none below the minimum history)."""
    runs = history(session, settings.hardware)
    steps = [
        StepObservation(o.uncalibrated_compute_s, o.uncalibrated_communication_s, o.measured_step_s)
        for o in runs
        if o.measured_step_s is not None
    ]
    checkpoints = [
        (o.uncalibrated_checkpoint_s, o.measured_checkpoint_s)
        for o in runs
        if o.measured_checkpoint_s is not None
    ]
    restarts = [
        r["total"] for o in runs for r in (o.recoveries or []) if r.get("total") is not None
    ]
    return calibrate(steps, checkpoints, restarts)
