"""A Hugging Face Llama checkpoint folder as both sides see it: its `config.json` as a shape.

The service reads only `config.json` (and which weight files exist) to plan a run that starts
from published weights; the worker converts the weights themselves (worker/hf/). Both ask
`shape_from_hf_config` the same question, so a checkpoint the worker cannot train is
refused at submission with the same reason it would get inside a rank. The export writes
the inverse, `hf_config_from_shape`, next to the converted weights.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .files import read_small_text
from .model_shape import ModelShape

HF_CONFIG_FILE = "config.json"
HF_SINGLE_WEIGHTS = "model.safetensors"
HF_WEIGHTS_INDEX = "model.safetensors.index.json"  # sharded: names each tensor's file
# Transformers' LlamaConfig defaults, used where a config.json leaves a key out
# (transformers/models/llama/configuration_llama.py).
HF_DEFAULT_ROPE_THETA = 10_000.0
HF_DEFAULT_RMS_NORM_EPS = 1e-6
HF_DEFAULT_MAX_POSITIONS = 2048


class HfCheckpointError(ValueError):
    """A folder that is not a Llama-family safetensors checkpoint the worker can train."""


def _rope_theta(raw: dict[str, Any]) -> float:
    """RoPE's base, from `rope_parameters` (transformers 5) or top-level keys (4.x); refuses
    any scaling (Llama 3.1's "llama3", YaRN, linear...): the worker rotates unscaled."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    for where, block in (("rope_parameters", params), ("rope_scaling", scaling)):
        kind = block.get("rope_type", block.get("type", "default"))
        if kind != "default":
            raise HfCheckpointError(
                f"{where}.rope_type is {kind!r}: the worker supports unscaled RoPE only "
                "(rope_type 'default')"
            )
    return float(params.get("rope_theta", raw.get("rope_theta", HF_DEFAULT_ROPE_THETA)))


def shape_from_hf_config(raw: dict[str, Any]) -> ModelShape:
    """The worker's shape for a Hugging Face Llama `config.json`; HfCheckpointError says why
    the worker cannot train it. Tied embeddings are accepted: the worker unties them (its
    output head starts as a copy of the embedding), and the export writes both."""
    if raw.get("model_type") != "llama":
        raise HfCheckpointError(
            f"model_type is {raw.get('model_type')!r}: only Llama-family checkpoints "
            "(model_type 'llama') can be converted"
        )
    if raw.get("hidden_act", "silu") != "silu":
        raise HfCheckpointError(f"hidden_act is {raw['hidden_act']!r}: the worker uses SiLU")
    for bias in ("attention_bias", "mlp_bias"):
        if raw.get(bias):
            raise HfCheckpointError(f"{bias} is true: the worker's projections have no bias")
    rope_theta = _rope_theta(raw)
    try:
        hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
        shape = ModelShape(
            layers=int(raw["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            kv_heads=int(raw.get("num_key_value_heads") or heads),
            ffn=int(raw["intermediate_size"]),
            vocab=int(raw["vocab_size"]),
            rope_theta=rope_theta,
            norm_eps=float(raw.get("rms_norm_eps", HF_DEFAULT_RMS_NORM_EPS)),
        )
    except KeyError as exc:
        raise HfCheckpointError(f"config.json has no {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise HfCheckpointError(f"config.json describes no trainable shape: {detail}") from None
    head_dim = raw.get("head_dim")
    if head_dim is not None and int(head_dim) != shape.head_dim:
        raise HfCheckpointError(
            f"head_dim is {head_dim}, not hidden_size / num_attention_heads "
            f"({shape.head_dim}): the worker derives it"
        )
    if shape.head_dim % 2:
        raise HfCheckpointError(f"head_dim {shape.head_dim} is odd: RoPE rotates pairs")
    return shape


def hf_weight_files(folder: Path) -> list[str]:
    """The safetensors files holding the folder's weights (one, or the index's shards)."""
    index = folder / HF_WEIGHTS_INDEX
    if index.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise HfCheckpointError(f"cannot read {index}: {exc!r}") from None
        return sorted(set(weight_map.values()))
    if (folder / HF_SINGLE_WEIGHTS).is_file():
        return [HF_SINGLE_WEIGHTS]
    raise HfCheckpointError(
        f"{folder} has neither {HF_SINGLE_WEIGHTS} nor {HF_WEIGHTS_INDEX}: only safetensors "
        "checkpoints can be converted (save with safe_serialization=True)"
    )


def read_hf_checkpoint(folder: Path) -> ModelShape:
    """The shape of the checkpoint in `folder`, after checking its weight files exist."""
    path = folder / HF_CONFIG_FILE
    try:
        raw = json.loads(read_small_text(path))  # a FIFO or a device is refused, not read
    except FileNotFoundError:
        raise HfCheckpointError(f"{path} missing: not a Hugging Face model folder") from None
    except (OSError, ValueError) as exc:
        raise HfCheckpointError(f"cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise HfCheckpointError(f"{path} is not a JSON object")
    shape = shape_from_hf_config(raw)
    for name in hf_weight_files(folder):
        weights = folder / name
        if not weights.is_file():
            raise HfCheckpointError(f"{weights} missing (named by {HF_WEIGHTS_INDEX})")
        # Read as the run's owner (service/identity/as_owner.py), who is who its ranks run
        # as: a file only its writer may read (safetensors writes 0600) would otherwise fail
        # every rank with safetensors' own "No such file or directory".
        if not os.access(weights, os.R_OK):
            mode = weights.stat().st_mode & 0o777
            raise HfCheckpointError(
                f"{weights} is not readable by the run's owner (mode {mode:04o}): the run's "
                "ranks read it as its owner; make it readable to them (chmod or chown)"
            )
    return shape


def hf_config_from_shape(
    shape: ModelShape, max_position_embeddings: int = HF_DEFAULT_MAX_POSITIONS
) -> dict[str, Any]:
    """A `config.json` that transformers' LlamaForCausalLM builds `shape` from (untied head)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.ffn,
        "vocab_size": shape.vocab,
        "hidden_act": "silu",
        "rms_norm_eps": shape.norm_eps,
        # Both spellings: transformers 5 reads rope_parameters, 4.x reads rope_theta.
        "rope_theta": shape.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": shape.rope_theta},
        "max_position_embeddings": max_position_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
