"""What the service has exported of each run to each experiment tracker (service/tracking/)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy import (
    BigInteger,
    DateTime,
    Enum,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, Timestamped


class TrackerKind(StrEnum):
    MLFLOW = "mlflow"
    WANDB = "wandb"
    TENSORBOARD = "tensorboard"


class ExportState(StrEnum):
    EXPORTING = "EXPORTING"  # the run trains (or its last steps are not out yet)
    FINISHED = "FINISHED"  # every step, the final state and the tracker run closed


class TrackerExport(Timestamped, Base):
    """One run in one tracker: the tracker's run and the cursor of what it already holds.

    `exported_step` is the cursor: every step of the run's surviving timeline up to it is in
    the tracker, once. `in_flight` is the batch being sent when the service last wrote
    (`{"through_step": N, "event_ids": [...]}`): after a crash the tracker is asked what
    it holds before anything is sent again (service/tracking/export.py)."""

    __tablename__ = "tracker_exports"
    __table_args__ = (UniqueConstraint("run_id", "tracker"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    tracker: Mapped[TrackerKind] = mapped_column(
        Enum(
            TrackerKind,
            name="tracker_kind",
            native_enum=False,
            length=16,
            values_callable=lambda cls: [member.value for member in cls],
        )
    )
    state: Mapped[ExportState] = mapped_column(
        Enum(ExportState, name="export_state", native_enum=False, length=16),
        default=ExportState.EXPORTING,
    )
    # The tracker's own name for the run: MLflow's run id, W&B's run id, TensorBoard's
    # log directory.
    tracker_run_id: Mapped[str | None] = mapped_column(String(512))
    exported_step: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    exported_event_ids: Mapped[list[int]] = mapped_column(
        ARRAY(BigInteger), default=list, server_default="{}"
    )
    in_flight: Mapped[dict[str, object] | None] = mapped_column(JSONB)
    num_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_error: Mapped[str | None] = mapped_column(Text)
    next_try_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_exported_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
