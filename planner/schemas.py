"""The planner's answer as the API and the CLI print it (`runyard plan --json`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MFU_CONVENTION = (
    "model FLOPs per token = 6N + 12 x layers x hidden x seq (dense, non-causal; N = weights "
    "that take part in matrix products, i.e. all but the input embedding), divided by the "
    "hardware's dense BF16 peak, also for FP8 runs (Chowdhery et al. 2022, PaLM, App. B)"
)


class _Out(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PlannedLayout(_Out):
    """The parallel layout, in the worker's terms."""

    dp: int = Field(description="Data-parallel replicas (or shards, with ZeRO).")
    tp: int = Field(description="Tensor-parallel degree, inside one node (sequence parallel on).")
    pp: int = Field(description="Pipeline stages.")
    cp: int = Field(description="Context-parallel degree over the sequence.")
    vp: int = Field(description="Virtual pipeline stages per rank (interleaved 1F1B).")
    zero_stage: int = Field(description="0 DDP, 1 optimizer, 2 + gradients, 3 + weights (FSDP).")
    micro_batch_size: int = Field(description="Sequences per rank per micro step.")
    grad_accum: int = Field(description="Micro steps per optimizer step.")
    recompute: str = Field(description="Activation recomputation: none, selective or full.")
    precision: str = Field(description="bf16, or fp8 for the linear layers.")


class MemoryGiB(_Out):
    """Peak memory per GPU on the busiest pipeline stage, GiB."""

    params: float
    grads: float
    optimizer: float
    activations: float
    overhead: float = Field(description="CUDA context, workspaces, NCCL buffers, fragmentation.")
    total: float
    capacity: float = Field(description="What the GPU has.")


class StepBreakdown(_Out):
    """Seconds of one step by cause; they add up to step_time_s."""

    compute_s: float
    tp_comm_s: float
    cp_comm_s: float
    bubble_s: float
    pp_comm_s: float
    dp_comm_s: float
    optimizer_s: float


class CheckpointPlan(_Out):
    """Checkpoint size, how long a write takes, and how often to write."""

    size_gib: float
    write_s: float
    stall_s: float = Field(
        default=0.0,
        description="What each save costs training: its blocking time plus the slowdown of "
        "the steps beside it, the cost Young/Daly weighs (the rest of the write overlaps).",
    )
    interval_s: float = Field(description="Training time between checkpoints (Young/Daly).")
    interval_steps: int
    fast_interval_s: float | None = Field(
        default=None,
        description="The same on the fast recovery path, where disk checkpoints serve only "
        "its classic fallbacks (Daly's for their rate, at most an hour); None without it.",
    )
    fast_interval_steps: int | None = None


class StepTerms(_Out):
    """The published-figure model's step split by kind of term, overlap included: what a
    cluster's calibration fits its factors against (planner/calibration.py)."""

    compute_s: float
    communication_s: float


class CalibrationApplied(_Out):
    """The cluster's own corrections this plan applied, and the history behind them."""

    applied: bool = Field(description="False: too little history; the published figures.")
    summary: str = Field(description="One line: what was corrected, by how much, from what.")
    compute: float = 1.0
    communication: float = 1.0
    checkpoint: float = 1.0
    restart_s: float | None = None
    num_runs: int = Field(default=0, description="Measured runs the step factors come from.")
    per_term: bool = Field(default=False, description="Compute and communication fitted apart.")
    num_checkpoint_runs: int = Field(default=0, description="Runs the checkpoint factor is from.")
    num_recoveries: int = Field(default=0, description="Recoveries the restart time is from.")
    hardware: str | None = Field(default=None, description="The GPU type of that history.")


class Alternative(_Out):
    """A runner-up layout, for comparison with the best."""

    layout: PlannedLayout
    step_time_s: float
    tokens_per_s: float
    mfu: float
    memory_gib_per_gpu: float


class DeclinedSplit(_Out):
    """The best split into replica groups that `fault_tolerance: auto` turned down."""

    replica_groups: int
    layout: PlannedLayout
    step_time_s: float = Field(description="Its step: ZeRO sharded only inside a group.")
    goodput_fast: float = Field(description="Its goodput on the fast recovery path.")
    throughput_ratio: float = Field(
        description="Its expected throughput (tokens/s x goodput) over the chosen plan's."
    )


class PlanResult(_Out):
    """Everything the planner knows about the best layout for a run."""

    hardware: str
    network: str
    num_gpus: int
    gpus_per_node: int
    seq_len: int
    global_batch_tokens: int
    num_params: int
    layout: PlannedLayout
    memory_gib_per_gpu: MemoryGiB
    step_time_s: float
    step_breakdown_s: StepBreakdown
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float = Field(description=MFU_CONVENTION)
    tflops_per_gpu: float = Field(description="Model TFLOP/s per GPU in the MFU convention.")
    mtbi_h: float = Field(description="Mean time between interruptions of the whole run.")
    checkpoint: CheckpointPlan
    goodput: float = Field(description="Expected productive share of allocated time.")
    goodput_fast: float | None = Field(
        default=None,
        description="The same with the fast recovery path (replica groups healing from a "
        "live peer); None when the nodes cannot be split into the groups.",
    )
    fast_replica_groups: int = Field(default=0, description="Replica groups goodput_fast assumes.")
    declined_split: DeclinedSplit | None = Field(
        default=None,
        description="With fault_tolerance auto and no groups chosen: the best split the "
        "planner costed (None if no layout it costed could be split and still fit).",
    )
    no_groups_because: str | None = Field(
        default=None,
        description="With fault_tolerance auto and no groups chosen: why, in one sentence.",
    )
    lost_s_per_interruption: dict[str, float] = Field(
        default_factory=dict,
        description="Whole-run seconds lost per interruption, by recovery path.",
    )
    spare_nodes: int = Field(description="Hot spares for P(run out during a repair) < 1 %.")
    runners_up: list[Alternative]
    rejected: dict[str, int] = Field(description="Layouts not chosen, counted by reason.")
    rejected_examples: dict[str, str] = Field(description="One example sentence per reason.")
    mfu_convention: str = MFU_CONVENTION
    calibration: CalibrationApplied | None = Field(
        default=None,
        description="The cluster's corrections from its own measured runs; None when none "
        "were asked for (`--uncalibrated`, or a plan made without the cluster's history).",
    )
    uncalibrated_step_time_s: float | None = Field(
        default=None, description="The same layout's step time from the published figures."
    )
    step_terms_s: StepTerms | None = Field(
        default=None, description="The published-figure step split into compute and comms."
    )
