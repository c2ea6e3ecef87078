"""The step-time model at its edges: small models, long sequences, and where time goes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.collectives import Fabric
from planner.explain import explain_step
from planner.hardware import HARDWARE, Network
from planner.layout import Layout
from planner.overheads import HOST_OP_S, layer_kernels, with_launch_costs
from planner.presets import MODEL_PRESETS
from planner.step_time import estimate_step, gemm_s, layer_time, logits_s

H100 = HARDWARE["h100-sxm"]
FABRIC = Fabric.of(H100, Network.IB, 8)
EDGE_CASES = Path(__file__).resolve().parents[3] / "bench" / "planner_cases_edges.json"


def layout(**overrides: object) -> Layout:
    values: dict[str, object] = dict(
        dp=8, tp=1, pp=1, cp=1, zero_stage=1, micro_batch_size=1, recompute="none"
    )
    values.update(overrides)
    values.setdefault("precision", "bf16")
    return Layout(**values)  # type: ignore[arg-type]


def test_the_host_sets_the_pace_when_kernels_are_tiny() -> None:
    assert with_launch_costs(0.0, 40) == pytest.approx(40 * HOST_OP_S)
    big = with_launch_costs(1e-2, 40)
    assert 1e-2 < big < 1.01e-2  # a long layer pays only the per-kernel gaps


def test_launch_costs_weigh_on_small_micro_batches_of_small_models() -> None:
    small = MODEL_PRESETS["llama3-1b"]
    shares = []
    for tokens in (512, 8192):
        layer = layer_time(small, H100, FABRIC, "bf16", 2, 1, tokens, 8192, "none")
        shares.append(layer.launch_s / (layer.forward_s + layer.backward_s))
    assert shares[0] > 5 * shares[1]


def test_kernel_counts_grow_with_tensor_parallel_fp8_cp_and_recompute() -> None:
    plain = layer_kernels(1, 1, "bf16", "none")
    assert layer_kernels(2, 1, "bf16", "none").forward > plain.forward
    assert layer_kernels(1, 1, "fp8", "none").backward > plain.backward
    assert layer_kernels(1, 4, "bf16", "none").forward > plain.forward
    assert layer_kernels(1, 1, "bf16", "full").backward == plain.backward + plain.forward


def test_short_steps_on_many_nodes_pay_the_rings_latency() -> None:
    # A 1B model, one 2K sequence per GPU: ~40 ms of compute. NCCL's all-gather and
    # reduce-scatter are rings, so at 512 nodes each crosses 511 NIC hops.
    small = MODEL_PRESETS["llama3-1b"]
    exposed = [
        estimate_step(small, H100, FABRIC, layout(dp=dp, zero_stage=3), 2048, 1).dp_comm_s
        for dp in (64, 4096)
    ]
    assert exposed[1] > 2 * exposed[0]


def test_a_layers_parts_add_up_to_its_time() -> None:
    for recompute in ("none", "selective", "full"):
        layer = layer_time(
            MODEL_PRESETS["llama3-8b"], H100, FABRIC, "fp8", 2, 2, 4096, 8192, recompute
        )
        parts = layer.gemm_s + layer.attention_s + layer.memory_bound_s + layer.recompute_s
        assert parts + layer.launch_s == pytest.approx(layer.forward_s + layer.backward_s)


def test_attention_dominates_at_128k_and_not_at_8k() -> None:
    model = MODEL_PRESETS["llama3-8b"]
    long = layer_time(model, H100, FABRIC, "bf16", 1, 4, 32768, 131072, "none")
    short = layer_time(model, H100, FABRIC, "bf16", 1, 1, 8192, 8192, "none")
    assert long.attention_s > 0.7 * (long.forward_s + long.backward_s)
    assert short.attention_s < 0.4 * (short.forward_s + short.backward_s)


def test_fp8_gemms_gain_less_than_twofold_and_least_on_short_reductions() -> None:
    # A tile's epilogue takes as long in FP8 as in BF16, so it weighs twice as much
    # against FP8's faster main loop: short reductions (small hidden sizes) gain least.
    def speedup(k: int) -> float:
        return gemm_s(16384, k, 16384, H100, "bf16") / gemm_s(16384, k, 16384, H100, "fp8")

    assert speedup(1024) < speedup(4096) < speedup(16384) < 2.0
    assert speedup(16384) > 1.9


def test_the_output_projection_stays_bf16_under_fp8() -> None:
    model = MODEL_PRESETS["llama3-8b"]
    assert logits_s(model, H100, layout(precision="fp8"), 8192) == logits_s(
        model, H100, layout(), 8192
    )


def test_explain_adds_up_to_the_step_time() -> None:
    model = MODEL_PRESETS["llama3-70b"]
    chosen = layout(dp=2, tp=4, pp=4, cp=2, vp=5, micro_batch_size=1, recompute="selective")
    step = estimate_step(model, H100, FABRIC, chosen, 8192, 32)
    causes = explain_step(model, H100, FABRIC, chosen, 8192, 32)
    assert sum(c.seconds for c in causes) == pytest.approx(step.total_s)
    by_cause = {c.cause: c for c in causes}
    assert by_cause["bubble"].seconds == pytest.approx(step.bubble_s)
    assert "head dim 128" in by_cause["attention"].why


# Edge cases the model still misses by more than 25 %: none since issue 33 (torchtitan's
# 128K / cp 4 and 256K / cp 8 rows were +32 % and +39 % until PyTorch's ring was charged
# its excess per off-diagonal step, fitted on the same page's 405B table, not on these).
OPEN_MISSES: set[str] = set()


def test_every_edge_case_names_its_source_and_is_within_25_percent() -> None:
    from bench.planner_accuracy import evaluate  # the bench's own comparison

    cases = json.loads(EDGE_CASES.read_text())["cases"]
    assert {c["edge"] for c in cases} <= {"long_context", "small_model", "same_hardware"}
    for case in cases:
        assert case["source"] and case["reported"]["tokens_per_s_per_gpu"] > 0
        assert case.get("scored", True), case["id"]  # every edge case is scored
        error = abs(evaluate(case)["relative_error"])
        if case["id"] in OPEN_MISSES:
            assert error > 0.25, f"{case['id']} now within 25 %: take it off OPEN_MISSES"
        else:
            assert error <= 0.25, case["id"]


def test_pytorchs_ring_constant_is_the_405b_tables_fit_and_holds_on_the_8b_rows() -> None:
    """The ring's excess is fitted on torchtitan's 405B table alone and scores the scored
    8B rows it never saw within 25 %; fitted on the 8B rows, it scores the 405B rows (each
    relative to its cp 1 row) within 25 % too: leave one source out, both ways."""
    from bench.cp_ring_fit import SOURCE_A, TABLE_A, TABLE_B, leave_one_source_out, table_rows
    from bench.planner_prediction import load_cases, predict_tokens_per_gpu
    from planner.attention import PYTORCH_RING_STEP_EXCESS

    source_a = table_rows(json.loads(SOURCE_A.read_text())["cases"], TABLE_A)
    source_b = table_rows(load_cases(), TABLE_B)
    assert [c["layout"]["cp"] for c in source_a] == [c["layout"]["cp"] for c in source_b]
    result = leave_one_source_out(source_a, source_b, predict_tokens_per_gpu)
    # Within one step of the fit's grid (0.01): the committed value is the fit.
    assert abs(result["fit_on_405b_table"] - PYTORCH_RING_STEP_EXCESS) <= 0.0101
    assert max(map(abs, result["8b_rows_with_405b_fit"].values())) <= 0.25
    assert max(map(abs, result["405b_rows_relative_to_cp1_with_8b_fit"].values())) <= 0.25
