"""resolve_layout: every parallelism the worker runs is resolved; what it cannot run is
refused at submission, naming the spec field to change (pure functions, no database)."""

from __future__ import annotations

from typing import Any

import pytest

from contract import ModelShape, ParallelLayout, PipelineSchedule, WorkerRunConfig
from planner.resolve import LayoutError, resolve_layout
from service.runs.schemas import ParallelismSpec

# Llama-style and small: 8 layers, 8 heads over 4 kv heads, everything divisible by 4.
SHAPE = ModelShape(layers=8, hidden=256, heads=8, kv_heads=4, ffn=512, vocab=512)


def resolve(
    world_size: int = 8, global_batch: int = 16, seq_len: int | None = 1024, **pins: Any
) -> ParallelLayout:
    return resolve_layout(
        shape=SHAPE,
        world_size=world_size,
        global_batch=global_batch,
        pinned=ParallelismSpec(**pins) if pins else None,
        seq_len=seq_len,
    )


def test_auto_is_data_parallel_over_every_rank() -> None:
    layout = resolve()
    assert (layout.dp, layout.tp, layout.pp, layout.cp, layout.zero_stage) == (8, 1, 1, 1, 0)
    assert layout.micro_batch_size == 2  # the whole per-rank share: no accumulation


@pytest.mark.parametrize(
    ("pins", "expected"),
    [
        ({"tp": 2}, {"dp": 4, "tp": 2}),
        ({"tp": 4, "pp": 2}, {"dp": 1, "tp": 4, "pp": 2}),
        ({"cp": 2, "tp": 2}, {"dp": 2, "cp": 2, "tp": 2}),
        ({"zero_stage": 3}, {"dp": 8, "zero_stage": 3}),
        ({"zero_stage": 1, "recompute": "selective"}, {"dp": 8, "zero_stage": 1}),
        ({"pp": 2, "tp": 2, "zero_stage": 2}, {"dp": 2, "pp": 2, "zero_stage": 2}),
    ],
)
def test_pinned_degrees_are_honoured(pins: dict[str, Any], expected: dict[str, int]) -> None:
    layout = resolve(**pins)
    for name, value in expected.items():
        assert getattr(layout, name) == value, name
    assert layout.world_size == 8


def test_auto_micro_batch_leaves_a_pipeline_enough_micro_batches() -> None:
    # dp 4 x pp 2: 4 sequences per rank. Micro batch 4 would leave 1 micro batch, fewer
    # than the 2 stages 1F1B needs in flight; 2 leaves 2.
    layout = resolve(pp=2)
    assert (layout.dp, layout.micro_batch_size) == (4, 2)
    assert layout.schedule is PipelineSchedule.ONE_F_ONE_B


def test_uneven_pipeline_split_is_allowed() -> None:
    """3 stages over 8 layers: 3 + 3 + 2 blocks (see worker/parallel/pipeline.py)."""
    layout = resolve(world_size=3, global_batch=6, pp=3)
    assert (layout.pp, layout.micro_batch_size) == (3, 2)


@pytest.mark.parametrize(
    ("world_size", "global_batch", "seq_len", "pins", "field", "words"),
    [
        (8, 16, 1024, {"tp": 3}, "parallelism", "does not divide the 8 ranks"),
        (8, 16, 1024, {"dp": 2}, "parallelism.dp", "the run has 8 ranks"),
        (8, 12, 1024, {"dp": 8}, "global_batch", "divisible by dp (8)"),
        (8, 16, 1024, {"micro_batch_size": 3}, "parallelism.micro_batch_size", "must divide"),
        (8, 16, 1024, {"tp": 8}, "parallelism.tp", "must divide the model's kv_heads (4)"),
        (16, 16, 1024, {"pp": 16}, "parallelism.pp", "exceeds the model's 8 layers"),
        # pp 4 x dp 2 with micro batch 8: one micro batch per step, 1F1B needs 4.
        (8, 16, 1024, {"pp": 4, "micro_batch_size": 8}, "parallelism.pp", "at least pp (4)"),
        (8, 16, 1002, {"cp": 2}, "parallelism.cp", "2 x cp (4) chunks"),
        (8, 16, 1028, {"cp": 2, "tp": 4}, "parallelism.tp", "(514) must be divisible by tp (4)"),
    ],
)
def test_layouts_the_worker_cannot_run_are_refused_naming_the_field(
    world_size: int,
    global_batch: int,
    seq_len: int,
    pins: dict[str, Any],
    field: str,
    words: str,
) -> None:
    with pytest.raises(LayoutError) as refused:
        resolve(world_size, global_batch, seq_len, **pins)
    assert refused.value.field == field
    assert words in refused.value.message, refused.value.message


def test_every_resolved_layout_is_a_valid_worker_config() -> None:
    """What the service resolves, the worker accepts (the service builds this at attempt time,
    where a refusal would come far too late)."""
    for pins in ({}, {"tp": 2, "pp": 2}, {"cp": 4}, {"zero_stage": 3, "pp": 8}):
        layout = resolve(**pins)
        WorkerRunConfig(
            run_id=1, attempt_id=1, attempt_number=1, name="x", model=SHAPE, layout=layout,
            seq_len=1024, global_batch=16, steps=10, lr=1e-3, checkpoint_every=5,
            checkpoint_dir="/tmp/x", data_cache_dir="/tmp/d",
        )  # fmt: skip


def test_the_worker_contract_refuses_a_schedule_that_does_not_match_vp() -> None:
    with pytest.raises(ValueError, match="vp \\(2\\) > 1 needs schedule interleaved_1f1b"):
        ParallelLayout(pp=2, vp=2)
    with pytest.raises(ValueError, match="needs pp >= 2 and vp >= 2"):
        ParallelLayout(pp=2, schedule="interleaved_1f1b")
    assert ParallelLayout(pp=2, vp=2, schedule="interleaved_1f1b").vp == 2
