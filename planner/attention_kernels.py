"""Published speed curves of fused attention kernels, as the planner's attention model uses them.

Each kernel's speed rises with the keys a query meets and levels off:
speed(n) = peak_fraction x n / (n + half_keys), forward and backward apart. The numbers
are fits to the curves in the FlashAttention-3 paper (Shah et al. 2024, Figures 5 and 6:
H100 80GB SXM5, BF16, head dim 128, non-causal, batch x seq = 16K tokens), TFLOP/s:

    keys            512   1k    2k    4k    8k    16k
    FA2    fwd      309   350   362   368   370   370   -> 372, half at ~80 keys
           bwd      214   260   291   310   318   322   -> 326, half at ~240 keys
    cuDNN  fwd      497   574   617   609   600   595   -> 610, half at ~90 keys
           bwd      305   408   465   499   518   516   -> 530, half at ~300 keys

Which kernel a run gets is the framework's choice, not the hardware's: PyTorch's
scaled_dot_product_attention (what runyard's worker calls) tries FlashAttention-2 first
(fixed priority flash, efficient, math, cuDNN: pytorch/pytorch#138907), although cuDNN is
1.7-2.3x faster for training shapes on Hopper (huggingface/transformers#48163); Megatron
with Transformer Engine picks cuDNN there. A preset names the kernel the worker runs.
"""

from __future__ import annotations

from dataclasses import dataclass

H100_BF16_PEAK = 989.4e12  # the curves above are fractions of this


@dataclass(frozen=True, slots=True)
class AttentionKernel:
    """One fused attention kernel's speed curve on one chip."""

    name: str
    forward_peak_fraction: float  # of dense BF16 peak, at long sequences
    backward_peak_fraction: float
    forward_half_keys: float  # keys per query at which the forward runs at half speed
    backward_half_keys: float


FA2_HOPPER = AttentionKernel("flash-attention-2 (H100)", 372e12 / H100_BF16_PEAK,
                             326e12 / H100_BF16_PEAK, 80.0, 240.0)  # fmt: skip
CUDNN_HOPPER = AttentionKernel("cudnn (H100)", 610e12 / H100_BF16_PEAK,
                               530e12 / H100_BF16_PEAK, 90.0, 300.0)  # fmt: skip
# FlashAttention-2 (Dao 2023) reaches "50-73% of the theoretical maximum FLOPs/s on
# A100", the forward at the top of that range; no per-length A100 curve is published in
# text, so the backward keeps FA2's H100 backward/forward ratio (326 / 372) and both keep
# FA2's H100 half-speed key counts.
FA2_AMPERE = AttentionKernel("flash-attention-2 (A100)", 0.70, 0.70 * 326 / 372, 80.0, 240.0)

# The 2022 Triton FlashAttention (HazyResearch flash_attn/flash_attn_triton.py, pinned to
# triton 2.0.0.dev20221202, the pre-MLIR compiler; llm-foundry's attn_impl "triton" is a
# copy of it). Both it and FA2 issue Ampere mma.sync instructions on Hopper, so their
# ratio carries over from the A100, where the FlashAttention-2 paper (Dao 2023, section
# 4.1) measures FA2 "1.3-2.5x faster than FlashAttention in Triton" forward + backward.
# We take the geometric middle of that range, 1.8x, at every length and head dim (the
# paper gives no per-length split in text); no case was used to choose it.
TRITON_2022_SLOWDOWN = (1.3 * 2.5) ** 0.5
TRITON_2022_HOPPER = AttentionKernel(
    "flash-attention triton 2022 (H100)",
    FA2_HOPPER.forward_peak_fraction / TRITON_2022_SLOWDOWN,
    FA2_HOPPER.backward_peak_fraction / TRITON_2022_SLOWDOWN,
    FA2_HOPPER.forward_half_keys,
    FA2_HOPPER.backward_half_keys,
)

# PyTorch's own FlashAttention-2 build, what F.scaled_dot_product_attention's flash backend
# runs (torchtitan's attention): pytorch/benchmark PR #2296 (June 2024) measured it on an
# H100 beside the Triton tutorial kernel, forward, head dim 128, 8 heads, batch 128:
# 287, 293, 298, 288, 304 TFLOP/s from 1K to 16K, a mean of 0.81 of FA2's published
# forward over the same lengths (350-370 above), while the Triton kernel on that machine
# ran at 1.06 of the FA3 paper's Triton: the gap is the build, not the machine. No
# backward is published; it is charged the same ratio.
SDPA_FLASH_RATIO = (287.5 + 293.2 + 298.4 + 287.7 + 304.2) / (350 + 362 + 368 + 370 + 370)
SDPA_FLASH_HOPPER = AttentionKernel(
    "pytorch sdpa flash (H100)",
    FA2_HOPPER.forward_peak_fraction * SDPA_FLASH_RATIO,
    FA2_HOPPER.backward_peak_fraction * SDPA_FLASH_RATIO,
    FA2_HOPPER.forward_half_keys,
    FA2_HOPPER.backward_half_keys,
)

# Kernels a run can state it uses (like its chip: an input, not a fitted factor).
KERNELS: dict[str, AttentionKernel] = {
    "flash-attention-2": FA2_HOPPER,
    "cudnn": CUDNN_HOPPER,
    "flash-attention-triton-2022": TRITON_2022_HOPPER,
    "pytorch-sdpa-flash": SDPA_FLASH_HOPPER,
}
