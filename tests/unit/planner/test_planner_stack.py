"""The software a run states it uses (attention kernel, fused loss) as planner inputs."""

from __future__ import annotations

import dataclasses

import pytest

from contract import ModelShape
from planner import hardware as presets
from planner.attention import kernel_efficiency
from planner.attention_kernels import FA2_HOPPER, KERNELS, TRITON_2022_HOPPER
from planner.collectives import Fabric
from planner.hardware import Network
from planner.layout import Layout
from planner.memory import memory_per_gpu
from planner.plan import PlanError, plan

H100 = presets.HARDWARE["h100-sxm"]
# MPT-1B as llm-foundry trains it (24 layers, d 2048, vocab 50,368).
MPT_1B = ModelShape(
    layers=24, hidden=2048, heads=16, kv_heads=16, ffn=8192, vocab=50368, mlp="gelu"
)


def test_the_2022_triton_kernel_runs_at_fa2_over_the_papers_middle_ratio() -> None:
    # FlashAttention-2 paper: FA2 is 1.3-2.5x faster than FlashAttention in Triton.
    triton = dataclasses.replace(H100, attention_kernel=TRITON_2022_HOPPER)
    fa2 = dataclasses.replace(H100, attention_kernel=FA2_HOPPER)
    for keys in (2048, 32768):
        slow = kernel_efficiency(triton, keys, 128, causal=True)
        fast = kernel_efficiency(fa2, keys, 128, causal=True)
        assert fast[0] / slow[0] == pytest.approx((1.3 * 2.5) ** 0.5)
        assert fast[1] / slow[1] == pytest.approx((1.3 * 2.5) ** 0.5)
    assert KERNELS["flash-attention-triton-2022"] is TRITON_2022_HOPPER


def test_a_fused_loss_keeps_only_the_bf16_logits() -> None:
    layout = Layout(dp=64, tp=1, pp=1, cp=1, zero_stage=3, micro_batch_size=20,
                    recompute="none", precision="bf16", vp=1)  # fmt: skip
    plain = memory_per_gpu(MPT_1B, layout, 2048, 1)
    fused = memory_per_gpu(MPT_1B, layout, 2048, 1, fused_loss=True)
    logits = 20 * 2048 * MPT_1B.vocab
    assert plain.activations - fused.activations == pytest.approx(4 * logits)


def test_mpt_1b_micro_batch_20_on_64_gpus_fits_with_the_loss_it_ran() -> None:
    # llm-foundry's H100 table: MPT-1B, 2K, 64 GPUs, micro batch 20, no checkpointing.
    pins = {"dp": 64, "tp": 1, "pp": 1, "cp": 1, "zero_stage": 3,
            "micro_batch_size": 20, "recompute": "none"}  # fmt: skip
    args = (MPT_1B, "h100-sxm", 64, 2048, 2621440)
    with pytest.raises(PlanError):  # PyTorch's loss keeps an FP32 copy: 81.5 GiB
        plan(*args, pinned=pins)
    original = presets.HARDWARE["h100-sxm"]
    presets.HARDWARE["h100-sxm"] = dataclasses.replace(original, fused_loss=True)
    try:
        result = plan(*args, pinned=pins)
    finally:
        presets.HARDWARE["h100-sxm"] = original
    assert result.layout.micro_batch_size == 20
    assert result.memory_gib_per_gpu.total < result.memory_gib_per_gpu.capacity


def test_the_grand_teton_preset_is_the_h100_at_500_watts_and_2_4_tb_s() -> None:
    teton = presets.HARDWARE["h100-sxm-96gb-500w"]
    assert teton.hbm_bytes_per_s == 2.4e12
    assert teton.hbm_bytes > 95 * 2**30
    assert teton.gemm_efficiency == pytest.approx(
        H100.gemm_efficiency * (5 / 7) ** (1 / 3), abs=0.01
    )


def test_pytorch_sdpa_flash_runs_at_its_published_share_of_fa2() -> None:
    sdpa = KERNELS["pytorch-sdpa-flash"]
    ratio = sdpa.forward_peak_fraction / FA2_HOPPER.forward_peak_fraction
    assert ratio == pytest.approx(0.81, abs=0.005)  # pytorch/benchmark PR #2296, 1K-16K


def test_a_fused_loss_moves_fewer_bytes_over_the_logits() -> None:
    from planner.step_time import LOSS_BYTES_FUSED, LOSS_BYTES_PYTORCH, logits_s

    layout = Layout(dp=8, tp=1, pp=1, cp=1, zero_stage=3, micro_batch_size=1,
                    recompute="none", precision="bf16", vp=1)  # fmt: skip
    fused = dataclasses.replace(H100, fused_loss=True)
    saved = logits_s(MPT_1B, H100, layout, 8192) - logits_s(MPT_1B, fused, layout, 8192)
    moved = (LOSS_BYTES_PYTORCH - LOSS_BYTES_FUSED) * 8192 * MPT_1B.vocab
    assert saved == pytest.approx(moved / (0.8 * H100.hbm_bytes_per_s))


def test_torchtitans_selective_op_checkpointing_reruns_wk_wo_and_w3() -> None:
    from planner.presets import MODEL_PRESETS
    from planner.step_time import layer_time
    from planner.transformer import every_second_matmul

    llama = MODEL_PRESETS["llama3-8b"]  # h 4096, kv 1024, ffn 14336, SwiGLU
    assert every_second_matmul(llama, 8192, 1) == [
        (8192, 4096, 1024),  # wk
        (8192, 4096, 4096),  # wo
        (8192, 4096, 14336),  # w3
    ]
    titan = dataclasses.replace(H100, selective_reruns_every_second_matmul=True)
    fabric = Fabric.of(H100, Network.IB, 8)
    args = ("bf16", 1, 1, 8192, 8192, "selective")
    megatron = layer_time(llama, H100, fabric, *args)
    torchtitan = layer_time(llama, titan, fabric, *args)
    assert torchtitan.recompute_s > megatron.recompute_s
    assert torchtitan.forward_s == megatron.forward_s


def test_pytorch_context_parallel_merges_in_fp32_cost_more_and_rerun_under_full_recompute() -> None:
    from planner.attention import attention_time
    from planner.presets import MODEL_PRESETS
    from planner.step_time import layer_time

    llama = MODEL_PRESETS["llama3-8b"]
    fabric = Fabric.of(H100, Network.IB, 8)
    eager = dataclasses.replace(H100, cp_eager_fp32_merge=True)
    fused_merge = attention_time(llama, H100, fabric, 1, 4, 32768, 131072)
    eager_merge = attention_time(llama, eager, fabric, 1, 4, 32768, 131072)
    assert eager_merge.cp_merge_s == pytest.approx(fused_merge.cp_merge_s * (50 + 70) / 20)
    args = ("fp8", 1, 4, 32768, 131072)
    none = layer_time(llama, eager, fabric, *args, "none")
    full = layer_time(llama, eager, fabric, *args, "full")
    assert full.cp_comm_s - none.cp_comm_s == pytest.approx(eager_merge.cp_merge_forward_s)


def test_pytorch_context_parallel_hides_its_kv_all_gather_behind_the_first_call_only() -> None:
    from planner.attention import attention_time
    from planner.presets import MODEL_PRESETS
    from planner.step_time import layer_time

    llama = MODEL_PRESETS["llama3-8b"]
    eager = dataclasses.replace(H100, cp_eager_fp32_merge=True)
    tokens, seq = 32768, 131072
    # In one node the all-gather hides behind the causal call: only the last dK/dV pass
    # (FP32, as wide as the output), waited right after the loop, is exposed.
    nvlink = Fabric.of(H100, Network.IB, 8)
    inside = attention_time(llama, eager, nvlink, 1, 4, tokens, seq)
    assert inside.cp_exposed_forward_s == 0.0
    assert inside.cp_exposed_s == pytest.approx(nvlink.p2p_s(8.0 * tokens * llama.hidden, 1))
    # One GPU per node: the ring crosses NICs, the all-gather of four ranks' K and V
    # outlasts the causal call, forward and backward, and full recompute pays it again.
    nics = Fabric.of(H100, Network.IB, 1)
    across = attention_time(llama, eager, nics, 1, 4, tokens, seq)
    assert across.cp_exposed_forward_s > 0.0
    assert across.cp_exposed_s > 2 * across.cp_exposed_forward_s
    args = ("fp8", 1, 4, tokens, seq)
    none = layer_time(llama, eager, nics, *args, "none")
    full = layer_time(llama, eager, nics, *args, "full")
    assert full.cp_comm_s - none.cp_comm_s == pytest.approx(
        across.cp_merge_forward_s + across.cp_exposed_forward_s
    )
