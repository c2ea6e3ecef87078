"""Attention's speed by sequence length and head width, and context parallel around it."""

from __future__ import annotations

import dataclasses

import pytest

from contract import ModelShape
from planner.attention import (
    CAUSAL_IMBALANCE,
    attention_time,
    head_dim_factor,
    kernel_efficiency,
)
from planner.attention_kernels import CUDNN_HOPPER, H100_BF16_PEAK
from planner.collectives import Fabric
from planner.hardware import HARDWARE, Network
from planner.presets import MODEL_PRESETS

H100 = HARDWARE["h100-sxm"]
FABRIC = Fabric.of(H100, Network.IB, 8)
LLAMA3_8B = MODEL_PRESETS["llama3-8b"]

# FlashAttention-3 paper, Figures 5-6: FlashAttention-2 on H100 SXM5, head dim 128,
# non-causal, TFLOP/s by sequence length.
FA2_FORWARD = {512: 309, 1024: 350, 2048: 362, 4096: 368, 8192: 370, 16384: 370}
FA2_BACKWARD = {512: 214, 1024: 260, 2048: 291, 4096: 310, 8192: 318, 16384: 322}


@pytest.mark.parametrize("keys", sorted(FA2_FORWARD))
def test_the_fit_reproduces_the_published_flashattention2_curve(keys: int) -> None:
    forward, backward = kernel_efficiency(H100, keys, 128, causal=False)
    assert forward * H100_BF16_PEAK / 1e12 == pytest.approx(FA2_FORWARD[keys], rel=0.06)
    assert backward * H100_BF16_PEAK / 1e12 == pytest.approx(FA2_BACKWARD[keys], rel=0.06)


def test_speed_rises_with_sequence_length_and_levels_off() -> None:
    speeds = [kernel_efficiency(H100, n, 128, causal=True)[1] for n in (2048, 8192, 131072)]
    assert speeds == sorted(speeds)
    peak = H100.attention_kernel.backward_peak_fraction
    assert speeds[-1] == pytest.approx(peak * CAUSAL_IMBALANCE, rel=0.01)
    assert speeds[0] < 0.85 * speeds[-1]  # short sequences pay the per-tile fixed cost


# The same paper's causal forward curve (FA2, head dim 128).
FA2_CAUSAL_FORWARD = {1024: 260, 2048: 298, 4096: 319, 8192: 333, 16384: 335}


@pytest.mark.parametrize("keys", sorted(FA2_CAUSAL_FORWARD))
def test_causal_calls_follow_the_published_causal_curve(keys: int) -> None:
    forward = kernel_efficiency(H100, keys, 128, causal=True)[0] * H100_BF16_PEAK / 1e12
    assert forward == pytest.approx(FA2_CAUSAL_FORWARD[keys], rel=0.05)


def test_causal_is_slower_than_dense_over_half_the_keys() -> None:
    # A causal query meets half its keys on average, but pays for the diagonal tiles.
    causal = kernel_efficiency(H100, 1024, 128, causal=True)[0]
    dense = kernel_efficiency(H100, 512, 128, causal=False)[0]
    assert causal < dense * 8 / 9


def test_narrow_heads_are_slower_and_wide_ones_no_faster() -> None:
    assert head_dim_factor(128) == 1.0 and head_dim_factor(256) == 1.0
    # FA2 at head dim 64: 0.88 of head dim 128 forward, 0.91 backward (FA3 paper).
    assert 0.87 < head_dim_factor(64) < 0.92


def test_a_faster_kernel_makes_long_context_faster() -> None:
    cudnn = dataclasses.replace(H100, attention_kernel=CUDNN_HOPPER)
    fa2 = attention_time(LLAMA3_8B, H100, FABRIC, 1, 1, 32768, 32768)
    fast = attention_time(LLAMA3_8B, cudnn, FABRIC, 1, 1, 32768, 32768)
    assert fast.backward_s < fa2.backward_s / 1.5


def test_context_parallel_splits_attention_evenly() -> None:
    seq = 131072
    whole = attention_time(LLAMA3_8B, H100, FABRIC, 1, 1, seq, seq)
    quarter = attention_time(LLAMA3_8B, H100, FABRIC, 1, 4, seq // 4, seq)
    # Load-balanced chunks: each of 4 ranks does a quarter of the causal work, at the
    # speed of calls over 16K-32K keys; three of its four calls are dense blocks, free of
    # the causal kernel's row imbalance, so a quarter takes a little under a quarter.
    assert 0.9 * whole.forward_s / 4 < quarter.forward_s < whole.forward_s / 4
    assert quarter.cp_merge_s > 0


def test_a_ring_that_leaves_the_node_is_exposed_on_the_nic() -> None:
    # Multi-head K/V (32 KV heads) on a short sequence: lots to send, little to hide it.
    mha = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000)
    inside = attention_time(mha, H100, FABRIC, 2, 4, 2048, 8192)  # 8 ranks: one node
    across = attention_time(mha, H100, FABRIC, 4, 4, 2048, 8192)  # 16 ranks: two nodes
    # NVLink keeps up almost entirely; a NIC hop at an eighth of the bandwidth cannot.
    assert across.cp_exposed_s > 10 * inside.cp_exposed_s
    assert across.cp_exposed_s > 0.1 * across.forward_s
