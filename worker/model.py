"""A Llama-style decoder: architecture only, no parallelism.

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU MLP, with an
untied output head. Blocks live in `Transformer.layers` (a ModuleDict keyed "0", "1", ...)
so that FSDP, tensor parallel and pipeline stages can later be applied per block without
touching this file; `parallel/` owns those wrappers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from worker.config import ModelShape

INIT_STD = 0.02  # GPT-2 / Llama reference init


class RMSNorm(nn.Module):
    """Root-mean-square norm: cheaper than LayerNorm and what Llama uses."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 even under bf16 autocast: the mean of squares loses precision.
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_tables(head_dim: int, max_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, shape (max_len, head_dim // 2), for rotating query/key pairs."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of x (batch, heads, seq, head_dim) by position-dependent angles."""
    seq = x.shape[-2]
    cos, sin = cos[:seq], sin[:seq]
    pairs = x.float().unflatten(-1, (-1, 2))
    real, imag = pairs[..., 0], pairs[..., 1]
    rotated = torch.stack((real * cos - imag * sin, real * sin + imag * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class Attention(nn.Module):
    """Causal grouped-query attention: `kv_heads` key/value heads shared by `heads` queries."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, shape.head_dim
        kv_dim = shape.kv_heads * shape.head_dim
        self.wq = nn.Linear(shape.hidden, shape.hidden, bias=False)
        self.wk = nn.Linear(shape.hidden, kv_dim, bias=False)
        self.wv = nn.Linear(shape.hidden, kv_dim, bias=False)
        self.wo = nn.Linear(shape.hidden, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Each kv head serves heads // kv_heads query heads; repeat it so SDPA sees equal counts.
        groups = self.heads // self.kv_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(shape.hidden, shape.ffn, bias=False)
        self.w3 = nn.Linear(shape.hidden, shape.ffn, bias=False)
        self.w2 = nn.Linear(shape.ffn, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm residual block: the unit FSDP, activation checkpointing and pipelining cut on."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(shape.hidden, shape.norm_eps)
        self.attention = Attention(shape)
        self.ffn_norm = RMSNorm(shape.hidden, shape.norm_eps)
        self.feed_forward = FeedForward(shape)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """Token ids (batch, seq) -> next-token logits (batch, seq, vocab)."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, shape: ModelShape, max_seq_len: int = 8192) -> None:
        super().__init__()
        self.shape = shape
        self.tok_embeddings = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(shape) for i in range(shape.layers)})
        self.norm = RMSNorm(shape.hidden, shape.norm_eps)
        self.output = nn.Linear(shape.hidden, shape.vocab, bias=False)
        # Not persistent: derived from the shape, so checkpoints hold only learned weights.
        cos, sin = rope_tables(shape.head_dim, max_seq_len, shape.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[1] > self.rope_cos.shape[0]:
            raise ValueError(
                f"sequence {tokens.shape[1]} exceeds max_seq_len {self.rope_cos.shape[0]}"
            )
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        return self.output(self.norm(h))

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Deterministic init from `seed`, identical on every rank and every attempt.

        Residual output projections (wo, w2) are scaled by 1/sqrt(2 * layers) so the
        residual stream's variance does not grow with depth (GPT-2's scheme).
        """
        generator = torch.Generator(device="cpu").manual_seed(seed)
        residual_std = INIT_STD / math.sqrt(2 * self.shape.layers)
        for name, param in self.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                continue
            std = residual_std if name.endswith(("wo.weight", "w2.weight")) else INIT_STD
            # Draw on CPU with our own generator: the same numbers whatever the device.
            values = torch.empty(param.shape, dtype=torch.float32).normal_(
                0.0, std, generator=generator
            )
            param.copy_(values)


def build_model(
    shape: ModelShape, seed: int, device: torch.device, max_seq_len: int
) -> Transformer:
    """A freshly initialised model on `device`."""
    model = Transformer(shape, max_seq_len=max_seq_len)
    model.init_weights(seed)
    return model.to(device)
