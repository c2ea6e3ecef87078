"""Context parallel: the sequence sharded over cp ranks; attention gathers keys and values.

Load balance. Under a causal mask a token attends to every token before it, so late tokens
cost more than early ones. The sequence is cut into 2 x cp chunks and cp rank r holds chunks
r and 2cp-1-r (one early, one late), so every rank does the same attention work.

All-gather form (what Llama 3 used for its 128K stage, Llama 3 paper section 3.3.2): each
rank gathers the keys and values of the whole sequence from its cp group and computes the
attention of its own queries. With grouped-query attention K and V are heads/kv_heads
times smaller than Q, so the gather is cheap next to the attention itself. It is written on
functional collectives, which are autograd-aware (the backward of the all-gather is a
reduce-scatter of the K/V gradients) and run on gloo as well as NCCL; torch's experimental
`context_parallel` dispatches to CUDA-only SDPA kernels and so cannot run on the dev cluster.

Each rank's RoPE tables are the rows of its tokens' global positions, set once: every
sequence of a run has the same length, so the layout never changes.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.attention.bias import causal_lower_right

from worker.model import Transformer, repeat_kv


def rank_chunks(cp: int, cp_rank: int) -> tuple[int, int]:
    """The two of the 2 x cp sequence chunks this cp rank holds, in its local order."""
    return cp_rank, 2 * cp - 1 - cp_rank


def local_positions(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """Global positions of this rank's tokens, in local order."""
    chunk = seq_len // (2 * cp)
    first, second = rank_chunks(cp, cp_rank)
    return torch.cat(
        [
            torch.arange(first * chunk, (first + 1) * chunk),
            torch.arange(second * chunk, (second + 1) * chunk),
        ]
    )


def shard_sequence(x: torch.Tensor, cp: int, cp_rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's tokens of `x` along `dim` (token ids, targets: anything per token)."""
    if cp == 1:
        return x
    chunks = x.chunk(2 * cp, dim=dim)
    first, second = rank_chunks(cp, cp_rank)
    return torch.cat([chunks[first], chunks[second]], dim=dim)


class GatheredKVAttention:
    """Causal attention for one cp rank's queries against the whole sequence's K and V."""

    def __init__(self, cp_mesh: DeviceMesh, seq_len: int) -> None:
        self.mesh, self.cp, self.cp_rank = cp_mesh, cp_mesh.size(), cp_mesh.get_local_rank()
        self.chunk = seq_len // (2 * self.cp)
        # The gather concatenates every rank's two chunks in rank order; `natural` reorders
        # those positions into sequence order.
        gathered = torch.cat([local_positions(seq_len, self.cp, r) for r in range(self.cp)])
        self.natural = torch.argsort(gathered)
        # Causal with the diagonal at the bottom right: query j of a chunk sees keys up to
        # (visible - chunk + j). On GPUs this keeps SDPA on its fused kernels. Made once
        # here: creating the mask inside a checkpointed block trips selective recompute.
        self.masks = [
            causal_lower_right(self.chunk, (chunk_id + 1) * self.chunk)
            for chunk_id in rank_chunks(self.cp, self.cp_rank)
        ]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v: (batch, heads, 2 x chunk, head_dim), this rank's tokens in local order."""
        natural = self.natural.to(k.device)
        k_all, v_all = (
            funcol.all_gather_tensor_autograd(
                t.contiguous(), gather_dim=2, group=self.mesh
            ).index_select(2, natural)
            for t in (k, v)
        )
        k_all, v_all = repeat_kv(q, k_all, v_all)
        outs = []
        for i, chunk_id in enumerate(rank_chunks(self.cp, self.cp_rank)):
            q_chunk = q[:, :, i * self.chunk : (i + 1) * self.chunk]
            visible = (chunk_id + 1) * self.chunk  # keys up to the end of this chunk
            outs.append(
                F.scaled_dot_product_attention(
                    q_chunk, k_all[:, :, :visible], v_all[:, :, :visible], attn_mask=self.masks[i]
                )
            )
        return torch.cat(outs, dim=2)


def apply_context_parallel(model: Transformer, cp_mesh: DeviceMesh, seq_len: int) -> None:
    """Make `model` (a whole model or a pipeline stage) work on this rank's share of each
    sequence: attention gathers K/V over `cp_mesh`, RoPE uses the tokens' global positions.
    Before init_weights (which computes the RoPE tables from `rope_positions`)."""
    attention = GatheredKVAttention(cp_mesh, seq_len)
    for block in model.layers.values():
        block.attention.core = attention  # type: ignore[union-attr]
    model.rope_positions = local_positions(seq_len, cp_mesh.size(), cp_mesh.get_local_rank())
