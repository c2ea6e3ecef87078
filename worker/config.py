"""The resolved run config: the contract between the service and every worker rank.

The user-facing run spec (with `auto` and defaults) belongs to the service's API
(`service/runs/schemas.py`); what the planner resolves it into lives here, because the
worker must be able to read it without importing the service, and the service must be
able to build it without importing torch.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Precision(StrEnum):
    """Numeric format of the training math."""

    FP32 = "fp32"  # CPU tests and the dev cluster
    BF16 = "bf16"  # mixed precision on GPUs
    FP8 = "fp8"  # H100/H200 linear layers, BF16 elsewhere


class Recompute(StrEnum):
    """Activation recomputation, trading FLOPs for memory."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class PipelineSchedule(StrEnum):
    """Order of micro-batch forwards and backwards across pipeline stages."""

    ONE_F_ONE_B = "1f1b"  # one stage per rank; pp micro batches in flight
    INTERLEAVED_1F1B = "interleaved_1f1b"  # vp stages per rank: a smaller bubble, more sends


class Float8Scaling(StrEnum):
    """How torchao's float8 training scales tensors before the FP8 GEMMs."""

    TENSORWISE = "tensorwise"  # one scale per tensor: fastest
    ROWWISE = "rowwise"  # one scale per row: more accurate, a little slower


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelShape(_Frozen):
    """A dense Llama-style decoder."""

    layers: int = Field(ge=1, le=1024, description="Transformer blocks.")
    hidden: int = Field(ge=8, le=65536, description="Model width (d_model).")
    heads: int = Field(ge=1, le=1024, description="Query heads.")
    kv_heads: int = Field(ge=1, le=1024, description="Key/value heads (GQA groups).")
    ffn: int = Field(ge=8, le=262144, description="MLP inner width.")
    vocab: int = Field(ge=2, le=1_048_576, description="Vocabulary size.")
    mlp: Literal["swiglu", "gelu"] = Field(
        default="swiglu", description="swiglu: gate/up/down (3 matrices); gelu: up/down (2)."
    )
    rope_theta: float = Field(default=500_000.0, gt=0, description="RoPE base frequency.")
    norm_eps: float = Field(default=1e-5, gt=0, description="RMSNorm epsilon.")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelShape:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})"
            )
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def num_params(self) -> int:
        """Parameter count (untied input and output embeddings)."""
        kv_dim = self.kv_heads * self.head_dim
        attention = self.hidden * (self.hidden + 2 * kv_dim) + self.hidden * self.hidden
        mlp = (3 if self.mlp == "swiglu" else 2) * self.hidden * self.ffn
        norms = 2 * self.hidden
        return self.layers * (attention + mlp + norms) + 2 * self.vocab * self.hidden + self.hidden


class ParallelLayout(_Frozen):
    """How the world is cut: dp x cp x pp x tp ranks, plus sharding and batching."""

    dp: int = Field(default=1, ge=1, description="Data-parallel replicas (or shards).")
    tp: int = Field(default=1, ge=1, description="Tensor-parallel degree, inside one node.")
    pp: int = Field(default=1, ge=1, description="Pipeline stages.")
    cp: int = Field(default=1, ge=1, description="Context-parallel degree over the sequence.")
    zero_stage: int = Field(default=0, ge=0, le=3, description="0 DDP, 1/2 ZeRO, 3 FSDP.")
    micro_batch_size: int = Field(default=1, ge=1, description="Sequences per rank per micro step.")
    recompute: Recompute = Field(default=Recompute.NONE, description="Activation recompute.")
    precision: Precision = Field(default=Precision.FP32, description="Numeric format.")
    schedule: PipelineSchedule = Field(
        default=PipelineSchedule.ONE_F_ONE_B, description="Pipeline schedule (pp > 1 only)."
    )
    vp: int = Field(
        default=1, ge=1, description="Virtual pipeline stages per rank (interleaved_1f1b: >= 2)."
    )
    compile: bool = Field(default=False, description="torch.compile each transformer block.")
    fp8_scaling: Float8Scaling = Field(
        default=Float8Scaling.TENSORWISE, description="Float8 scaling (precision fp8 only)."
    )

    @model_validator(mode="after")
    def _schedule_matches(self) -> ParallelLayout:
        if self.schedule is PipelineSchedule.INTERLEAVED_1F1B and (self.pp < 2 or self.vp < 2):
            raise ValueError(
                f"schedule interleaved_1f1b needs pp >= 2 and vp >= 2 (got pp {self.pp}, "
                f"vp {self.vp}); use schedule 1f1b otherwise"
            )
        if self.schedule is PipelineSchedule.ONE_F_ONE_B and self.vp > 1:
            raise ValueError(f"vp ({self.vp}) > 1 needs schedule interleaved_1f1b")
        return self

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


def layout_problems(
    shape: ModelShape, layout: ParallelLayout, seq_len: int, global_batch: int
) -> list[tuple[str, str]]:
    """Every reason the worker cannot run `layout` for this model and batch, as
    (layout field, message) pairs; empty when it can. One list for both sides: the service
    refuses a spec with it at submission, the worker before its first collective."""
    problems: list[tuple[str, str]] = []
    tp, pp, cp, vp = layout.tp, layout.pp, layout.cp, layout.vp
    # Tensor parallel splits heads, kv heads, the MLP width and the vocabulary across ranks.
    for name, size in (
        ("heads", shape.heads),
        ("kv_heads", shape.kv_heads),
        ("ffn", shape.ffn),
        ("vocab", shape.vocab),
    ):
        if size % tp:
            problems.append(("tp", f"tp ({tp}) must divide the model's {name} ({size})"))
    # Every virtual stage holds at least one block; uneven splits are allowed (see pipeline.py).
    if pp * vp > shape.layers:
        problems.append(("pp", f"pp x vp ({pp * vp}) exceeds the model's {shape.layers} layers"))
    per_step = layout.dp * layout.micro_batch_size
    if global_batch % per_step:
        problems.append(
            (
                "micro_batch_size",
                f"global_batch ({global_batch}) must be divisible by dp x micro_batch_size "
                f"({per_step})",
            )
        )
    else:
        micro_batches = global_batch // per_step
        if pp > 1 and vp == 1 and micro_batches < pp:
            problems.append(
                (
                    "pp",
                    f"1F1B needs at least pp ({pp}) micro batches per step, but global_batch / "
                    f"(dp x micro_batch_size) is {micro_batches}",
                )
            )
        if vp > 1 and micro_batches % pp:
            problems.append(
                (
                    "vp",
                    f"interleaved 1F1B needs micro batches per step ({micro_batches}) divisible "
                    f"by pp ({pp})",
                )
            )
    # Load-balanced causal context parallel cuts the sequence into 2 x cp chunks; sequence
    # parallel then cuts each rank's share by tp.
    if cp > 1 and seq_len % (2 * cp):
        problems.append(("cp", f"seq_len ({seq_len}) must divide into 2 x cp ({2 * cp}) chunks"))
    elif tp > 1 and (seq_len // cp) % tp:
        problems.append(
            (
                "tp",
                f"seq_len / cp ({seq_len // cp}) must be divisible by tp ({tp}) "
                "for sequence parallel",
            )
        )
    return problems


class ResumePoint(_Frozen):
    """The newest COMMITTED checkpoint a new attempt starts from."""

    step: int = Field(ge=0, description="Optimizer steps completed when it was saved.")
    path: str = Field(description="Checkpoint folder (holds the DCP files and the marker).")


class WorkerRunConfig(_Frozen):
    """Everything one rank needs to train its part of one attempt of a run."""

    run_id: int = Field(description="Service id of the run.")
    attempt_id: int = Field(description="Service id of this attempt (one Slurm allocation).")
    attempt_number: int = Field(ge=1, description="1 for the first attempt, then 2, 3, ...")
    name: str = Field(description="Run name, for logs.")
    model: ModelShape
    layout: ParallelLayout
    seq_len: int = Field(ge=8, description="Tokens per sequence.")
    global_batch: int = Field(ge=1, description="Sequences per optimizer step, all ranks.")
    steps: int = Field(ge=1, description="Optimizer steps for the whole run.")
    lr: float = Field(gt=0, description="Peak learning rate (AdamW).")
    warmup_steps: int = Field(default=10, ge=0, description="Linear warm-up, then cosine.")
    weight_decay: float = Field(default=0.1, ge=0)
    grad_clip: float = Field(default=1.0, gt=0, description="Global gradient-norm clip.")
    seed: int = Field(default=1234, description="Seed for weights and data order.")
    checkpoint_every: int = Field(ge=1, description="Save a checkpoint every N steps.")
    checkpoint_dir: str = Field(description="This run's checkpoint folder (shared filesystem).")
    keep_checkpoints: int = Field(default=3, ge=1, description="Committed checkpoints kept.")
    data: str = Field(default="builtin", description="'builtin' or a folder of token shards.")
    data_cache_dir: str = Field(description="Where the builtin corpus is packed into shards.")
    resume_from: ResumePoint | None = Field(default=None, description="None: start fresh.")
    report_interval_s: float = Field(default=2.0, gt=0, description="Progress report period.")

    @model_validator(mode="after")
    def _layout_fits(self) -> WorkerRunConfig:
        problems = layout_problems(self.model, self.layout, self.seq_len, self.global_batch)
        if problems:
            raise ValueError("; ".join(f"layout.{field}: {text}" for field, text in problems))
        return self

    @property
    def grad_accum(self) -> int:
        return self.global_batch // (self.layout.dp * self.layout.micro_batch_size)

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.checkpoint_dir)


class ExitCode:
    """Worker exit codes the service acts on (exit codes alone lie: see docs)."""

    OK = 0
    RETRYABLE = 1  # anything unexpected: hardware, network, a killed peer
    DO_NOT_RETRY = 3  # bad spec or a code bug: recovery must not burn spares on it
