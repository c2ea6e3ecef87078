"""Turn a run spec's `auto` parallelism into a concrete layout, or refuse with the reason.

The full layout search (memory, step time, reliability) is the planner's job; this fills in
what the spec left out and checks the result against the worker's layout contract
(`worker.config.layout_problems`, the same rules the worker applies before training), so a
spec that no worker could run is refused at submission with the field to change, never
discovered by a rank on the cluster.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from contract import (
    ModelShape,
    ParallelLayout,
    PipelineSchedule,
    Precision,
    Recompute,
    layout_problems,
)

if TYPE_CHECKING:
    from service.runs.schemas import ParallelismSpec

MAX_AUTO_MICRO_BATCH = 8


class LayoutError(ValueError):
    """A spec that cannot be laid out; `field` names the spec field to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _pinned(pinned: ParallelismSpec | None, name: str) -> Any:
    """A pinned value, or None. Read by name with a default: vp, schedule and compile flow
    through as soon as the API's ParallelismSpec gains them."""
    return getattr(pinned, name, None) if pinned is not None else None


def _auto_micro_batch(per_rank: int, pp: int, vp: int) -> int:
    """The largest micro batch (up to MAX_AUTO_MICRO_BATCH) that divides the rank's share of
    the batch and leaves a pipeline enough micro batches: 1F1B needs at least pp of them,
    interleaved 1F1B a multiple of pp. 1 if none does (the contract check then says why)."""
    for size in range(min(per_rank, MAX_AUTO_MICRO_BATCH), 0, -1):
        if per_rank % size:
            continue
        micro_batches = per_rank // size
        if pp == 1 or (micro_batches >= pp and (vp == 1 or micro_batches % pp == 0)):
            return size
    return 1


def resolve_layout(
    *,
    shape: ModelShape,
    world_size: int,
    global_batch: int,
    pinned: ParallelismSpec | None,
    default_precision: Precision = Precision.FP32,
    seq_len: int | None = None,
) -> ParallelLayout:
    """A layout for `world_size` ranks honouring every degree pinned in the spec.

    `seq_len`, when given, also checks what context and sequence parallel need of it
    (2 x cp chunks, each divisible by tp); the planner's admission checks it too.
    """
    tp: int = _pinned(pinned, "tp") or 1
    pp: int = _pinned(pinned, "pp") or 1
    cp: int = _pinned(pinned, "cp") or 1
    vp: int = _pinned(pinned, "vp") or 1
    if world_size % (tp * pp * cp):
        raise LayoutError(
            "parallelism",
            f"tp x pp x cp = {tp * pp * cp} does not divide the {world_size} ranks "
            "(nodes x gpus_per_node)",
        )
    dp: int = _pinned(pinned, "dp") or world_size // (tp * pp * cp)
    if dp * tp * pp * cp != world_size:
        raise LayoutError(
            "parallelism.dp",
            f"dp x tp x pp x cp = {dp * tp * pp * cp} but the run has {world_size} ranks "
            "(nodes x gpus_per_node)",
        )
    if global_batch % dp:
        raise LayoutError(
            "global_batch", f"global_batch ({global_batch}) must be divisible by dp ({dp})"
        )
    per_rank = global_batch // dp
    micro: int = _pinned(pinned, "micro_batch_size") or _auto_micro_batch(per_rank, pp, vp)
    if per_rank % micro:
        raise LayoutError(
            "parallelism.micro_batch_size",
            f"micro_batch_size ({micro}) must divide global_batch / dp ({per_rank})",
        )
    schedule = _pinned(pinned, "schedule") or (
        PipelineSchedule.INTERLEAVED_1F1B if vp > 1 else PipelineSchedule.ONE_F_ONE_B
    )
    try:
        layout = ParallelLayout(
            dp=dp,
            tp=tp,
            pp=pp,
            cp=cp,
            vp=vp,
            schedule=schedule,
            zero_stage=_pinned(pinned, "zero_stage") or 0,
            micro_batch_size=micro,
            recompute=_pinned(pinned, "recompute") or Recompute.NONE,
            precision=_pinned(pinned, "precision") or default_precision,
            compile=bool(_pinned(pinned, "compile")),
        )
    except ValidationError as exc:  # the schedule's own rules (vp and schedule disagree)
        message = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise LayoutError("parallelism.schedule", message) from exc
    # The contract's seq_len checks run only when the caller knows it; a stand-in that
    # satisfies them otherwise.
    check_seq_len = seq_len if seq_len is not None else 2 * cp * tp
    problems = layout_problems(shape, layout, check_seq_len, global_batch)
    if problems:
        field, message = problems[0]
        raise LayoutError(f"parallelism.{field}", message)
    return layout
