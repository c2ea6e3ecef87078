"""The decoder: shapes, grouped-query attention, causality, parameter count, seeded init."""

from __future__ import annotations

import math

import pytest
import torch
from worker_helpers import TINY_MODEL

from contract import ModelShape
from worker.model import Transformer, apply_rope, build_model, rope_tables

SHAPE = ModelShape(**TINY_MODEL)


@pytest.fixture(scope="module")
def model() -> Transformer:
    return build_model(SHAPE, seed=0, device=torch.device("cpu"), max_seq_len=64).eval()


def test_logits_shape(model: Transformer) -> None:
    tokens = torch.randint(0, SHAPE.vocab, (3, 17))
    assert model(tokens).shape == (3, 17, SHAPE.vocab)


def test_parameter_count_matches_the_shape(model: Transformer) -> None:
    assert sum(p.numel() for p in model.parameters()) == SHAPE.num_params
    bigger = ModelShape(layers=3, hidden=96, heads=6, kv_heads=3, ffn=200, vocab=304)
    assert sum(p.numel() for p in Transformer(bigger).parameters()) == bigger.num_params


def test_a_vocabulary_no_tp_divides_is_padded_out_of_sight() -> None:
    """Vocabulary 300 (tp 8 does not divide it): both vocabulary layers hold 1,024 rows
    (Megatron's padding), the logits have 300 columns, and the real rows are drawn as an
    unpadded model's would be; the padded ones start at zero."""
    shape = ModelShape(layers=3, hidden=96, heads=6, kv_heads=3, ffn=200, vocab=300)
    model = build_model(shape, seed=0, device=torch.device("cpu"), max_seq_len=64)
    padding = shape.padded_vocab - shape.vocab
    assert shape.padded_vocab == 1024
    assert sum(p.numel() for p in model.parameters()) == shape.num_params + 2 * padding * 96
    assert model(torch.randint(0, 300, (2, 9))).shape == (2, 9, 300)
    divisible = build_model(
        shape.model_copy(update={"vocab": 304}), seed=0, device=torch.device("cpu"), max_seq_len=64
    )
    for name in ("tok_embeddings", "output"):
        padded = getattr(model, name).weight
        assert padded.shape[0] == 1024
        assert padded[300:].abs().sum() == 0
        # Vocabulary 304 is kept as it is (tp 8 divides it). Its first 300 rows are what a
        # 300-row draw gives (torch's CPU normal_ fills in order), so equal real rows say
        # that the padded model drew its real rows alone, not a 1,024-row tensor.
        assert torch.equal(padded[:300], getattr(divisible, name).weight[:300])


def test_future_tokens_do_not_change_past_logits(model: Transformer) -> None:
    tokens = torch.randint(0, SHAPE.vocab, (2, 32))
    changed = tokens.clone()
    changed[:, 20:] = torch.randint(0, SHAPE.vocab, (2, 12))
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :20], after[:, :20])
    assert not torch.allclose(before[:, 20:], after[:, 20:])


def test_grouped_query_attention_matches_a_reference(model: Transformer) -> None:
    """Query head h reads key/value head h // (heads / kv_heads), under a causal mask."""
    attention = model.layers["0"].attention
    assert attention.wk.weight.shape == (SHAPE.kv_heads * SHAPE.head_dim, SHAPE.hidden)
    x = torch.randn(2, 10, SHAPE.hidden)
    cos, sin = model.rope_cos, model.rope_sin
    with torch.no_grad():
        got = attention(x, cos, sin)
        q = attention.wq(x).view(2, 10, SHAPE.heads, SHAPE.head_dim).transpose(1, 2)
        k = attention.wk(x).view(2, 10, SHAPE.kv_heads, SHAPE.head_dim).transpose(1, 2)
        v = attention.wv(x).view(2, 10, SHAPE.kv_heads, SHAPE.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = SHAPE.heads // SHAPE.kv_heads
        heads = []
        for h in range(SHAPE.heads):
            scores = q[:, h] @ k[:, h // group].transpose(-1, -2) / math.sqrt(SHAPE.head_dim)
            scores = scores.masked_fill(torch.ones(10, 10).triu(1).bool(), float("-inf"))
            heads.append(scores.softmax(-1) @ v[:, h // group])
        expected = attention.wo(torch.stack(heads, dim=2).reshape(2, 10, SHAPE.hidden))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_rope_rotates_without_changing_length_and_depends_on_offset_only() -> None:
    cos, sin = rope_tables(head_dim=16, max_len=32, theta=10_000.0)
    # The same query and key vectors at every position, rotated by each position's angle.
    q, k = (
        torch.randn(1, 1, 1, 16).expand(1, 1, 32, 16),
        torch.randn(1, 1, 1, 16).expand(1, 1, 32, 16),
    )
    rq, rk = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1))
    # <q at position m, k at position n> depends only on m - n
    torch.testing.assert_close(rq[0, 0, 5] @ rk[0, 0, 2], rq[0, 0, 20] @ rk[0, 0, 17])


def test_init_is_seeded_and_scales_residual_projections() -> None:
    a, b = Transformer(SHAPE), Transformer(SHAPE)
    a.init_weights(seed=7)
    b.init_weights(seed=7)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    b.init_weights(seed=8)
    assert not torch.equal(a.output.weight, b.output.weight)
    wo_std = a.layers["0"].attention.wo.weight.std().item()
    assert wo_std == pytest.approx(0.02 / math.sqrt(2 * SHAPE.layers), rel=0.1)
    assert a.layers["1"].feed_forward.w1.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert torch.equal(a.norm.weight, torch.ones(SHAPE.hidden))
