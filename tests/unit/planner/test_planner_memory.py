"""Memory per GPU against figures worked out by hand from the ZeRO and Korthikanti papers."""

from __future__ import annotations

import pytest

from contract import ModelShape
from planner.layout import Layout
from planner.memory import (
    FIXED_OVERHEAD_BYTES,
    FRAGMENTATION,
    activation_bytes_per_token,
    in_flight_micro_batches,
    memory_per_gpu,
    stage_params,
)
from planner.presets import MODEL_PRESETS
from planner.transformer import layer_params

LLAMA3_8B = MODEL_PRESETS["llama3-8b"]
# A GPT-3-style layer: multi-head attention, GELU MLP of 4h.
GPT = ModelShape(layers=4, hidden=1024, heads=16, kv_heads=16, ffn=4096, vocab=1000, mlp="gelu")


def layout(**overrides: object) -> Layout:
    values: dict[str, object] = dict(
        dp=8,
        tp=1,
        pp=1,
        cp=1,
        zero_stage=0,
        micro_batch_size=1,
        recompute="none",
        precision="bf16",
        vp=1,
    )
    values.update(overrides)
    return Layout(**values)  # type: ignore[arg-type]


def test_llama3_8b_has_its_published_parameter_count() -> None:
    assert LLAMA3_8B.num_params == 8_030_261_248


def test_gelu_mlp_has_two_matrices() -> None:
    swiglu = GPT.model_copy(update={"mlp": "swiglu"})
    assert swiglu.num_params - GPT.num_params == GPT.layers * GPT.hidden * GPT.ffn


def test_zero3_over_8_shards_every_model_state_of_8b() -> None:
    n = 8_030_261_248
    mem = memory_per_gpu(LLAMA3_8B, layout(zero_stage=3), seq_len=8192, grad_accum=1)
    gathered = 2 * layer_params(LLAMA3_8B)  # the running and the prefetched layer
    assert mem.params == pytest.approx(n * 2 / 8 + gathered * 2)  # BF16 weights
    assert mem.grads == pytest.approx(n * 2 / 8 + gathered * 2)  # BF16 gradients
    assert mem.optimizer == pytest.approx(n * 12 / 8)  # FP32 master + Adam m and v
    assert mem.optimizer / 2**30 == pytest.approx(11.22, abs=0.01)


@pytest.mark.parametrize(
    ("zero", "params", "grads", "optimizer"),
    [
        (0, 2, 2, 12),
        (1, 2, 2, 12 / 8),
        (2, 2, 2 / 8, 12 / 8),
    ],
)
def test_each_zero_stage_shards_one_more_state(
    zero: int, params: float, grads: float, optimizer: float
) -> None:
    n = LLAMA3_8B.num_params
    mem = memory_per_gpu(LLAMA3_8B, layout(zero_stage=zero), seq_len=8192, grad_accum=1)
    assert (mem.params, mem.grads, mem.optimizer) == pytest.approx(
        (n * params, n * grads, n * optimizer)
    )


def test_tensor_and_pipeline_parallel_split_the_weights() -> None:
    split = stage_params(LLAMA3_8B, layout(dp=1, tp=4, pp=2))
    expected = (16 * layer_params(LLAMA3_8B) + LLAMA3_8B.vocab * LLAMA3_8B.hidden) / 4
    assert split == expected


def test_activations_per_layer_follow_korthikanti_without_dropout() -> None:
    # Korthikanti et al. 2022: 34 sbh per layer with no recompute, of which 2 sbh are
    # dropout masks (absent here); flash attention stores no s^2 scores.
    h = GPT.hidden
    assert activation_bytes_per_token(GPT, "none") == 32 * h
    assert activation_bytes_per_token(GPT, "selective") == 20 * h
    assert activation_bytes_per_token(GPT, "full") == 2 * h


def test_fp8_keeps_gemm_inputs_in_one_byte() -> None:
    saved = activation_bytes_per_token(GPT, "none") - activation_bytes_per_token(GPT, "none", "fp8")
    assert saved == 3 * GPT.hidden + GPT.ffn


def test_sequence_and_context_parallel_divide_activations() -> None:
    base = memory_per_gpu(GPT, layout(dp=1), seq_len=4096, grad_accum=1).activations
    split = memory_per_gpu(GPT, layout(dp=1, tp=2, cp=2), seq_len=4096, grad_accum=1)
    assert split.activations == pytest.approx(base / 4)


@pytest.mark.parametrize(
    ("pp", "vp", "grad_accum", "expected"),
    [
        (1, 1, 8, 1.0),  # no pipeline: one micro batch at a time
        (4, 1, 8, 4.0),  # 1F1B: pp in flight
        (4, 1, 2, 2.0),  # fewer micro batches than stages
        (4, 2, 8, 5.5),  # interleaved: pp + (pp - 1) / vp
    ],
)
def test_pipeline_in_flight_micro_batches(
    pp: int, vp: int, grad_accum: int, expected: float
) -> None:
    assert in_flight_micro_batches(layout(pp=pp, vp=vp), grad_accum) == expected


def test_allowance_is_fixed_plus_a_share_of_what_is_counted() -> None:
    mem = memory_per_gpu(LLAMA3_8B, layout(), seq_len=2048, grad_accum=1)
    counted = mem.params + mem.grads + mem.optimizer + mem.activations
    assert mem.overhead == pytest.approx(FIXED_OVERHEAD_BYTES + FRAGMENTATION * counted)
    assert mem.total == pytest.approx(counted + mem.overhead)
