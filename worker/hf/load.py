"""Load a Hugging Face Llama checkpoint's weights into this rank's part of the model.

Every rank opens the safetensors files (memory-mapped: a tensor is read when asked for) and,
for each parameter it holds, reads the whole Hugging Face tensor, converts it
(convert.from_hf) and keeps its own slice through the same `copy_into` the random init uses.
So any layout (FSDP shards, tensor-parallel slices, pipeline stages, any mix) loads the
checkpoint directly at the first attempt, with no conversion step and no second copy of
the weights on disk; later attempts resume from the run's own DCP checkpoints. The price is
that ranks holding slices of the same tensor each read all of it: on one node the page
cache serves the repeats.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from contract import HfCheckpointError, ModelShape, hf_weight_files, read_hf_checkpoint
from worker.errors import DoNotRetryError
from worker.hf.convert import HF_EMBEDDING, HF_HEAD, from_hf, hf_name
from worker.model import Transformer, canonical_name, copy_into


class HfWeights:
    """The tensors of a checkpoint folder by Hugging Face name, read on demand."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._stack = ExitStack()
        self._where: dict[str, Any] = {}
        for file in hf_weight_files(folder):
            handle = self._stack.enter_context(safe_open(folder / file, framework="pt"))
            self._where.update(dict.fromkeys(handle.keys(), handle))

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise DoNotRetryError(f"{self.folder} has no weight {name!r}")
        tensor: torch.Tensor = self._where[name].get_tensor(name)
        return tensor

    def close(self) -> None:
        self._stack.close()


def tied_embeddings(folder: Path) -> bool:
    config = json.loads((folder / "config.json").read_text())
    return bool(config.get("tie_word_embeddings", False))


def checked_shape(folder: Path, expected: ModelShape) -> None:
    """The folder still describes the shape the run was planned with (it may have changed
    since submission); refused alike on every rank, before any collective."""
    try:
        found = read_hf_checkpoint(folder)
    except HfCheckpointError as exc:
        raise DoNotRetryError(f"init_from_hf: {exc}") from None
    if found != expected:
        raise DoNotRetryError(
            f"init_from_hf: {folder}/config.json now describes {found.model_dump()}, not the "
            f"shape the run was planned with ({expected.model_dump()})"
        )


@torch.no_grad()
def load_hf_weights(part: Transformer, folder: Path) -> None:
    """Fill `part`'s parameters (sharded or not) from the checkpoint in `folder`, and its
    RoPE tables; used instead of `init_weights` on a run's fresh start."""
    checked_shape(folder, part.shape)
    tied = tied_embeddings(folder)
    weights = HfWeights(folder)
    try:
        for raw_name, param in part.named_parameters():
            name = canonical_name(raw_name)
            source = hf_name(name)
            if source == HF_HEAD and source not in weights and tied:
                source = HF_EMBEDDING  # tied: the worker's untied head starts as the embedding
            full = from_hf(name, weights.get(source), part.shape)
            if tuple(full.shape) != tuple(param.shape):
                raise DoNotRetryError(
                    f"init_from_hf: {source} has shape {tuple(full.shape)}, the model's "
                    f"{name} {tuple(param.shape)}"
                )
            copy_into(param, full.to(torch.float32))
    finally:
        weights.close()
    part.init_buffers()
