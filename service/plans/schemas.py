"""POST /v1/plans: the planner's question, as the CLI's `runyard plan` asks it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from contract import ModelShape, Recompute


class PinnedLayout(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dp: int | None = Field(default=None, ge=1)
    tp: int | None = Field(default=None, ge=1)
    pp: int | None = Field(default=None, ge=1)
    cp: int | None = Field(default=None, ge=1)
    zero_stage: int | None = Field(default=None, ge=0, le=3)
    micro_batch_size: int | None = Field(default=None, ge=1)
    recompute: Recompute | None = None
    vp: int | None = Field(default=None, ge=1, description="Virtual pipeline stages per rank.")


class PlanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str | ModelShape = Field(description="A preset name or an explicit shape.")
    gpus: int = Field(ge=1, le=65536)
    seq_len: int = Field(ge=2, le=1_048_576)
    global_batch_tokens: int = Field(ge=2, le=1 << 34)
    precision: Literal["bf16", "fp8"] = "bf16"
    hardware: str = Field(default="h100-sxm", max_length=32)
    network: Literal["ib", "efa"] = "ib"
    gpus_per_node: int = Field(default=8, ge=1, le=16)
    pinned: PinnedLayout = Field(default_factory=PinnedLayout)
