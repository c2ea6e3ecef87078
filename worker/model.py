"""A Llama-style decoder: architecture only, no parallelism.

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU MLP, with an
untied output head. Blocks live in `Transformer.layers` (a ModuleDict keyed "0", "1", ...)
so that FSDP, tensor parallel, activation checkpointing and pipeline stages apply per block
without touching this file; `parallel/` owns those wrappers. The model can be built on the
meta device and initialised after it was sharded (`init_weights` writes each rank's part).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from contract import ModelShape

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


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention over one whole sequence: (batch, heads, seq, head_dim) each, with k
    and v already repeated to the query heads. Context parallel swaps in its own."""
    k, v = repeat_kv(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    """Causal grouped-query attention: `kv_heads` key/value heads shared by `heads` queries.

    Head counts are read off the projections' outputs (`-1` in the views), not the shape,
    so the same code runs on a tensor-parallel rank that holds heads / tp of them.
    """

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.head_dim = shape.head_dim
        kv_dim = shape.kv_heads * shape.head_dim
        self.wq = nn.Linear(shape.hidden, shape.hidden, bias=False)
        self.wk = nn.Linear(shape.hidden, kv_dim, bias=False)
        self.wv = nn.Linear(shape.hidden, kv_dim, bias=False)
        self.wo = nn.Linear(shape.hidden, shape.hidden, bias=False)
        self.core: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = (
            causal_attention
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.wq(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Each kv head serves heads // kv_heads query heads; repeat it so SDPA sees equal counts.
        # Context parallel gathers k and v across ranks inside `core`, before this repeat
        # would multiply what it sends; so the repeat happens there, after the gather.
        out = self.core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


def repeat_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """k and v with each head repeated for the query heads that share it."""
    groups = q.shape[1] // k.shape[1]
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


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
    """Token ids (batch, seq) -> next-token logits (batch, seq, vocab).

    A pipeline stage is this class with some parts removed: blocks deleted from `layers`
    (the others keep their keys, so parameter names match the whole model's), and
    `tok_embeddings` or `norm` / `output` set to None off the first and last stage. A stage
    without embeddings takes the previous stage's hidden states instead of token ids.
    """

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, shape: ModelShape, max_seq_len: int = 8192) -> None:
        super().__init__()
        self.shape, self.max_seq_len = shape, max_seq_len
        # Both vocabulary layers have shape.padded_vocab rows, so that every tp in a node
        # divides them (Megatron's padding); forward() drops the padded logits.
        rows = shape.padded_vocab
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(rows, shape.hidden)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(shape) for i in range(shape.layers)})
        self.norm: RMSNorm | None = RMSNorm(shape.hidden, shape.norm_eps)
        self.output: nn.Linear | None = nn.Linear(shape.hidden, rows, bias=False)
        # Positions of this rank's tokens, when they are not 0..seq-1 (context parallel).
        self.rope_positions: torch.Tensor | None = None
        # Not persistent: derived from the shape, so checkpoints hold only learned weights.
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        if not self.output.weight.is_meta:  # built on the meta device: init_weights fills them
            self.init_buffers()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """Compute the RoPE tables on the parameters' device (after a meta-device build)."""
        cos, sin = rope_tables(self.shape.head_dim, self.max_seq_len, self.shape.rope_theta)
        if self.rope_positions is not None:
            cos, sin = cos[self.rope_positions], sin[self.rope_positions]
        device = self.rope_cos.device if self.rope_cos.device.type != "meta" else None
        device = device or next(iter(self.parameters())).device
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[1] > self.rope_cos.shape[0]:
            raise ValueError(
                f"sequence {tokens.shape[1]} exceeds the RoPE table ({self.rope_cos.shape[0]})"
            )
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        h = self.norm(h) if self.norm is not None else h
        if self.output is None:
            return h
        logits = self.output(h)
        # The padded rows are no token: their logits never reach the loss or the caller,
        # so they get no gradient and stay at their zero init.
        if self.shape.padded_vocab != self.shape.vocab:
            logits = logits[..., : self.shape.vocab]
        return logits

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Deterministic init from `seed`, identical on every rank, attempt and layout.

        Each parameter draws from its own generator, seeded by `seed` and its name, so a
        pipeline stage holding some of the blocks gets exactly the values the whole model
        would; a tensor-parallel or FSDP shard copies its slice of the same full tensor.
        Residual output projections (wo, w2) are scaled by 1/sqrt(2 * layers) so the
        residual stream's variance does not grow with depth (GPT-2's scheme).
        """
        residual_std = INIT_STD / math.sqrt(2 * self.shape.layers)
        for raw_name, param in self.named_parameters():
            name = canonical_name(raw_name)
            if name.endswith("norm.weight"):
                full = torch.ones(param.shape)
            else:
                std = residual_std if name.endswith(("wo.weight", "w2.weight")) else INIT_STD
                generator = torch.Generator(device="cpu").manual_seed(_name_seed(seed, name))
                # Drawn on CPU in fp32: the same numbers whatever the device and dtype. The
                # vocabulary layers draw their real rows only; padded rows start at zero.
                drawn = unpadded_shape(name, param.shape, self.shape)
                full = pad_vocab_rows(
                    name, torch.empty(drawn).normal_(0.0, std, generator=generator), self.shape
                )
            copy_into(param, full)
        self.init_buffers()


VOCAB_LAYERS = ("tok_embeddings.weight", "output.weight")  # rows indexed by token id


def unpadded_shape(name: str, shape: torch.Size, model: ModelShape) -> tuple[int, ...]:
    """A parameter's shape without the vocabulary padding (only the vocabulary layers have
    any): what Hugging Face holds, and what the random init draws."""
    if name in VOCAB_LAYERS:
        return (model.vocab, *shape[1:])
    return tuple(shape)


def pad_vocab_rows(name: str, full: torch.Tensor, model: ModelShape) -> torch.Tensor:
    """Parameter `name`'s full tensor with zero rows added up to the padded vocabulary if it
    is a vocabulary layer; any other as it is."""
    if name not in VOCAB_LAYERS or full.shape[0] == model.padded_vocab:
        return full
    padding = full.new_zeros((model.padded_vocab - model.vocab, *full.shape[1:]))
    return torch.cat([full, padding])


def canonical_name(name: str) -> str:
    """A parameter's name in the plain model: wrapper segments (activation checkpointing,
    torch.compile) removed, as DCP's state dicts remove them."""
    for wrapper in ("_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(wrapper, "")
    return name


def _name_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def copy_into(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a full tensor into a parameter, or into this rank's part of a DTensor one."""
    if isinstance(param, DTensor):
        # src_data_rank=None: every rank holds the same full tensor, so each takes its own
        # slice locally instead of receiving it from rank 0.
        local = distribute_tensor(
            full.to(param.dtype), param.device_mesh, param.placements, src_data_rank=None
        ).to_local()
        param.to_local().copy_(local)
    else:
        param.copy_(full)


def build_model(
    shape: ModelShape, seed: int, device: torch.device, max_seq_len: int
) -> Transformer:
    """A freshly initialised, unparallelised model on `device`."""
    model = Transformer(shape, max_seq_len=max_seq_len)
    model.init_weights(seed)
    return model.to(device)
