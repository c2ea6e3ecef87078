"""What the planner predicted for each run beside what the service measured of it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Boolean, DateTime, Float, ForeignKey, Integer, String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, Timestamped


class PlanOutcome(Timestamped, Base):
    """One per run: the plan's predictions (written when the run is admitted, again when a
    shrink re-plans it) and the measurements (refreshed while it trains). The cluster's
    history of these is what `runyard plan accuracy` shows and what the calibration of later
    plans is fitted from (service/plans/history.py)."""

    __tablename__ = "plan_outcomes"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    # How the run groups in the accuracy report and whether it can calibrate the planner:
    # only runs whose ranks ran on the GPUs the plan costed (not the CPU dev cluster's).
    hardware: Mapped[str] = mapped_column(String(32), index=True)
    accelerator: Mapped[str] = mapped_column(String(16))
    num_params: Mapped[int] = mapped_column(BigInteger)
    layout_family: Mapped[str] = mapped_column(String(32))
    num_gpus: Mapped[int] = mapped_column(Integer)
    seq_len: Mapped[int] = mapped_column(Integer)
    global_batch_tokens: Mapped[int] = mapped_column(BigInteger)

    # Predicted (the plan as admitted; calibrated when history allowed).
    predicted_step_s: Mapped[float] = mapped_column(Float)
    predicted_tokens_per_s_per_gpu: Mapped[float] = mapped_column(Float)
    predicted_mfu: Mapped[float] = mapped_column(Float)
    predicted_checkpoint_s: Mapped[float] = mapped_column(Float)
    predicted_restart_s: Mapped[float | None] = mapped_column(Float)
    # The published-figure model's view of the same layout: what calibration fits against.
    uncalibrated_step_s: Mapped[float] = mapped_column(Float)
    uncalibrated_compute_s: Mapped[float] = mapped_column(Float)
    uncalibrated_communication_s: Mapped[float] = mapped_column(Float)
    uncalibrated_checkpoint_s: Mapped[float] = mapped_column(Float)
    calibrated: Mapped[bool] = mapped_column(Boolean, default=False)
    calibration_runs: Mapped[int] = mapped_column(Integer, default=0)

    # Measured (None until the run has trained past its warm-up steps).
    measured_step_s: Mapped[float | None] = mapped_column(Float)
    measured_tokens_per_s_per_gpu: Mapped[float | None] = mapped_column(Float)
    measured_mfu: Mapped[float | None] = mapped_column(Float)
    num_measured_steps: Mapped[int] = mapped_column(Integer, default=0)
    measured_checkpoint_s: Mapped[float | None] = mapped_column(Float)  # median save stall
    num_checkpoints: Mapped[int] = mapped_column(Integer, default=0)
    measured_restart_s: Mapped[float | None] = mapped_column(Float)  # median, signal to step
    # Each recovery's phases in seconds: detect, drain, end, resubmit, start, first_step,
    # total (service/runs/plan_outcomes.py recovery_phases).
    recoveries: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list)
    measured_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
