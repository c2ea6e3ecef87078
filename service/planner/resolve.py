"""Turn a run spec's `auto` parallelism into a concrete layout, or refuse with the reason.

The full layout search (memory, step time, reliability) is the planner's job; this resolves
what the worker can run today and names the field that is wrong when it cannot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.config import ModelShape, ParallelLayout, Precision, Recompute

if TYPE_CHECKING:
    from service.runs.schemas import ParallelismSpec

MAX_AUTO_MICRO_BATCH = 8


class LayoutError(ValueError):
    """A spec that cannot be laid out; `field` names the spec field to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def resolve_layout(
    *,
    shape: ModelShape,
    world_size: int,
    global_batch: int,
    pinned: ParallelismSpec | None,
    default_precision: Precision = Precision.FP32,
) -> ParallelLayout:
    """A layout for `world_size` ranks honouring every degree pinned in the spec."""
    tp = (pinned and pinned.tp) or 1
    pp = (pinned and pinned.pp) or 1
    cp = (pinned and pinned.cp) or 1
    if world_size % (tp * pp * cp):
        raise LayoutError(
            "parallelism",
            f"tp x pp x cp = {tp * pp * cp} does not divide the {world_size} ranks "
            "(nodes x gpus_per_node)",
        )
    dp = (pinned and pinned.dp) or world_size // (tp * pp * cp)
    if dp * tp * pp * cp != world_size:
        raise LayoutError(
            "parallelism.dp",
            f"dp x tp x pp x cp = {dp * tp * pp * cp} but the run has {world_size} ranks "
            "(nodes x gpus_per_node)",
        )
    if shape.kv_heads % tp:
        raise LayoutError(
            "parallelism.tp", f"tp ({tp}) must divide the model's kv_heads ({shape.kv_heads})"
        )
    if shape.layers % pp:
        raise LayoutError(
            "parallelism.pp", f"pp ({pp}) must divide the model's layers ({shape.layers})"
        )
    if global_batch % dp:
        raise LayoutError(
            "global_batch", f"global_batch ({global_batch}) must be divisible by dp ({dp})"
        )
    per_rank = global_batch // dp
    micro = (pinned and pinned.micro_batch_size) or _largest_divisor_at_most(
        per_rank, MAX_AUTO_MICRO_BATCH
    )
    if per_rank % micro:
        raise LayoutError(
            "parallelism.micro_batch_size",
            f"micro_batch_size ({micro}) must divide global_batch / dp ({per_rank})",
        )
    layout = ParallelLayout(
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        zero_stage=(pinned and pinned.zero_stage) or 0,
        micro_batch_size=micro,
        recompute=(pinned and pinned.recompute) or Recompute.NONE,
        precision=(pinned and pinned.precision) or default_precision,
    )
    unsupported = [f"{n}={v}" for n, v in (("tp", tp), ("pp", pp), ("cp", cp)) if v > 1]
    if layout.zero_stage:
        unsupported.append(f"zero_stage={layout.zero_stage}")
    if unsupported:
        raise LayoutError(
            "parallelism",
            f"{', '.join(unsupported)} is not supported by this worker yet; "
            "use DDP (tp=pp=cp=1, zero_stage=0)",
        )
    return layout
