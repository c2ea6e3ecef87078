"""A sweep: one grid of runs submitted to Slurm as one job array."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import DateTime, Integer, String, Text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, Timestamped


class Sweep(Timestamped, Base):
    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    owner: Mapped[str] = mapped_column(String(64), default="")
    team: Mapped[str] = mapped_column(String(64), default="", index=True)
    unix_user: Mapped[str] = mapped_column(String(64), default="", server_default="")
    slurm_account: Mapped[str] = mapped_column(String(64), default="", server_default="")
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)  # as submitted, grid included
    max_parallel: Mapped[int] = mapped_column(Integer)  # the array's %limit
    job_name: Mapped[str] = mapped_column(String(128), default="")
    job_folder: Mapped[str] = mapped_column(Text, default="")
    # The first attempts of the members, in array task order. Fixed before sbatch, so a
    # service that dies mid-submit maps the array's tasks back to its attempts.
    array_attempt_ids: Mapped[list[int]] = mapped_column(
        ARRAY(Integer), default=list, server_default="{}"
    )
    slurm_array_job_id: Mapped[str | None] = mapped_column(String(32))
    submitted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
