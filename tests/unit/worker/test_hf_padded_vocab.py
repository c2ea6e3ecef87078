"""A vocabulary tensor parallel does not divide, through Hugging Face and back.

A random LlamaForCausalLM with 250 tokens (tp 4 and 8 do not divide it) loads into the
worker's model, whose vocabulary layers are padded to 1,024 rows; the logits match
transformers' (250 columns), and the export writes the 250-row tensors it was given, bit
for bit, with config.json's vocab_size 250.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from hf_helpers import hf_logits, save_random_llama
from safetensors.torch import load_file

from contract import read_hf_checkpoint
from worker.checkpoint import MARKER
from worker.hf.export import export_hf
from worker.hf.load import load_hf_weights
from worker.model import Transformer

VOCAB = 250
RTOL = 1e-4


def test_a_padded_vocabulary_loads_trains_its_real_rows_and_exports_unpadded(
    tmp_path: Path,
) -> None:
    source = tmp_path / "hf"
    saved = save_random_llama(source, vocab_size=VOCAB)
    shape = read_hf_checkpoint(source)
    assert (shape.vocab, shape.padded_vocab) == (VOCAB, 1024)
    model = Transformer(shape, max_seq_len=64)
    load_hf_weights(model, source)
    assert model.output is not None and model.output.weight.shape[0] == 1024
    assert model.output.weight[VOCAB:].abs().sum() == 0

    tokens = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model(tokens)
    want = hf_logits(source, tokens)
    assert ours.shape == want.shape == (2, 40, VOCAB)
    assert ((ours - want).norm() / want.norm()).item() < RTOL

    # The loss sees only real tokens: the padded rows get no gradient.
    torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
    assert model.output.weight.grad is not None
    assert model.output.weight.grad[VOCAB:].abs().sum() == 0
    assert model.output.weight.grad[:VOCAB].abs().sum() > 0

    checkpoint = tmp_path / "step_00000000"
    dcp.save({"model": model.state_dict()}, checkpoint_id=checkpoint, no_dist=True)
    (checkpoint / MARKER).write_text("{}")
    out = tmp_path / "exported"
    export_hf(checkpoint, shape, out)
    exported = load_file(out / "model.safetensors")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert exported[name].shape == (VOCAB, 64)
        assert torch.equal(exported[name], saved[name]), name
    assert json.loads((out / "config.json").read_text())["vocab_size"] == VOCAB
