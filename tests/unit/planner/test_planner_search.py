"""The layout search: rejection reasons, pins, ordering, and the refusal messages."""

from __future__ import annotations

import pytest

from contract import ModelShape
from planner.hardware import HARDWARE, Network
from planner.plan import PlanError, explain_does_not_fit, plan
from planner.presets import MODEL_PRESETS
from planner.search import Pinned, Request, search

LLAMA3_8B = MODEL_PRESETS["llama3-8b"]
ONE_MILLION = 2**20


def request(
    model: ModelShape = LLAMA3_8B,
    gpus: int = 8,
    seq: int = 8192,
    batch_tokens: int = ONE_MILLION,
    **pins: object,
) -> Request:
    return Request(
        model,
        HARDWARE["h100-sxm"],
        Network.IB,
        gpus,
        8,
        seq,
        batch_tokens // seq,
        "bf16",
        Pinned(**pins),  # type: ignore[arg-type]
    )


def test_layouts_that_do_not_divide_are_rejected_with_the_reason() -> None:
    two_kv_heads = LLAMA3_8B.model_copy(update={"kv_heads": 2})
    outcome = search(request(two_kv_heads))
    assert outcome.rejected["indivisible"] > 0
    assert outcome.ranked and outcome.ranked[0].layout.tp <= 2
    assert all(c.layout.tp <= 2 for c in outcome.ranked)
    reasons = " ".join(outcome.examples.values())
    assert "kv_heads (2)" in reasons


def test_batch_that_dp_cannot_split_is_indivisible() -> None:
    outcome = search(request(batch_tokens=12 * 8192, dp=8))
    assert not outcome.ranked
    assert outcome.rejected["indivisible"] > 0
    assert "global_batch (12) must be divisible" in outcome.examples["indivisible"]


def test_zero3_with_pipeline_is_unsupported() -> None:
    outcome = search(request(gpus=16, pp=2, zero_stage=3))
    assert not outcome.ranked
    assert "zero_stage 3 with pp > 1" in outcome.examples["unsupported"]


def test_every_enumerated_layout_is_chosen_or_counted_once() -> None:
    outcome = search(request(gpus=64), keep=10_000)
    counted = sum(outcome.rejected.values())
    assert counted + 1 == len(outcome.ranked) + sum(
        n for reason, n in outcome.rejected.items() if reason != "slower"
    )
    times = [c.step.total_s for c in outcome.ranked[1:]]
    assert times == sorted(times)
    assert outcome.ranked[0].step.total_s <= min(times) * 1.005


def test_fully_pinned_layout_is_evaluated_exactly() -> None:
    pins: dict[str, int | str | None] = dict(
        dp=2, tp=2, pp=2, cp=1, zero_stage=1, micro_batch_size=2, recompute="full", vp=4
    )
    result = plan(LLAMA3_8B, "h100-sxm", 8, 8192, ONE_MILLION, pinned=pins)
    got = result.layout
    assert (
        got.dp,
        got.tp,
        got.pp,
        got.cp,
        got.zero_stage,
        got.micro_batch_size,
        got.recompute,
        got.vp,
    ) == (2, 2, 2, 1, 1, 2, "full", 4)
    assert got.grad_accum == 128 // (2 * 2)
    assert result.runners_up == []
    assert "slower" not in result.rejected


def test_pinned_tp_that_does_not_divide_kv_heads_names_the_field() -> None:
    with pytest.raises(PlanError) as caught:
        plan(LLAMA3_8B, "h100-sxm", 24, 8192, 3 * ONE_MILLION, pinned={"tp": 3})
    assert caught.value.field == "tp"
    assert "must divide the model's heads (32)" in caught.value.message


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"hardware": "tpu-v5"}, "hardware"),
        ({"precision": "fp4"}, "precision"),
        ({"hardware": "a100-80gb", "precision": "fp8"}, "precision"),
        ({"global_batch_tokens": 1000}, "global_batch_tokens"),
        ({"pinned": {"pp": 3, "tp": 3}}, "parallelism"),
        ({"pinned": {"recompute": "some"}}, "recompute"),
        ({"pinned": {"ep": 2}}, "ep"),
    ],
)
def test_bad_inputs_name_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = dict(
        model=LLAMA3_8B,
        hardware="h100-sxm",
        num_gpus=8,
        seq_len=8192,
        global_batch_tokens=ONE_MILLION,
    )
    args.update(kwargs)
    with pytest.raises(PlanError) as caught:
        plan(**args)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_what_does_not_fit_says_by_how_much_and_what_helps() -> None:
    model = MODEL_PRESETS["llama3-70b"]
    message = explain_does_not_fit(model, "h100-sxm", 8, 8192, ONE_MILLION)
    assert message is not None
    assert "GiB more than the 79.6 GiB" in message
    assert "--gpus 16" in message or "--gpus 32" in message
    assert explain_does_not_fit(LLAMA3_8B, "h100-sxm", 8, 8192, ONE_MILLION) is None


def test_pinned_recompute_that_overflows_suggests_full_recompute() -> None:
    with pytest.raises(PlanError) as caught:
        plan(
            LLAMA3_8B,
            "h100-sxm",
            8,
            8192,
            ONE_MILLION,
            pinned={"dp": 8, "recompute": "none", "micro_batch_size": 4},
        )
    assert "116.0 GiB more" in caught.value.message
    assert any("--recompute full" in a for a in caught.value.advice)


def test_plan_json_has_the_contracted_fields() -> None:
    result = plan(LLAMA3_8B, "h100-sxm", 64, 8192, 4 * ONE_MILLION).model_dump()
    for key in (
        "dp",
        "tp",
        "pp",
        "cp",
        "zero_stage",
        "micro_batch_size",
        "grad_accum",
        "recompute",
        "precision",
        "vp",
    ):
        assert key in result["layout"]
    assert set(result["memory_gib_per_gpu"]) >= {
        "params",
        "grads",
        "optimizer",
        "activations",
        "total",
    }
    assert set(result["checkpoint"]) >= {"size_gib", "write_s", "interval_s"}
    for key in (
        "step_time_s",
        "tokens_per_s",
        "mfu",
        "tflops_per_gpu",
        "goodput",
        "spare_nodes",
        "rejected",
    ):
        assert key in result
    assert 0 < result["mfu"] < 1 and result["memory_gib_per_gpu"]["total"] < 79.7
