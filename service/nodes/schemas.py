"""Nodes as the API shows them."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from service.models import NodeState


class NodeOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    state: NodeState
    state_reason: str
    slurm_state: str
    slurm_reason: str
    addr: str
    switch: str | None
    num_gpus: int
    last_heartbeat_at: datetime | None


class Heartbeat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_version: str = Field(default="", max_length=64)
    gpu_present: bool = Field(default=False, description="NVML found a GPU on this node.")
