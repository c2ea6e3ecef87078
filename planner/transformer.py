"""Sizes and FLOP counts of a dense decoder layer, shared by the memory and time models.

Everything here follows from the model shape alone: no hardware, no layout.
"""

from __future__ import annotations

from contract import ModelShape


def kv_dim(model: ModelShape) -> int:
    """Width of the K (or V) projection: one head_dim per KV head (GQA)."""
    return model.kv_heads * model.head_dim


def mlp_up_width(model: ModelShape) -> int:
    """Output width of the MLP's first GEMM: SwiGLU computes gate and up together."""
    return 2 * model.ffn if model.mlp == "swiglu" else model.ffn


def layer_matmul_params(model: ModelShape) -> int:
    """Weights of one layer's four GEMMs (QKV, output projection, MLP up, MLP down)."""
    h = model.hidden
    return h * (h + 2 * kv_dim(model)) + h * h + (mlp_up_width(model) + model.ffn) * h


def layer_params(model: ModelShape) -> int:
    """All weights of one layer: the GEMMs plus two norm scales."""
    return layer_matmul_params(model) + 2 * model.hidden


def matmul_params(model: ModelShape) -> int:
    """The N of the 6N rule: every weight that takes part in a matrix product.

    The input embedding is a table lookup and does no arithmetic, so it is left out; the
    output projection to the vocabulary is a GEMM and is counted.
    """
    return model.layers * layer_matmul_params(model) + model.vocab * model.hidden


def model_flops_per_token(model: ModelShape, seq_len: int) -> float:
    """Model FLOPs per trained token: 6N + 12 * layers * hidden * seq.

    The convention of Chowdhery et al. 2022 (PaLM), Appendix B: forward plus backward of
    every GEMM (6N) and of the attention scores and their product with V, counted dense
    (non-causal) and without recomputation. MFU is always quoted in this convention so
    that plans compare; tokens/s is what the accuracy bench checks against sources.
    """
    attention = 12 * model.layers * model.hidden * seq_len
    return 6 * matmul_params(model) + attention


def layer_gemm_shapes(model: ModelShape, tokens: int, tp: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of one layer's forward GEMMs on one tensor-parallel rank.

    Megatron's column/row split: QKV and MLP-up are split along n, the output projection
    and MLP-down along k; with sequence parallel the full local sequence is gathered first.
    """
    h = model.hidden
    return [
        (tokens, h, (h + 2 * kv_dim(model)) // tp),
        (tokens, h // tp, h),
        (tokens, h, mlp_up_width(model) // tp),
        (tokens, model.ffn // tp, h),
    ]


def every_second_matmul(model: ModelShape, tokens: int, tp: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of the 2nd, 4th and 6th of a layer's separate forward matmuls.

    torchtitan's Llama runs wq, wk, wv, wo, then w1, w3, w2 (SwiGLU) or w1, w2 (GELU) as
    separate matmuls; its selective op checkpointing reruns every second one: wk, wo and
    w3 (SwiGLU) or w2 (GELU).
    """
    h = model.hidden
    mlp = (tokens, h, model.ffn // tp) if model.mlp == "swiglu" else (tokens, model.ffn // tp, h)
    return [(tokens, h, kv_dim(model) // tp), (tokens, h // tp, h), mlp]


def attention_forward_flops(model: ModelShape, tokens: int, seq_len: int, tp: int) -> float:
    """Forward FLOPs of the attention core (QK^T and PV) for `tokens` local queries.

    Causal: each query meets on average half the sequence, and fused kernels skip the
    masked blocks. With context parallel each rank holds seq/cp queries that still see
    (on average, with the load-balanced split) half of the full sequence.
    """
    return 4 * tokens * (seq_len / 2) * model.hidden / tp


def elementwise_bytes_per_token(model: ModelShape, recompute_only: bool = False) -> float:
    """HBM bytes one token moves through one layer's memory-bound forward ops (BF16).

    Two RMSNorms (read, write), two residual adds (read 2, write 1), rotary embedding on
    Q and K, and the MLP activation (SwiGLU reads gate and up, writes one; GELU reads and
    writes one). `recompute_only`: just the norms and activation that selective
    recompute redoes.
    """
    h, f = model.hidden, model.ffn
    norms = 2 * (2 * h + 2 * h)
    activation = 6 * f if model.mlp == "swiglu" else 4 * f
    if recompute_only:
        return norms + activation
    residual = 2 * (4 * h + 2 * h)
    rotary = 4 * (h + kv_dim(model))
    return norms + residual + rotary + activation


def fp8_cast_bytes_per_token(model: ModelShape) -> float:
    """HBM bytes per token per layer spent casting GEMM operands to FP8.

    Transformer Engine casts each GEMM's input in forward and each output gradient in
    backward, reading BF16 (2 bytes) and writing FP8 plus its transpose (1 + 1).
    """
    h, f = model.hidden, model.ffn
    inputs = 3 * h + f
    output_grads = (h + 2 * kv_dim(model)) + h + mlp_up_width(model) + h
    return 4 * (inputs + output_grads)
