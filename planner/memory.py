"""Memory per GPU of a layout: model states by ZeRO stage, activations, and an allowance.

Model states follow Rajbhandari et al. 2020 (ZeRO, section 3): mixed-precision Adam keeps
2 bytes of BF16 weights, 2 of BF16 gradients and K = 12 of FP32 master weights, momentum
and variance per parameter; ZeRO-1 shards the 12, ZeRO-2 also the gradients, ZeRO-3 also
the weights, over the data-parallel (and context-parallel) ranks that hold the same
weights. Activations follow Korthikanti et al. 2022 (Reducing Activation Recomputation in
Large Transformer Models, section 4), counted tensor by tensor for a Llama/GPT layer with
fused (flash) attention and no dropout, so their 5as/h score term and dropout masks are gone.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract import ModelShape

from .layout import Layout
from .transformer import kv_dim, layer_params, mlp_up_width

WEIGHT_BYTES = 2  # BF16 working weights (ZeRO paper, 2 of the 16 bytes per parameter)
GRAD_BYTES = 2  # BF16 gradients
OPTIMIZER_BYTES = 12  # FP32 master weights + Adam m + Adam v (the ZeRO paper's K = 12)
# Transformer Engine keeps an FP8 copy of each weight and of its transpose for the step.
FP8_WEIGHT_CACHE_BYTES = 2
LOGIT_BYTES = 6  # BF16 logits kept for backward plus the FP32 copy the loss works on
# A fused cross-entropy (flash-attn's xentropy kernel, llm-foundry's default
# `fused_crossentropy`) keeps the BF16 logits and their log-sum-exp, and writes the
# gradient over the logits in place: no FP32 copy.
FUSED_LOSS_LOGIT_BYTES = 2
ZERO3_PREFETCH_LAYERS = 2  # FSDP holds the running layer and the one it prefetches
# Allowance for what the model above does not count: the CUDA context and cuBLAS/NCCL
# workspaces (~1-2 GiB measured per process in PyTorch), plus allocator fragmentation
# that PyTorch's caching allocator typically shows at 5-15 % of reserved memory.
FIXED_OVERHEAD_BYTES = 2 * 2**30
FRAGMENTATION = 0.10


@dataclass(frozen=True, slots=True)
class MemoryBreakdown:
    """Peak bytes per GPU on the busiest pipeline stage."""

    params: float
    grads: float
    optimizer: float
    activations: float
    overhead: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.overhead


def stage_params(model: ModelShape, layout: Layout) -> float:
    """Parameters one rank holds before ZeRO sharding: its layers and an embedding, / tp.

    With one stage it holds both embedding tables; with several, the first stage holds
    the input table and the last the output projection, so the busiest holds one. Both
    have the padded vocabulary's rows (`ModelShape.padded_vocab`, Megatron's padding).
    """
    embeddings = (2 if layout.pp == 1 else 1) * model.padded_vocab * model.hidden
    return (layout.stage_layers(model.layers) * layer_params(model) + embeddings) / layout.tp


def activation_bytes_per_token(model: ModelShape, recompute: str, precision: str = "bf16") -> float:
    """Bytes one token leaves stored in one layer for the backward pass (before / tp).

    none: both norm inputs (4h), the QKV GEMM input (2h), Q/K/V (2(h + 2kv)), the
    attention output (2h), the MLP input (2h) and the MLP inner tensors (SwiGLU: gate, up
    and their product, 6f; GELU: pre- and post-activation, 4f).
    selective: the norm outputs and the activation output are recomputed from what is kept
    (cheap elementwise ops); every GEMM output stays.
    full: only the layer input (2h) is kept; the layer is rerun in backward.
    FP8: Transformer Engine keeps each GEMM input it still stores in FP8 (1 byte).
    """
    h, f = model.hidden, model.ffn
    if recompute == "full":
        return 2 * h
    inner = 2 * mlp_up_width(model) + 2 * f
    kept = 4 * h + 2 * h + 2 * (h + 2 * kv_dim(model)) + 2 * h + 2 * h + inner
    fp8 = precision == "fp8"
    if recompute == "selective":
        return kept - 4 * h - 2 * f - (h if fp8 else 0)
    return kept - (3 * h + f if fp8 else 0)


def in_flight_micro_batches(layout: Layout, grad_accum: int) -> float:
    """Micro batches whose activations the first pipeline stage holds at its peak.

    1F1B keeps pp in flight (Narayanan et al. 2021); the interleaved schedule adds
    (pp - 1) / vp more (Korthikanti et al. 2022, section 4.2.3).
    """
    if layout.pp == 1:
        return 1.0
    in_flight = min(layout.pp, grad_accum)
    if layout.vp > 1:
        return in_flight + (layout.pp - 1) / layout.vp
    return float(in_flight)


def activation_bytes(
    model: ModelShape, layout: Layout, seq_len: int, grad_accum: int, fused_loss: bool = False
) -> float:
    """Activation bytes on the busiest stage: stored layers x in-flight micro batches.

    Sequence parallel (always on with tp > 1) shards every stored tensor by tp; context
    parallel shards the sequence by cp. Full recompute also needs one layer's complete
    activations while that layer's backward runs. The last stage keeps the logits.
    """
    tokens = layout.micro_batch_size * seq_len / layout.cp
    kept = activation_bytes_per_token(model, layout.recompute, layout.precision)
    per_layer = kept * tokens / layout.tp
    stored = (
        layout.stage_layers(model.layers) * per_layer * in_flight_micro_batches(layout, grad_accum)
    )
    if layout.recompute == "full":
        working = activation_bytes_per_token(model, "none", layout.precision)
        stored += working * tokens / layout.tp
    logit_bytes = FUSED_LOSS_LOGIT_BYTES if fused_loss else LOGIT_BYTES
    logits = logit_bytes * tokens * model.padded_vocab / layout.tp  # the padded GEMM's output
    return stored + logits


def memory_per_gpu(
    model: ModelShape, layout: Layout, seq_len: int, grad_accum: int, fused_loss: bool = False
) -> MemoryBreakdown:
    """Peak memory of one GPU under this layout, by kind, in bytes."""
    n = stage_params(model, layout)
    shards = layout.dp * layout.cp
    weight_bytes = WEIGHT_BYTES + (FP8_WEIGHT_CACHE_BYTES if layout.precision == "fp8" else 0)
    if layout.zero_stage >= 3:
        # Sharded weights, plus the gathered layers FSDP holds (with their gradients).
        gathered = ZERO3_PREFETCH_LAYERS * layer_params(model) / layout.tp
        params = n * WEIGHT_BYTES / shards + gathered * weight_bytes
        grads = n * GRAD_BYTES / shards + gathered * GRAD_BYTES
    else:
        params = n * weight_bytes
        grads = n * GRAD_BYTES / (shards if layout.zero_stage >= 2 else 1)
    optimizer = n * OPTIMIZER_BYTES / (shards if layout.zero_stage >= 1 else 1)
    activations = activation_bytes(model, layout, seq_len, grad_accum, fused_loss)
    counted = params + grads + optimizer + activations
    return MemoryBreakdown(
        params=params,
        grads=grads,
        optimizer=optimizer,
        activations=activations,
        overhead=FIXED_OVERHEAD_BYTES + FRAGMENTATION * counted,
    )
