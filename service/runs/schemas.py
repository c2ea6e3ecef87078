"""The user-facing run spec (with `auto` and defaults) and what the API returns."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from contract import (
    Entrypoint,
    Float8Scaling,
    ModelShape,
    ParallelLayout,
    PipelineSchedule,
    Precision,
    Recompute,
    StopReason,
)
from contract.entrypoint import ProgressPattern, ScriptEnvironment, ScriptResume
from contract.run_config import SpikeRule
from planner.schemas import PlanResult
from service.clusters.choice import Unfit
from service.models import AttemptState, CheckpointState, RunState
from service.runs.goodput_figures import Goodput
from service.runs.tracking_spec import TrackingSpec


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ParallelismSpec(_Spec):
    """Any degree left out is chosen by the planner."""

    dp: int | None = Field(default=None, ge=1, le=10240)
    tp: int | None = Field(default=None, ge=1, le=8)
    pp: int | None = Field(default=None, ge=1, le=256)
    cp: int | None = Field(default=None, ge=1, le=64)
    zero_stage: int | None = Field(default=None, ge=0, le=3)
    micro_batch_size: int | None = Field(default=None, ge=1, le=4096)
    recompute: Recompute | None = None
    precision: Precision | None = None
    vp: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Virtual pipeline stages per rank (interleaved 1F1B).",
    )
    schedule: PipelineSchedule | None = None
    compile: bool | None = Field(default=None, description="torch.compile each block.")
    fp8_scaling: Float8Scaling | None = None


class FaultToleranceSpec(_Spec):
    """Replica groups for the fast recovery path (docs/design.md, "Fast recovery")."""

    replica_groups: int = Field(
        ge=1,
        le=1024,
        description="Complete model copies, each its own Slurm job; a node failure costs only "
        "its group's job, while the others keep training. 1: no replicas (classic recovery).",
    )
    min_healthy_groups: int = Field(
        default=1, ge=1, description="Groups that must keep stepping; fewer: classic recovery."
    )

    @model_validator(mode="after")
    def _enough_groups(self) -> FaultToleranceSpec:
        if self.min_healthy_groups > self.replica_groups:
            raise ValueError(
                f"min_healthy_groups ({self.min_healthy_groups}) must not exceed "
                f"replica_groups ({self.replica_groups})"
            )
        return self


class HfModelSpec(_Spec):
    """Start from a Hugging Face Llama checkpoint: its shape and its weights."""

    from_hf: str = Field(
        min_length=1,
        max_length=4096,
        description="A local folder (shared filesystem) with config.json and safetensors "
        "weights, as `save_pretrained` writes it.",
    )


class RunSpec(_Spec):
    """What a user submits (YAML for the CLI, JSON on the wire)."""

    name: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="Letters, digits, '.', '_' and '-'.",
    )
    model: str | ModelShape | HfModelSpec = Field(
        description="A preset name (tiny, llama3-1b, llama3-3b, llama3-8b, llama3-70b, "
        "llama3-405b), an explicit shape {layers, hidden, heads, kv_heads, ffn, vocab}, or "
        "{from_hf: folder} to start from a Hugging Face Llama checkpoint's weights."
    )
    cluster: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$",
        description="The Slurm cluster (ClusterName) the run must run on; left out, the "
        "service's default cluster (`runyard cluster list`).",
    )
    nodes: int = Field(ge=1, le=1280, description="Slurm nodes for each attempt.")
    gpus_per_node: int = Field(default=8, ge=1, le=8, description="Ranks per node.")
    seq_len: int = Field(ge=8, le=131072, description="Tokens per sequence.")
    global_batch: int = Field(ge=1, le=1_048_576, description="Sequences per optimizer step.")
    steps: int = Field(ge=1, le=100_000_000, description="Optimizer steps for the whole run.")
    lr: float = Field(default=3e-4, gt=0, le=1.0, description="Peak learning rate.")
    checkpoint_every: int = Field(
        default=100,
        ge=1,
        description="Steps between checkpoints. Given, it is kept; left out, it is where the "
        "run starts, and the service re-derives it while the run trains from the failures "
        "this cluster has and the run's measured save stall (Young/Daly).",
    )
    uncalibrated: bool = Field(
        default=False,
        description="Plan from the published figures alone, without this cluster's "
        "corrections from its own measured runs (`runyard plan accuracy`).",
    )
    keep_checkpoints: int = Field(default=3, ge=1, le=100, description="Committed ones kept.")
    data: str = Field(
        default="builtin",
        min_length=1,
        max_length=4096,
        description="'builtin' (the stdlib byte corpus) or a folder of token shards.",
    )
    eval_every: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="Report the loss on the data's held-out split every N steps (a dataset "
        "prepared by `runyard data prepare`); None: no evaluation.",
    )
    parallelism: Literal["auto"] | ParallelismSpec = Field(default="auto")
    min_nodes: int | None = Field(
        default=None,
        ge=1,
        le=1280,
        description="Without a spare the run may continue on this many nodes (checkpoints "
        "reshard); None: wait for a replacement.",
    )
    priority: Literal["prod", "research", "scavenger"] = Field(
        default="research",
        description="prod may preempt research and scavenger runs; research may preempt "
        "scavenger runs.",
    )
    max_restarts: int | None = Field(
        default=None, ge=0, le=100, description="Automatic re-submissions after a failure."
    )
    seed: int = Field(default=1234, ge=0, le=2**31 - 1)
    time_limit_min: int = Field(
        default=60 * 24, ge=1, le=60 * 24 * 365, description="Slurm time limit per attempt."
    )
    fault_tolerance: FaultToleranceSpec | Literal["auto"] | None = Field(
        default=None,
        description="Train as replica groups that survive a node loss without stopping: "
        "{replica_groups: G} pins their number; 'auto' lets the planner choose it with the "
        "layout (1, no groups, where they would cost more throughput than they save; also "
        "with an entrypoint or min_nodes, which exclude groups); None: one group.",
    )
    spike: SpikeRule = Field(
        default_factory=SpikeRule,
        description="When a loss or gradient-norm value is a spike, and the data a rollback "
        "past it skips (a non-finite value always rolls back).",
    )
    sdc_check_every: int | None = Field(
        default=50,
        ge=1,
        le=100_000_000,
        description="Every N steps, data-parallel replicas compare a checksum of their "
        "parameters (silent data corruption; layouts with zero_stage 0 and dp > 1, the only "
        "ones with equal copies); a mismatch drains the odd node and rolls the run back to "
        "before the last clean comparison. None: never.",
    )
    tracking: TrackingSpec | None = Field(
        default=None,
        description="Experiment trackers the service exports the run to (MLflow, W&B, "
        "TensorBoard): parameters, every step once across restarts, events, the end.",
    )
    entrypoint: Entrypoint | None = Field(
        default=None,
        description="Your own training script ({module} or {script}, and args) launched on "
        "every rank instead of runyard's trainer; it reports through worker/client.py. "
        "`model` and `parallelism` then only size the plan.",
    )
    environment: ScriptEnvironment | None = Field(
        default=None,
        description="The Python the entrypoint runs in ({python: /shared/envs/x/bin/python}): "
        "a venv or conda environment with torch and runyard_client installed, checked as the "
        "run's owner at submission; None: runyard's own. Needs an entrypoint.",
    )
    progress: ProgressPattern | None = Field(
        default=None,
        description="For a script that never imports runyard: {pattern: REGEX} with named "
        "groups step and (optional) loss, matched on rank 0's output lines; the matches are "
        "the run's progress reports. Needs an entrypoint.",
    )
    resume: ScriptResume | None = Field(
        default=None,
        description="For a script that never imports runyard: {save_flag, flag}, its own "
        "flags for the folder it saves checkpoints in and the checkpoint it resumes from; "
        "runyard passes the run's folder and the resume point, and commits the checkpoints "
        "the script completes there. Needs an entrypoint.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_grid_here(cls, data: Any) -> Any:
        if cls is RunSpec and isinstance(data, dict) and "sweep" in data:
            raise ValueError(
                "a spec with a sweep grid is a sweep: POST it to /v1/sweeps "
                "(`runyard run submit` does this for you)"
            )
        return data

    @field_validator("environment", "progress", "resume")
    @classmethod
    def _needs_an_entrypoint(cls, value: Any, info: ValidationInfo) -> Any:
        # runyard's trainer runs in runyard's environment and reports itself. An entrypoint
        # that failed its own validation is not in `data`, and is the error to read then.
        if value is not None and "entrypoint" in info.data and info.data["entrypoint"] is None:
            raise ValueError(
                "only for an entrypoint script: runyard's own trainer runs in runyard's "
                "environment and reports its own progress and checkpoints"
            )
        return value

    @model_validator(mode="after")
    def _min_nodes_fit(self) -> RunSpec:
        if self.min_nodes is not None and self.min_nodes > self.nodes:
            raise ValueError(f"min_nodes ({self.min_nodes}) must not exceed nodes ({self.nodes})")
        groups = self.replica_groups
        if groups > 1 and self.nodes % groups:
            raise ValueError(
                f"fault_tolerance.replica_groups ({groups}) must divide nodes ({self.nodes}): "
                "each group is a whole number of nodes"
            )
        if groups > 1 and self.entrypoint is not None:
            raise ValueError(
                "fault_tolerance.replica_groups needs runyard's trainer: an entrypoint "
                "script recovers from its own checkpoints (classic recovery)"
            )
        if groups > 1 and self.min_nodes is not None:
            raise ValueError(
                "fault_tolerance.replica_groups and min_nodes exclude each other: a group "
                "that lost a node waits for a spare while the others train"
            )
        return self

    @property
    def hears_stop_requests(self) -> bool:
        """Whether its ranks can save on the service's request: runyard's trainer and a
        script using runyard_client read it in their progress replies; a script read from
        its output (`progress`, `resume`) never sees them, so a stop only delays its end."""
        return self.entrypoint is None or (self.progress is None and self.resume is None)

    @property
    def replica_groups(self) -> int:
        """The pinned number of groups (1: none, or not known before planning under
        'auto': the run's config holds the plan's)."""
        ft = self.fault_tolerance
        return ft.replica_groups if isinstance(ft, FaultToleranceSpec) else 1

    @property
    def planned_replica_groups(self) -> int | None:
        """What the planner is told: the pinned count, or None under 'auto' (it chooses)."""
        if self.fault_tolerance == "auto":
            return 1 if self.entrypoint is not None or self.min_nodes is not None else None
        return self.replica_groups

    @property
    def min_healthy_groups(self) -> int:
        ft = self.fault_tolerance
        return ft.min_healthy_groups if isinstance(ft, FaultToleranceSpec) else 1


class AttemptOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    number: int
    state: AttemptState
    cluster: str = Field(default="", description="Where its job was submitted.")
    slurm_job_id: str | None
    node_list: str | None
    nodes: list[str]
    resume_step: int | None
    replica_group: int | None = Field(
        default=None, description="The replica group this attempt's job trains (None: all)."
    )
    exit_code: int | None
    end_reason: str | None = Field(description="Why it ended, in words, for people.")
    stop_reason: StopReason | None = Field(
        default=None, description="Why it stopped or ended, as a value code can act on."
    )
    stopped_for_run_id: int | None = Field(
        default=None, description="The run it yielded its nodes to (stop_reason preempted)."
    )
    do_not_retry: bool = Field(
        default=False, description="A rank reported that another attempt cannot help."
    )
    submitted_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    last_heartbeat_at: datetime | None
    first_step: int | None = None
    first_step_at: datetime | None = None


class RunOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    cluster: str = Field(default="", description="The Slurm cluster the run is on.")
    owner: str = ""
    team: str = ""
    priority: str = "research"
    state: RunState
    state_reason: str
    num_nodes: int
    gpus_per_node: int
    total_steps: int
    last_step: int | None
    last_loss: float | None
    tokens_per_s: float | None
    num_restarts: int
    max_restarts: int
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    layout: dict[str, Any] = Field(description="The resolved parallel layout.")
    model_shape: ModelShape | None = Field(
        default=None, description="The model's resolved shape (a preset or from_hf read)."
    )
    spec: dict[str, Any]
    plan: dict[str, Any] | None = Field(
        default=None, description="The planner's figures for this layout on the cluster's GPUs."
    )
    placement: dict[str, Any] | None = Field(
        default=None,
        description="Where it was placed and what that costs: leaf switches spanned, "
        "cross-switch pipeline edges.",
    )
    nodes: list[str] = Field(default_factory=list, description="Nodes the run holds now.")
    num_hardware_restarts: int = 0
    sweep_id: int | None = Field(default=None, description="The sweep this run is a point of.")
    sweep_params: dict[str, Any] | None = Field(default=None, description="Its grid point.")
    attempts: list[AttemptOut] = Field(default_factory=list)
    rollbacks: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Rollbacks past a loss spike or non-finite value (service/runs/rollback.py)"
        ": attempt, anomaly_step, message, resume_step, skip_from_step, skip_steps.",
    )
    goodput: Goodput | None = Field(default=None, description="Only on GET /v1/runs/{id}.")
    mfu: float | None = Field(
        default=None,
        description="MFU of the last reported step, in the plan's convention on its GPUs.",
    )


class ScriptPythonOut(BaseModel):
    """What the user's interpreter answered, run as the run's owner."""

    python: str = Field(description="The interpreter's path, as the spec names it.")
    python_version: str
    torch_version: str
    client_protocol: int = Field(description="Its runyard_client's PROTOCOL_VERSION.")


class ClusterPlanOut(BaseModel):
    """One cluster's plan for a spec, as the placement rule weighed it
    (service/clusters/choice.py)."""

    name: str
    hardware: str = Field(description="Its GPU type: the plan's hardware.")
    chosen: bool
    unfit: Unfit | None = Field(description="Why it cannot run the spec; None: it can.")
    why_unfit: str = Field(default="", description="The planner's or the counts' words.")
    step_time_s: float = Field(description="The plan's step time on its GPUs (0: no plan).")
    goodput: float = Field(description="The plan's goodput, a spare at every failure.")
    expected_goodput: float = Field(description="The goodput with the spares it has.")
    spares: int = Field(description="Hot spares in its pool now.")
    free_nodes: int = Field(
        description="Free healthy nodes beyond its pool's shortfall and its queued runs' need."
    )
    starts_now: bool = Field(description="free_nodes covers the spec's nodes.")
    time_per_step_s: float | None = Field(
        description="Step time over expected goodput: what the rule compares (None: unfit)."
    )


class RunDecision(BaseModel):
    """What the service decides for a spec, without creating the run (`--dry-run`)."""

    model: ModelShape = Field(description="The model's shape (a preset resolved).")
    world_size: int = Field(description="Ranks: nodes x gpus_per_node.")
    layout: ParallelLayout = Field(description="The layout the ranks would run with.")
    pinned: list[str] = Field(description="Layout fields the spec pinned; the rest were planned.")
    plan: PlanResult = Field(
        description="The planner's answer for this layout on the cluster's GPUs, as "
        "`runyard plan --json` prints it (runners-up included)."
    )
    replica_groups: int = Field(
        default=1,
        description="Replica groups the run would train as (1: none, classic recovery).",
    )
    environment: ScriptPythonOut | None = Field(
        default=None,
        description="The entrypoint's own Python as its owner ran it at this check "
        "(`environment.python`); None: runyard's.",
    )
    cluster: str = Field(default="", description="The cluster the run would run on.")
    cluster_why: str = Field(
        default="", description="Why that cluster: pinned, or the rule that chose it."
    )
    clusters: list[ClusterPlanOut] = Field(
        default_factory=list,
        description="Each cluster's plan for the spec, when several were weighed or one was "
        "pinned (empty: one cluster configured).",
    )


class RunList(BaseModel):
    items: list[RunOut]
    total: int


class CheckpointOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    attempt_id: int
    step: int
    path: str
    state: CheckpointState
    num_bytes: int | None
    write_s: float | None
    created_at: datetime
    committed_at: datetime | None


class RunEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    attempt_id: int | None
    kind: str
    message: str
    data: dict[str, Any]
    created_at: datetime


class MetricOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    attempt_id: int
    step: int
    loss: float
    tokens_per_s: float | None
    step_time_s: float | None
    lr: float | None = Field(default=None, description="The learning rate the step used.")
    recorded_at: datetime
