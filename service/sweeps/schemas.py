"""A sweep spec: a run spec plus a parameter grid, and what the API returns for it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.models import RunState
from service.runs.schemas import RunDecision, RunSpec

# One job array shares one sbatch request, so a grid may vary only what does not change it.
SWEEPABLE = (
    "lr",
    "seed",
    "steps",
    "global_batch",
    "seq_len",
    "model",
    "data",
    "checkpoint_every",
    "keep_checkpoints",
    "max_restarts",
)
SWEEPABLE_PARALLELISM = (
    "dp",
    "tp",
    "pp",
    "cp",
    "zero_stage",
    "micro_batch_size",
    "recompute",
    "precision",
    "vp",
    "schedule",
    "compile",
    "fp8_scaling",
)
# Slurm's default MaxArraySize is 1001 (task ids 0..1000).
MAX_SWEEP_RUNS = 1000

GridValue = str | int | float | bool | dict[str, Any]


class SweepGrid(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grid: dict[str, list[GridValue]] = Field(
        min_length=1,
        description="Spec field -> the values to try; every combination is one run. Keys: "
        + ", ".join(SWEEPABLE)
        + ", or parallelism.<field>.",
    )
    max_parallel: int = Field(
        default=4,
        ge=1,
        le=MAX_SWEEP_RUNS,
        description="The job array's parallelism limit: at most this many runs at once.",
    )


class SweepSpec(RunSpec):
    """A run spec whose `sweep` section turns it into one run per grid point."""

    sweep: SweepGrid


class SweepRunOut(BaseModel):
    id: int
    index: int
    name: str
    state: RunState
    params: dict[str, Any]
    slurm_job_id: str | None
    last_step: int | None
    last_loss: float | None


class SweepOut(BaseModel):
    id: int
    name: str
    owner: str
    team: str
    state: RunState = Field(description="The sweep as a whole, from its runs' states.")
    grid: dict[str, list[Any]]
    max_parallel: int
    slurm_array_job_id: str | None = Field(description="Set once the job array is queued.")
    created_at: datetime
    submitted_at: datetime | None
    counts: dict[str, int] = Field(description="Runs per state.")
    runs: list[SweepRunOut]


class SweepPointDecision(BaseModel):
    """One grid point and what the service would decide for its run."""

    params: dict[str, Any] = Field(description="The grid point.")
    decision: RunDecision


class SweepDecision(BaseModel):
    """What the service would decide for every point of a sweep (`--dry-run`)."""

    points: list[SweepPointDecision]
    max_parallel: int = Field(description="Runs at once: the job array's %limit.")
