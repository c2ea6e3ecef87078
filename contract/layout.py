"""The one parallel layout type and the one rule set that says which layouts can run.

The planner's search prunes with `degree_problems` and `schedule_problems`, the API refuses
a spec with `layout_problems`, and the worker checks the same list before its first
collective, so a layout the planner picks is one the worker runs. The checks take plain
integers: the search calls them on hundreds of thousands of candidates without building a
pydantic model for each.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from pydantic import Field, model_validator

from ._frozen import Frozen
from .model_shape import ModelShape


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


class ParallelLayout(Frozen):
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


class ProblemKind(StrEnum):
    """Why a layout cannot run: the planner counts its rejections by these."""

    INDIVISIBLE = "indivisible"  # a degree does not divide what it must split
    UNSUPPORTED = "unsupported"  # a combination the worker's parallel code does not run


@dataclass(frozen=True, slots=True)
class LayoutProblem:
    """One reason a layout cannot run; `field` is the layout field to change."""

    field: str
    message: str
    kind: ProblemKind


class LayoutDegrees(Protocol):
    """What the rules read of a layout: the contract's ParallelLayout and the planner's
    slotted search candidates both have these."""

    @property
    def dp(self) -> int: ...
    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def cp(self) -> int: ...
    @property
    def vp(self) -> int: ...
    @property
    def zero_stage(self) -> int: ...
    @property
    def micro_batch_size(self) -> int: ...


def degree_problems(
    shape: ModelShape, seq_len: int, *, tp: int, cp: int, pp: int, gpus_per_node: int | None
) -> list[LayoutProblem]:
    """The rules that depend on the model-parallel degrees alone; `gpus_per_node` None when
    the caller does not know the node size (a worker checks its own allocation)."""
    problems: list[LayoutProblem] = []
    # Tensor parallel splits heads, kv heads, the MLP width and the vocabulary across ranks;
    # the vocabulary as padded (ModelShape.padded_vocab), which every tp in a node divides.
    for name, size in (
        ("heads", shape.heads),
        ("kv_heads", shape.kv_heads),
        ("ffn", shape.ffn),
        ("padded vocab", shape.padded_vocab),
    ):
        if size % tp:
            problems.append(
                LayoutProblem(
                    "tp",
                    f"tp ({tp}) must divide the model's {name} ({size})",
                    ProblemKind.INDIVISIBLE,
                )
            )
    if gpus_per_node is not None and tp > gpus_per_node:
        # Tensor parallel's per-layer all-reduces need NVLink; across nodes it is too slow
        # to be worth running (Megatron-LM keeps tp inside a node, Narayanan et al. 2021).
        problems.append(
            LayoutProblem(
                "tp",
                f"tp ({tp}) must stay inside one node ({gpus_per_node} ranks per node)",
                ProblemKind.UNSUPPORTED,
            )
        )
    if pp > shape.layers:
        problems.append(
            LayoutProblem(
                "pp",
                f"pp ({pp}) exceeds the model's {shape.layers} layers",
                ProblemKind.INDIVISIBLE,
            )
        )
    # Load-balanced causal context parallel cuts the sequence into 2 x cp chunks; sequence
    # parallel then cuts each rank's share by tp.
    if cp > 1 and seq_len % (2 * cp):
        problems.append(
            LayoutProblem(
                "cp",
                f"seq_len ({seq_len}) must divide into 2 x cp ({2 * cp}) chunks",
                ProblemKind.INDIVISIBLE,
            )
        )
    elif tp > 1 and (seq_len // cp) % tp:
        problems.append(
            LayoutProblem(
                "tp",
                f"seq_len / cp ({seq_len // cp}) must be divisible by tp ({tp}) "
                "for sequence parallel",
                ProblemKind.INDIVISIBLE,
            )
        )
    return problems


def schedule_problems(
    shape: ModelShape,
    global_batch: int,
    *,
    dp: int,
    pp: int,
    vp: int,
    micro_batch_size: int,
    zero_stage: int,
) -> list[LayoutProblem]:
    """The rules on batching, the pipeline schedule and sharding."""
    problems: list[LayoutProblem] = []
    # Every virtual stage holds at least one block; uneven splits are allowed (pipeline.py).
    if pp * vp > shape.layers:
        problems.append(
            LayoutProblem(
                "pp",
                f"pp x vp ({pp * vp}) exceeds the model's {shape.layers} layers",
                ProblemKind.INDIVISIBLE,
            )
        )
    if vp > 1 and pp == 1:
        problems.append(LayoutProblem("vp", f"vp ({vp}) > 1 needs pp > 1", ProblemKind.INDIVISIBLE))
    per_step = dp * micro_batch_size
    if global_batch % per_step:
        problems.append(
            LayoutProblem(
                "micro_batch_size",
                f"global_batch ({global_batch}) must be divisible by dp x micro_batch_size "
                f"({per_step})",
                ProblemKind.INDIVISIBLE,
            )
        )
    else:
        micro_batches = global_batch // per_step
        if pp > 1 and vp == 1 and micro_batches < pp:
            problems.append(
                LayoutProblem(
                    "pp",
                    f"1F1B needs at least pp ({pp}) micro batches per step, but global_batch / "
                    f"(dp x micro_batch_size) is {micro_batches}",
                    ProblemKind.UNSUPPORTED,
                )
            )
        if vp > 1 and micro_batches % pp:
            problems.append(
                LayoutProblem(
                    "vp",
                    f"interleaved 1F1B needs micro batches per step ({micro_batches}) "
                    f"divisible by pp ({pp})",
                    ProblemKind.INDIVISIBLE,
                )
            )
    if zero_stage == 3 and pp > 1:
        problems.append(
            LayoutProblem(
                "zero_stage",
                "zero_stage 3 with pp > 1 keeps parameters gathered across micro batches; "
                "use zero_stage 1 or 2",
                ProblemKind.UNSUPPORTED,
            )
        )
    return problems


def layout_problems(
    shape: ModelShape,
    layout: LayoutDegrees,
    seq_len: int,
    global_batch: int,
    gpus_per_node: int | None = None,
) -> list[LayoutProblem]:
    """Every reason the worker cannot run `layout` for this model and batch; empty when it
    can. One list for every side: the planner prunes with it, the service refuses a spec
    with it at submission, the worker checks it before its first collective."""
    return degree_problems(
        shape, seq_len, tp=layout.tp, cp=layout.cp, pp=layout.pp, gpus_per_node=gpus_per_node
    ) + schedule_problems(
        shape,
        global_batch,
        dp=layout.dp,
        pp=layout.pp,
        vp=layout.vp,
        micro_batch_size=layout.micro_batch_size,
        zero_stage=layout.zero_stage,
    )
