"""What on-call sends and reads."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.auth.schemas import TokenOut
from service.models import ClassicBecause, IncidentState, RecoveryAction, RecoveryPath, Role


class SparePool(BaseModel):
    cluster: str = Field(description="Slurm ClusterName: each cluster has its own pool.")
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
    cluster: str = Field(default="", description="The node's cluster, or the run's.")
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
    recovery_path: RecoveryPath | None = Field(
        default=None, description="fast: only the failed replica group was replaced."
    )
    classic_because: ClassicBecause | None = Field(
        default=None, description="Why the fast path could not handle it (classic only)."
    )
    recovery_s: float | None = Field(
        default=None, description="Signal to first resumed step, seconds."
    )


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._@-]+$")
    team: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    role: Role
    node_name: str | None = Field(
        default=None,
        max_length=64,
        description="Required for agent tokens: the node it speaks for.",
    )
    cluster: str | None = Field(
        default=None,
        max_length=64,
        description="Agent tokens: the node's cluster (default: the default cluster); node "
        "names repeat across clusters.",
    )
    expires_in_days: int | None = Field(default=None, ge=1, le=3650)


class TokenCreated(TokenOut):
    token: str = Field(description="The secret: shown this once, stored only as a hash.")


class TeamQuota(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu_quota: int | None = Field(ge=0, le=1_000_000, description="None: unlimited.")


class TeamOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    gpu_quota: int | None


class AuditOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    at: datetime
    actor: str
    actor_team: str
    action: str
    target: str
    detail: dict[str, Any]
