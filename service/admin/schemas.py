"""What on-call sends and reads."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.models import IncidentState, RecoveryAction


class SparePool(BaseModel):
    target: int
    members: list[str]


class SparePoolUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: int = Field(ge=0, le=1280, description="How many healthy idle nodes to hold.")


class IncidentOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: str
    signal: str
    action: RecoveryAction
    state: IncidentState
    message: str
    node_name: str | None
    run_id: int | None
    attempt_id: int | None
    spare_node: str | None
    resume_step: int | None
    signal_at: datetime
    detected_at: datetime
    drained_at: datetime | None
    attempt_ended_at: datetime | None
    submitted_at: datetime | None
    running_at: datetime | None
    first_step_at: datetime | None
    resolved_at: datetime | None
    details: dict[str, Any]
    recovery_s: float | None = Field(
        default=None, description="Signal to first resumed step, seconds."
    )
