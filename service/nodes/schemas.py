"""Nodes as the API shows them."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from service.models import NodeState


class NodeOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    cluster: str = Field(description="Slurm ClusterName: a node is (cluster, name).")
    name: str
    state: NodeState
    state_reason: str
    slurm_state: str
    slurm_reason: str
    addr: str
    switch: str | None
    num_gpus: int
    last_heartbeat_at: datetime | None
    slow_since: datetime | None = Field(
        default=None,
        description="Flagged SLOW since then: its ranks' update time persistently above "
        "its peers' median by the margin (service/nodes/stragglers.py); None: not flagged.",
    )
    slow_ratio: float | None = Field(
        default=None, description="Its last update time over its peers' median."
    )
    num_slow_reports: int = Field(default=0, description="Consecutive slow reports so far.")


class Heartbeat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_version: str = Field(default="", max_length=64)
    gpu_present: bool = Field(default=False, description="NVML found a GPU on this node.")


class AgentEvent(BaseModel):
    """One signal an agent saw on its node (kernel log, NVML, a run's log)."""

    model_config = ConfigDict(extra="forbid")

    idempotency_key: str = Field(
        min_length=8,
        max_length=128,
        description="Unique per event; a re-sent event is stored once.",
    )
    kind: str = Field(
        min_length=2,
        max_length=48,
        pattern=r"^[a-z_]+(:[a-z0-9_]+)?$",
        description="xid, sxid:fatal, nvml:pending_row_remap, nccl:log_error, ...",
    )
    code: int | None = Field(default=None, ge=0, le=1_000_000, description="Xid / SXid number.")
    message: str = Field(default="", max_length=4000, description="The line as the node saw it.")
    observed_at: datetime | None = None
    data: dict[str, str | int | float | bool | None] = Field(default_factory=dict)


class EventBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    events: list[AgentEvent] = Field(min_length=1, max_length=1000)


class EventBatchAck(BaseModel):
    accepted: int
    duplicates: int


class NodeEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: str
    code: int | None
    action: str | None
    message: str
    created_at: datetime
    observed_at: datetime | None


class NodeDetail(NodeOut):
    num_app_errors: int
    events: list[NodeEventOut]


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=3, max_length=180, description="Shown in `sinfo -R`.")


class ResumeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    force: bool = Field(
        default=False, description="Resume even if someone other than runyard drained it."
    )
