"""Fused causal attention on one rank: its speed as the sequence and head dimension grow,
and what context parallelism adds around it.

A FlashAttention-style kernel (FA2, cuDNN, FA3) walks tiles of the score matrix. Each
query block (forward) or key block (backward) pays a fixed cost besides its main loop:
loading its tile, rescaling and writing the output or the gradients, the log-sum-exp.
Amortised over the keys a query meets, that makes the speed rise with sequence length
and saturate: speed(n) = peak_fraction x n / (n + half_keys), n = keys per query, with
each kernel's figures fitted to its published curves (`attention_kernels.py`).

A causal kernel also computes the diagonal tiles whole and masks half of each: with
ATTENTION_BLOCK keys per tile and n tiles per row that wastes 1 / (n + 1) of the work;
and its rows carry unequal work, so the blocks holding the last rows finish after the
rest (CAUSAL_IMBALANCE). The same paper's causal forward curve (FA2, head dim 128:
191, 260, 298, 319, 333, 335 TFLOP/s from 512 to 16K) sits at 0.91-0.93 of what the
non-causal fit and the diagonal waste give, from 1K keys up; the backward, with no
causal curve in text, is charged the same.

The softmax (exp, max, sum on the FP32 units) costs the same per score whatever the
head dimension, while the matrix products grow with it, so a narrower head is slower:
head_dim / (head_dim + HEAD_DIM_SOFTMAX_EQUIVALENT), normalised to 128 (the same paper's
head dim 64 curves run at 0.88-0.91 of head dim 128); FA2 tiles wider heads no better
than 128 (its head dim 256 curve is slower still), so wider heads are charged as 128.

Context parallel (Megatron-LM / Transformer Engine ring attention with the load-balanced
2 x cp chunking, Liu et al. 2023 Ring Attention): each rank runs cp kernel calls per
layer, each over about seq / cp keys; K and V travel round the ring forward, K, V, dK and
dV backward, hidden behind the attention they feed when the link keeps up; after every
step the partial output is merged into an FP32 accumulator with its log-sum-exp.
PyTorch's own context parallel (what torchtitan runs) moves K and V by one all-gather
instead, hidden only behind the first call, and passes FP32 dK and dV round the ring
backward (`_pytorch_cp_exposed`).
"""

from __future__ import annotations

from dataclasses import dataclass

from contract import ModelShape

from .collectives import Fabric
from .hardware import HBM_EFFICIENCY, Hardware
from .transformer import attention_forward_flops, kv_dim

ATTENTION_BLOCK = 128  # keys per tile of FA2/cuDNN's causal kernels for head dim <= 128
# FA2 at head dim 64 runs 0.88 (forward) to 0.91 (backward) of head dim 128 (FA3 paper).
HEAD_DIM_SOFTMAX_EQUIVALENT = 17.0
CAUSAL_IMBALANCE = 0.92  # causal FA2 forward against the non-causal fit (above)
REFERENCE_HEAD_DIM = 128
ATTENTION_BACKWARD_RATIO = 2.5  # FlashAttention backward: 5 matmuls vs 2 forward (Dao 2023)
# Merging one ring step's partial output: read it (BF16) and the running FP32 sum, write
# the sum back, per element of the local output (TE's flash_attn_fwd_out_correction).
CP_MERGE_BYTES_PER_ELEMENT = 2 + 4 + 4
# PyTorch's context parallel (torch.distributed.tensor.experimental._attention, with its
# default convert_to_f32) does the same bookkeeping in eager FP32 ops, per ring step and
# per element of the local output, K and V being as wide as the output once torchtitan's
# repeat_kv has expanded them: forward, concatenating K and V to pass on (read + write
# 2 x 2 B = 8), the block output cast to FP32 (2 + 4), the three-op sigmoid merge
# (12 + 8 + 12) and the partial-chunk torch.cat (~4 on average): ~50 B; backward, K and V
# concatenated again (8), dK and dV accumulated in FP32 (2 x 10), their partial update
# (16) and concatenation to pass on (16), dQ accumulated (10): ~70 B.
CP_EAGER_FP32_BYTES_PER_ELEMENT = (50, 70)
# PyTorch's ring costs more per off-diagonal step than its kernel at the published curve
# plus the transfers and merges above, by this share of that step's attention time. Its
# source is a published measurement of that implementation which no scored case is part
# of: torchtitan docs/performance.md (d4c86e3) Table 6, Llama 3.1 405B on 512 H100s (TP 8,
# PP 8, CP 1/2/4/8 at 32K tokens per rank: 76, 47, 31, 16 TPS/GPU), each row's error taken
# relative to its cp 1 row, so that what the planner cannot state of those runs (FSDP under
# the pipeline, AsyncTP) cancels. Least total |log error| over 0.00-1.50 gives 0.40
# (`bench/cp_ring_fit.py` reproduces it). The 8B rows of the same page (Table 2) are held
# out of the fit and validate it; fitted on them instead (leave one source out), 0.36.
# The mechanism is not identified (the kernels alone run faster than the curve on an H200,
# issue 33): it is charged where both tables show it, on the ring's off-diagonal steps.
PYTORCH_RING_STEP_EXCESS = 0.40


@dataclass(frozen=True, slots=True)
class AttentionTime:
    """One layer's attention core on one rank, one micro batch."""

    forward_s: float
    backward_s: float
    cp_exposed_s: float  # ring transfers not hidden behind the attention they feed
    cp_merge_s: float  # merging partial outputs, forward and backward together
    cp_merge_forward_s: float = 0.0  # its forward part, which full recompute runs again
    cp_exposed_forward_s: float = 0.0  # the forward's exposed transfers, rerun likewise


def _saturation(keys: float, half: float) -> float:
    return keys / (keys + half)


def head_dim_factor(head_dim: int) -> float:
    """Speed of a head of this width relative to a 128-wide one (1.0 at 128 and above)."""
    d = min(head_dim, REFERENCE_HEAD_DIM)
    eq = HEAD_DIM_SOFTMAX_EQUIVALENT
    return (d / (d + eq)) / (REFERENCE_HEAD_DIM / (REFERENCE_HEAD_DIM + eq))


def kernel_efficiency(
    hardware: Hardware, keys_per_call: float, head_dim: int, causal: bool
) -> tuple[float, float]:
    """(forward, backward) fraction of BF16 peak for one kernel over `keys_per_call` keys.

    Causal calls meet half their keys per query on average and waste the masked halves
    of the diagonal tiles; non-causal calls (the off-diagonal ring steps) do neither.
    """
    keys = keys_per_call / 2 if causal else keys_per_call
    width = head_dim_factor(head_dim)
    diagonal = 1.0
    if causal:
        tiles = max(1.0, keys_per_call / ATTENTION_BLOCK)
        diagonal = tiles / (tiles + 1) * CAUSAL_IMBALANCE
    kernel = hardware.attention_kernel
    forward = kernel.forward_peak_fraction * _saturation(keys, kernel.forward_half_keys)
    backward = kernel.backward_peak_fraction * _saturation(keys, kernel.backward_half_keys)
    return forward * width * diagonal, backward * width * diagonal


def attention_time(
    model: ModelShape,
    hardware: Hardware,
    fabric: Fabric,
    tp: int,
    cp: int,
    tokens: int,
    seq_len: int,
) -> AttentionTime:
    """Attention for `tokens` local queries (micro batch x seq / cp) of a layer on one rank.

    Without cp one causal call covers the sequence. With cp the rank's FLOPs split into
    one causal call over its own seq / cp keys and cp - 1 non-causal calls over half as
    many (the load-balanced chunks), all at the speed of their own key counts.
    """
    flops = attention_forward_flops(model, tokens, seq_len, tp)
    peak = hardware.peak_bf16_flops
    local_keys = seq_len / cp
    fwd_eff, bwd_eff = kernel_efficiency(hardware, local_keys, model.head_dim, causal=True)
    if cp == 1:
        forward = flops / (fwd_eff * peak)
        backward = ATTENTION_BACKWARD_RATIO * flops / (bwd_eff * peak)
        return AttentionTime(forward, backward, 0.0, 0.0)
    # The rank's work is seq^2 / (2 cp) scores per sequence: a causal (seq/cp)^2 / 2
    # diagonal plus cp - 1 blocks of (seq/cp)^2 / 2 each, so every call carries 1 / cp.
    off_fwd, off_bwd = kernel_efficiency(hardware, local_keys / 2, model.head_dim, causal=False)
    if hardware.cp_eager_fp32_merge:  # PyTorch's ring: each off-diagonal step costs more
        off_fwd /= 1 + PYTORCH_RING_STEP_EXCESS
        off_bwd /= 1 + PYTORCH_RING_STEP_EXCESS
    share = flops / cp
    forward = share / (fwd_eff * peak) + (cp - 1) * share / (off_fwd * peak)
    backward = ATTENTION_BACKWARD_RATIO * (
        share / (bwd_eff * peak) + (cp - 1) * share / (off_bwd * peak)
    )
    # Each ring step sends this rank's K and V (BF16) to its neighbour; backward sends them
    # again with their gradients. A ring of cp ranks tp apart leaves the node as soon as
    # cp x tp ranks outgrow it, and then its slowest hop is a NIC.
    kv_chunk = 2.0 * 2 * tokens * kv_dim(model) / tp
    ring_stride = tp if cp * tp <= fabric.gpus_per_node else fabric.gpus_per_node
    hop = fabric.p2p_s(kv_chunk, ring_stride)
    step_forward, step_backward = forward / cp, backward / cp
    exposed = (cp - 1) * (max(0.0, hop - step_forward) + max(0.0, 2 * hop - step_backward))
    exposed_forward = 0.0
    output_elements = tokens * model.hidden / tp
    if hardware.cp_eager_fp32_merge:
        forward_bytes, backward_bytes = CP_EAGER_FP32_BYTES_PER_ELEMENT
        exposed_forward, exposed = _pytorch_cp_exposed(
            fabric,
            cp,
            tp,
            output_elements,
            share / (fwd_eff * peak),
            (
                ATTENTION_BACKWARD_RATIO * share / (bwd_eff * peak),
                ATTENTION_BACKWARD_RATIO * share / (off_bwd * peak),
            ),
        )
    else:
        forward_bytes = backward_bytes = CP_MERGE_BYTES_PER_ELEMENT
    hbm = HBM_EFFICIENCY * hardware.hbm_bytes_per_s
    merge_forward = cp * output_elements * forward_bytes / hbm
    merge = merge_forward + cp * output_elements * backward_bytes / hbm
    return AttentionTime(forward, backward, exposed, merge, merge_forward, exposed_forward)


def _pytorch_cp_exposed(
    fabric: Fabric,
    cp: int,
    tp: int,
    output_elements: float,
    causal_forward: float,
    backward_calls: tuple[float, float],
) -> tuple[float, float]:
    """(forward, forward + backward) ring transfers PyTorch's context parallel leaves exposed.

    From torch/distributed/tensor/experimental/_attention.py (_templated_ring_attention and
    its backward, default rotate_method ALL_GATHER): the forward all-gathers every rank's
    K and V once, issued before the first (causal) call and waited before the second, so
    only that call hides it; the backward does the same, then passes the FP32 dK and dV
    accumulators round the ring after every call (an all-to-all permute, each hidden by
    the next call), the last one waited at once after the loop. K and V are as wide as
    the output (torchtitan's repeat_kv runs before SDPA): 2 x 2 B per output element for
    K and V, 2 x 4 B for dK and dV. `causal_forward` is the first call's time forward,
    `backward_calls` (causal, one off-diagonal) call times backward.
    """
    causal_bwd, off_bwd = backward_calls
    kv = 2 * 2.0 * output_elements
    gather = fabric.collective_s(cp * kv, cp, tp, passes=1)
    ring_stride = tp if cp * tp <= fabric.gpus_per_node else fabric.gpus_per_node
    dkv_hop = fabric.p2p_s(2 * 4.0 * output_elements, ring_stride)
    forward = max(0.0, gather - causal_forward)
    backward = max(0.0, gather - causal_bwd) + (cp - 1) * max(0.0, dkv_hop - off_bwd) + dkv_hop
    return forward, forward + backward
