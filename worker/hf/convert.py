"""One weight's name and layout in Hugging Face's Llama and in the worker's model.

Names map one to one (`model.layers.3.self_attn.q_proj.weight` is `layers.3.attention.wq.
weight`). Values are equal except for the query and key projections, whose output rows are
ordered for different rotary conventions: the worker rotates adjacent pairs (dims 2i, 2i+1
share frequency i, as in Meta's reference code), Hugging Face's Llama rotates halves (dims i
and i + head_dim/2). Hugging Face's own conversion of Meta's weights
(transformers/models/llama/convert_llama_weights_to_hf.py, `permute`) reorders each head's
rows from pairs to halves; `to_worker_rows` is its inverse and `to_hf_rows` the same
reordering, so a round trip returns the very tensor it started from.
"""

from __future__ import annotations

import re

import torch

from contract import ModelShape
from worker.model import VOCAB_LAYERS, pad_vocab_rows

# Per-block weights: the worker's name after "layers.<i>." -> Hugging Face's after
# "model.layers.<i>.".
_BLOCK_NAMES = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP_NAMES = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
HF_EMBEDDING = _TOP_NAMES["tok_embeddings.weight"]
HF_HEAD = _TOP_NAMES["output.weight"]
_BLOCK = re.compile(r"^layers\.(\d+)\.(.+)$")
_HF_BLOCK = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_HF_BLOCK_NAMES = {hf: ours for ours, hf in _BLOCK_NAMES.items()}
_HF_TOP_NAMES = {hf: ours for ours, hf in _TOP_NAMES.items()}


class UnknownWeightError(KeyError):
    """A weight name with no counterpart on the other side (not a plain Llama weight)."""


def hf_name(name: str) -> str:
    """Hugging Face's name for the worker's parameter `name` (canonical, no wrappers)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _BLOCK.match(name)
    if match and match.group(2) in _BLOCK_NAMES:
        return f"model.layers.{match.group(1)}.{_BLOCK_NAMES[match.group(2)]}"
    raise UnknownWeightError(f"the worker's {name!r} has no Hugging Face Llama counterpart")


def worker_name(name: str) -> str:
    """The worker's name for Hugging Face's weight `name`."""
    if name in _HF_TOP_NAMES:
        return _HF_TOP_NAMES[name]
    match = _HF_BLOCK.match(name)
    if match and match.group(2) in _HF_BLOCK_NAMES:
        return f"layers.{match.group(1)}.{_HF_BLOCK_NAMES[match.group(2)]}"
    raise UnknownWeightError(f"{name!r} is not a weight of a plain Llama model")


def _rotary_heads(name: str, shape: ModelShape) -> int | None:
    """How many heads a projection's rows hold, if RoPE rotates its output; else None."""
    if name.endswith("attention.wq.weight"):
        return shape.heads
    if name.endswith("attention.wk.weight"):
        return shape.kv_heads
    return None


def to_worker_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of each head from halves order [re_0..re_n, im_0..im_n] to pairs order
    [re_0, im_0, re_1, im_1, ...]: the inverse of Hugging Face's `permute`."""
    rows, cols = weight.shape
    return weight.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def to_hf_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of each head from pairs order to halves order (Hugging Face's `permute`)."""
    rows, cols = weight.shape
    return weight.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def from_hf(name: str, weight: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    """Hugging Face's value of the worker's parameter `name` in the worker's layout: the
    vocabulary layers padded with zero rows to the worker's padded vocabulary."""
    heads = _rotary_heads(name, shape)
    if heads is not None:
        return to_worker_rows(weight, heads)
    return pad_vocab_rows(name, weight, shape)


def to_hf(name: str, weight: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    """The worker's parameter `name` in Hugging Face's layout (contiguous, for safetensors):
    the vocabulary layers without their padded rows, as the tokenizer knows them."""
    heads = _rotary_heads(name, shape)
    if heads is not None:
        return to_hf_rows(weight, heads).contiguous()
    if name in VOCAB_LAYERS:
        weight = weight[: shape.vocab]
    return weight.contiguous()
