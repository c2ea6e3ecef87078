"""Hugging Face weights -> runyard -> Hugging Face, in one process.

A random LlamaForCausalLM saved by transformers is loaded into the worker's model (q and k
rows reordered from halves to adjacent pairs), written as a committed DCP checkpoint, and
exported: the exported tensors equal the input bit for bit, transformers loads the exported
folder, and its logits equal the worker model's within 1e-4 relative. A wrong rotary
reordering (or none) moves the logits by far more than that.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hf_helpers import hf_logits, save_random_llama
from safetensors.torch import load_file

from contract import ModelShape, read_hf_checkpoint
from worker.checkpoint import MARKER
from worker.errors import DoNotRetryError
from worker.hf.convert import to_hf_rows, to_worker_rows
from worker.hf.export import ExportError, export_hf
from worker.hf.load import load_hf_weights
from worker.model import Transformer

RTOL = 1e-4  # the issue's bound on the logits' relative difference


def worker_model(folder: Path) -> Transformer:
    model = Transformer(read_hf_checkpoint(folder), max_seq_len=64)
    load_hf_weights(model, folder)
    return model


def committed_checkpoint(model: Transformer, path: Path) -> Path:
    """The model's weights saved as training saves them (DCP, key "model"), committed."""
    dcp.save({"model": model.state_dict()}, checkpoint_id=path, no_dist=True)
    (path / MARKER).write_text("{}")
    return path


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


def tokens() -> torch.Tensor:
    return torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(7))


def test_the_rotary_reordering_inverts_and_moves_rows() -> None:
    weight = torch.arange(8 * 3, dtype=torch.float32).view(8, 3)  # 2 heads of head_dim 4
    pairs = to_worker_rows(weight, heads=2)
    assert torch.equal(to_hf_rows(pairs, heads=2), weight)
    # Head 0: halves rows [0, 1 | 2, 3] interleave to pairs rows 0, 2, 1, 3.
    assert pairs[:, 0].tolist() == [0.0, 6.0, 3.0, 9.0, 12.0, 18.0, 15.0, 21.0]


@pytest.mark.parametrize("max_shard_size", [None, "40KB"], ids=["single", "sharded"])
def test_weights_round_trip_exactly_and_logits_match(
    tmp_path: Path, max_shard_size: str | None
) -> None:
    source = tmp_path / "hf"
    saved = save_random_llama(source, max_shard_size=max_shard_size)
    if max_shard_size:
        assert (source / "model.safetensors.index.json").is_file()
    model = worker_model(source)
    with torch.no_grad():
        ours = model(tokens())
    assert relative_error(ours, hf_logits(source, tokens())) < RTOL

    checkpoint = committed_checkpoint(model, tmp_path / "ckpt" / "step_00000000")
    out = tmp_path / "exported"
    export_hf(checkpoint, model.shape, out, max_shard_bytes=30_000)
    exported: dict[str, torch.Tensor] = {}
    for file in sorted(out.glob("*.safetensors")):
        exported.update(load_file(file))
    assert len(list(out.glob("*.safetensors"))) > 1  # shards, with their index
    assert sorted(exported) == sorted(saved)
    for name, tensor in saved.items():
        assert torch.equal(exported[name], tensor), name
    assert read_hf_checkpoint(out) == model.shape
    assert relative_error(hf_logits(out, tokens()), ours) < RTOL


def test_tied_embeddings_are_untied_into_the_head(tmp_path: Path) -> None:
    source = tmp_path / "hf"
    saved = save_random_llama(source, tied=True)
    assert "lm_head.weight" not in saved  # transformers stores a tied head once
    model = worker_model(source)
    assert model.output is not None and model.tok_embeddings is not None
    assert torch.equal(model.output.weight, model.tok_embeddings.weight)
    with torch.no_grad():
        assert relative_error(model(tokens()), hf_logits(source, tokens())) < RTOL


def test_a_folder_whose_shape_changed_since_planning_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "hf"
    save_random_llama(source)
    planned = read_hf_checkpoint(source).model_copy(update={"ffn": 256})
    with pytest.raises(DoNotRetryError, match="not the shape the run was planned with"):
        load_hf_weights(Transformer(planned, max_seq_len=64), source)


def test_export_refuses_an_uncommitted_checkpoint_and_a_used_folder(tmp_path: Path) -> None:
    source = tmp_path / "hf"
    save_random_llama(source)
    model = worker_model(source)
    checkpoint = committed_checkpoint(model, tmp_path / "step_00000001")
    (checkpoint / MARKER).unlink()
    with pytest.raises(ExportError, match="no COMMITTED marker"):
        export_hf(checkpoint, model.shape, tmp_path / "out")
    (checkpoint / MARKER).write_text("{}")
    with pytest.raises(ExportError, match="not an empty folder"):
        export_hf(checkpoint, model.shape, source)
    wrong = ModelShape(**(model.shape.model_dump() | {"layers": 3}))
    with pytest.raises(ExportError, match="lacks"):
        export_hf(checkpoint, wrong, tmp_path / "out")
    assert json.loads((source / "config.json").read_text())["model_type"] == "llama"
