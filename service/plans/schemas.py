"""POST /v1/plans: the planner's question, as the CLI's `runyard plan` asks it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from contract import ModelShape, Recompute
from planner.schemas import CalibrationApplied


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
    replica_groups: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        default="auto",
        description="Replica groups for the fast recovery path: 'auto' lets the planner "
        "choose the count with the layout (1 where groups would not pay); 1: none.",
    )
    uncalibrated: bool = Field(
        default=False,
        description="Plan from the published figures alone, without this cluster's "
        "corrections from its own measured runs.",
    )


class RunAccuracy(BaseModel):
    """One run: what its plan predicted beside what the service measured of it."""

    run_id: int
    hardware: str
    accelerator: str = Field(description="gpu, or cpu (a dev cluster: not comparable).")
    comparable: bool = Field(description="Ran on the GPUs the plan costed: counts for calibration.")
    model_size: str = Field(description="Parameters, e.g. 8.03B.")
    layout_family: str = Field(description="ddp/zero1/zero2/fsdp, then +tp, +pp, +cp.")
    num_gpus: int
    seq_len: int
    predicted_step_s: float
    measured_step_s: float | None
    step_error: float | None = Field(description="predicted / measured - 1 (step time).")
    predicted_tokens_per_s_per_gpu: float
    measured_tokens_per_s_per_gpu: float | None
    predicted_mfu: float
    measured_mfu: float | None
    predicted_checkpoint_s: float
    measured_checkpoint_s: float | None = Field(description="Median save stall measured.")
    predicted_restart_s: float | None
    measured_restart_s: float | None = Field(description="Median signal-to-step recovery.")
    recoveries: list[dict[str, Any]] = Field(description="Each recovery's phases, seconds.")
    num_measured_steps: int
    calibrated: bool = Field(description="The plan applied the cluster's corrections.")
    calibration_runs: int


class GroupAccuracy(BaseModel):
    """One model size and layout family: how far the step time predictions were off."""

    model_size: str
    layout_family: str
    num_runs: int = Field(description="Runs with a measured step time.")
    median_abs_step_error: float | None
    worst_step_error: float | None = Field(description="The error furthest from zero.")


class AccuracyReport(BaseModel):
    """Predicted against measured, from this cluster's own history."""

    calibration: CalibrationApplied = Field(description="What a plan made now would apply.")
    groups: list[GroupAccuracy]
    runs: list[RunAccuracy]
