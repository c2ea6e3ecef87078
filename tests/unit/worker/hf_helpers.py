"""A small random Hugging Face Llama checkpoint, made and saved with transformers itself
(no hub download), for the conversion tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

HF_SHAPE: dict[str, Any] = {
    "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
    "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
}  # fmt: skip


def save_random_llama(
    folder: Path,
    *,
    seed: int = 0,
    tied: bool = False,
    max_shard_size: str | None = None,
    vocab_size: int = HF_SHAPE["vocab_size"],
) -> dict[str, torch.Tensor]:
    """Save a random LlamaForCausalLM to `folder` (safetensors, sharded when asked) and
    return its tensors as saved. Norm weights are drawn too (they start as ones), so a norm
    loaded in the wrong place shows."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**(HF_SHAPE | {"vocab_size": vocab_size}), tie_word_embeddings=tied)
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(folder, **kwargs)
    saved: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        saved.update(load_file(file))
    return saved


def hf_logits(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    """Logits of the checkpoint in `folder` as transformers computes them (fp32, eager)."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    with torch.no_grad():
        logits: torch.Tensor = model(tokens).logits
    return logits
