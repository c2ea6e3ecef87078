"""A run's `data:` is checked at submission from the prepared folder's index.json: a dataset
whose vocabulary does not suit the model, or evaluation without a held-out split, is a 422
naming the field, before any Slurm job (the worker applies the same check)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contract.dataset import DatasetIndex, ShardFile, TokenizerIdentity, TokenSplit


def prepared(folder: Path, vocab: int) -> str:
    """A prepared dataset's index, as `runyard data prepare` writes it (the service reads
    nothing else of the folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    index = DatasetIndex(
        format=2,
        dtype="uint16" if vocab <= 65536 else "uint32",
        vocab=vocab,
        num_tokens=100_000,
        sha256="0" * 64,
        source="test corpus",
        shards=(ShardFile(file="train_000.bin", num_tokens=100_000),),
        num_documents=10,
        validation=TokenSplit(
            num_tokens=5_000, num_documents=1, sha256="0" * 64,
            shards=(ShardFile(file="val_000.bin", num_tokens=5_000),),
        ),
        tokenizer=TokenizerIdentity(
            name="bpe", sha256="1" * 64, vocab=vocab, eos_id=0, eos_token="<eos>"
        ),
    )  # fmt: skip
    (folder / "index.json").write_text(index.model_dump_json())
    return str(folder)


def spec(data: str, vocab: int, **extra: Any) -> dict[str, Any]:
    model = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": vocab}
    return {
        "name": "own-data", "model": model, "nodes": 1, "gpus_per_node": 1, "seq_len": 128,
        "global_batch": 4, "steps": 10, "checkpoint_every": 5, "data": data, **extra,
    }  # fmt: skip


def test_a_dataset_that_suits_the_model_is_accepted_with_evaluation(
    api: Any, shared_path: Path
) -> None:
    data = prepared(shared_path / "ok", vocab=1000)
    created = api.post("/v1/runs", json=spec(data, vocab=1024, eval_every=5))
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["eval_every"] == 5


def test_a_vocabulary_the_model_cannot_embed_is_refused_at_submission(
    api: Any, shared_path: Path
) -> None:
    data = prepared(shared_path / "wide", vocab=128_256)
    refused = api.post("/v1/runs", json=spec(data, vocab=32_000))
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith("model.vocab: "), refused.text
    assert "128256 token ids" in refused.json()["detail"]


def test_a_folder_that_was_never_prepared_is_refused_naming_data(
    api: Any, shared_path: Path
) -> None:
    refused = api.post("/v1/runs/dry-run", json=spec(str(shared_path / "nothing"), vocab=1024))
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith("data: ") and "runyard data prepare" in refused.text


def test_evaluation_needs_a_held_out_split(api: Any) -> None:
    refused = api.post("/v1/runs", json=spec("builtin", vocab=256, eval_every=10))
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith("eval_every: "), refused.text


def test_an_index_that_is_a_fifo_or_a_device_is_refused_at_once(
    api: Any, shared_path: Path
) -> None:
    """Whoever names the folder made its index.json: a FIFO would hold the submission (and
    its database connection) until the owner's read timed out, a device would never end."""
    import os
    import time

    fifo = shared_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "index.json", 0o644)
    device = shared_path / "zero"
    device.mkdir()
    (device / "index.json").symlink_to("/dev/zero")
    for folder in (fifo, device):
        started = time.monotonic()
        refused = api.post("/v1/runs/dry-run", json=spec(str(folder), vocab=1024))
        assert refused.status_code == 422, refused.text
        assert "not a regular file" in refused.json()["detail"]
        assert time.monotonic() - started < 15, "refused, not waited on"
