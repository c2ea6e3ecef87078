"""resolve_layout: every degree the spec leaves out comes from the planner's search, every
pinned one stays; what the worker cannot run is refused at submission, naming the spec field
to change (pure functions, no database)."""

from __future__ import annotations

from typing import Any

import pytest

from contract import (
    Float8Scaling,
    ModelShape,
    ParallelLayout,
    PipelineSchedule,
    Precision,
    WorkerRunConfig,
    layout_problems,
)
from planner.plan import plan
from planner.resolve import LayoutError, resolve_layout
from service.runs.schemas import ParallelismSpec

# Llama-style and small: 8 layers, 8 heads over 4 kv heads, everything divisible by 4.
SHAPE = ModelShape(layers=8, hidden=256, heads=8, kv_heads=4, ffn=512, vocab=512)


HARDWARE, NETWORK = "h100-sxm", "ib"


def resolve(
    world_size: int = 8,
    global_batch: int = 16,
    seq_len: int = 1024,
    gpus_per_node: int = 8,
    **pins: Any,
) -> ParallelLayout:
    return resolve_layout(
        shape=SHAPE,
        world_size=world_size,
        gpus_per_node=min(gpus_per_node, world_size),
        global_batch=global_batch,
        seq_len=seq_len,
        pinned=ParallelismSpec(**pins).model_dump(exclude_none=True),
        hardware=HARDWARE,
        network=NETWORK,
        worker_precision=Precision.FP32,
    ).layout


def test_auto_takes_the_planners_layout() -> None:
    """Nothing pinned: exactly the layout `runyard plan` answers for the same inputs."""
    layout = resolve()
    planned = plan(SHAPE, HARDWARE, 8, 1024, 16 * 1024, network=NETWORK, gpus_per_node=8).layout
    got = (layout.dp, layout.tp, layout.pp, layout.cp, layout.vp, layout.zero_stage)
    assert got == (planned.dp, planned.tp, planned.pp, planned.cp, planned.vp, planned.zero_stage)
    assert (layout.micro_batch_size, layout.recompute.value) == (
        planned.micro_batch_size,
        planned.recompute,
    )
    assert layout.precision is Precision.FP32  # the ranks' format; planned as BF16


def test_a_70b_shape_is_laid_out_by_the_planner_not_refused() -> None:
    """The bug this replaced: `auto` meant dp only, so 70B on 64 GPUs did not fit."""
    from planner.presets import MODEL_PRESETS

    shape = MODEL_PRESETS["llama3-70b"]
    resolved = resolve_layout(
        shape=shape, world_size=64, gpus_per_node=8, global_batch=64, seq_len=8192,
        pinned={}, hardware=HARDWARE, network=NETWORK, worker_precision=Precision.BF16,
    )  # fmt: skip
    layout = resolved.layout
    assert layout.tp * layout.pp * layout.cp > 1  # 70B does not fit one GPU's share
    assert resolved.plan.memory_gib_per_gpu.total <= resolved.plan.memory_gib_per_gpu.capacity
    assert layout_problems(shape, layout, 8192, 64, 8) == []


def test_pinning_one_degree_keeps_it_and_plans_the_rest() -> None:
    free = resolve(world_size=16, global_batch=32)
    pinned = resolve(world_size=16, global_batch=32, pp=2)
    assert pinned.pp == 2 and pinned.world_size == 16
    planned = plan(SHAPE, HARDWARE, 16, 1024, 32 * 1024, network=NETWORK, pinned={"pp": 2}).layout
    assert (pinned.dp, pinned.tp, pinned.zero_stage) == (planned.dp, planned.tp, planned.zero_stage)
    assert free.pp != 2  # the pin changed the answer; it was not what the search chose anyway


def test_fp8_scaling_reaches_the_layout_and_needs_fp8() -> None:
    layout = resolve(precision="fp8", fp8_scaling="rowwise")
    assert (layout.precision, layout.fp8_scaling) == (Precision.FP8, Float8Scaling.ROWWISE)
    with pytest.raises(LayoutError) as refused:
        resolve(fp8_scaling="rowwise")
    assert refused.value.field == "parallelism.fp8_scaling"


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
    pins = {"zero_stage": 0, **pins} if "zero_stage" not in pins else pins
    layout = resolve(**pins)
    for name, value in expected.items():
        assert getattr(layout, name) == value, name
    assert layout.world_size == 8


def test_auto_micro_batch_leaves_a_pipeline_enough_micro_batches() -> None:
    # 1F1B needs at least pp micro batches in flight: the search never picks a micro batch
    # that leaves fewer (the contract's rule, which the worker checks too).
    layout = resolve(pp=2, tp=1, vp=1)
    assert layout.schedule is PipelineSchedule.ONE_F_ONE_B
    assert 16 // (layout.dp * layout.micro_batch_size) >= 2


def test_uneven_pipeline_split_is_allowed() -> None:
    """3 stages over 8 layers: 3 + 3 + 2 blocks (see worker/parallel/pipeline.py)."""
    layout = resolve(world_size=3, global_batch=6, pp=3, tp=1)
    assert (layout.pp, layout.micro_batch_size) == (3, 2)


@pytest.mark.parametrize(
    ("world_size", "global_batch", "seq_len", "pins", "field", "words"),
    [
        (8, 16, 1024, {"tp": 3}, "parallelism", "does not divide the 8 ranks"),
        (8, 16, 1024, {"dp": 2, "tp": 1, "pp": 1, "cp": 1}, "parallelism.dp", "the run has 8"),
        (8, 16, 1024, {"dp": 3}, "parallelism.dp", "does not divide the run's 8 ranks"),
        (8, 12, 1024, {"dp": 8}, "global_batch", "divisible by dp (8)"),
        (8, 16, 1024, {"micro_batch_size": 3}, "parallelism.micro_batch_size", "must be divisible"),
        (8, 16, 1024, {"tp": 8}, "parallelism.tp", "must divide the model's kv_heads (4)"),
        (16, 16, 1024, {"pp": 16}, "parallelism.pp", "exceeds the model's 8 layers"),
        # pp 4 x dp 2 with micro batch 8: one micro batch per step, 1F1B needs 4.
        (
            8,
            16,
            1024,
            {"pp": 4, "vp": 1, "micro_batch_size": 8},
            "parallelism.pp",
            "at least pp (4)",
        ),
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
        resolve(world_size, global_batch, seq_len, 8, **pins)
    assert refused.value.field == field
    assert words in refused.value.message, refused.value.message


def test_every_resolved_layout_is_a_valid_worker_config() -> None:
    """What the service resolves, the worker accepts (the service builds this at attempt time,
    where a refusal would come far too late)."""
    for pins in ({}, {"tp": 2, "pp": 2}, {"cp": 4}, {"zero_stage": 3, "pp": 1}):
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
