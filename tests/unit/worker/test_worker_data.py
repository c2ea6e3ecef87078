"""Token shards and batch order: packed atomically, deterministic, blind to the dp degree."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import numpy as np
import pytest
import torch

from worker import data
from worker.data import (
    BUILTIN_MAX_BYTES,
    TokenBatches,
    TokenStream,
    ensure_builtin_corpus,
    open_corpus,
    stdlib_source_bytes,
    write_shards,
)


def test_builtin_corpus_is_the_stdlib_sources_capped_and_stable() -> None:
    text = stdlib_source_bytes()
    assert len(text) == BUILTIN_MAX_BYTES
    assert text == stdlib_source_bytes()
    assert b"def " in text[:100_000]


def test_packed_shards_hold_the_whole_corpus(data_cache_dir: Path) -> None:
    folder = data_cache_dir / data.BUILTIN_NAME
    index = json.loads((folder / data.INDEX_FILE).read_text())
    assert index["vocab"] == 256 and index["dtype"] == "uint8"
    sizes = [(folder / s["file"]).stat().st_size for s in index["shards"]]
    assert sizes == [s["num_tokens"] for s in index["shards"]]
    assert max(sizes) <= data.SHARD_TOKENS and sum(sizes) == index["num_tokens"]
    stream = TokenStream(folder)
    assert (
        stream.read(0, 1000).tobytes()
        == np.frombuffer(stdlib_source_bytes()[:1000], np.uint8).astype(np.int64).tobytes()
    )
    assert not [p for p in folder.iterdir() if p.name.startswith(".")], "temp files left behind"


def _pack(cache_dir: str) -> int:
    return TokenStream(ensure_builtin_corpus(Path(cache_dir))).num_tokens


def test_concurrent_packers_agree(tmp_path: Path) -> None:
    """Several processes packing at once (ranks of one run, or two runs sharing a cache)."""
    with multiprocessing.get_context("fork").Pool(4) as pool:
        counts = pool.map(_pack, [str(tmp_path)] * 4)
    assert counts == [BUILTIN_MAX_BYTES] * 4
    assert len(list((tmp_path / data.BUILTIN_NAME).glob("shard_*.bin"))) == 8


def test_a_folder_without_an_index_is_not_a_corpus(tmp_path: Path) -> None:
    (tmp_path / "shard_00000.bin").write_bytes(b"half")
    with pytest.raises(FileNotFoundError, match=r"index\.json"):
        open_corpus(str(tmp_path), tmp_path)


def test_folder_corpus_reads_across_shard_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(data, "SHARD_TOKENS", 100)
    tokens = np.arange(1000, dtype=np.uint16) * 7 % 1000
    write_shards(tmp_path, tokens, vocab=1000, source="test")
    stream = open_corpus(str(tmp_path), tmp_path / "unused")
    assert len(stream.shards) == 10 and stream.vocab == 1000
    np.testing.assert_array_equal(stream.read(95, 210), tokens[95:305])


def _global_batch(batches: TokenBatches, step: int, dp: int, mbs: int) -> torch.Tensor:
    """Reassemble step's global batch from every (micro step, dp rank) slice, in row order."""
    accum = batches.global_batch // (dp * mbs)
    rows = [
        batches.micro_batch(step, micro, rank, dp, mbs)[0]
        for micro in range(accum)
        for rank in range(dp)
    ]
    return torch.cat(rows)


def test_batches_are_deterministic_and_independent_of_dp(data_cache_dir: Path) -> None:
    stream = open_corpus("builtin", data_cache_dir)
    first = TokenBatches(stream, seq_len=64, global_batch=8, seed=3)
    again = TokenBatches(stream, seq_len=64, global_batch=8, seed=3)
    reference = _global_batch(first, step=5, dp=1, mbs=8)
    assert reference.shape == (8, 64)
    for dp, mbs in [(1, 1), (2, 2), (4, 1), (8, 1), (2, 4)]:
        torch.testing.assert_close(_global_batch(again, 5, dp, mbs), reference)
    assert not torch.equal(_global_batch(first, 6, 1, 8), reference)
    other_seed = TokenBatches(stream, seq_len=64, global_batch=8, seed=4)
    assert not torch.equal(_global_batch(other_seed, 5, 1, 8), reference)


def test_targets_are_inputs_shifted_by_one(data_cache_dir: Path) -> None:
    stream = open_corpus("builtin", data_cache_dir)
    inputs, targets = TokenBatches(stream, 64, 8, seed=0).micro_batch(2, 1, 1, 2, 2)
    assert inputs.dtype == targets.dtype == torch.int64
    torch.testing.assert_close(inputs[:, 1:], targets[:, :-1])


def test_epochs_visit_every_window_once(tmp_path: Path) -> None:
    write_shards(tmp_path, np.arange(101, dtype=np.uint8), vocab=256, source="test")
    batches = TokenBatches(open_corpus(str(tmp_path), tmp_path), seq_len=10, global_batch=2, seed=1)
    assert batches.num_windows == 10
    for epoch in range(3):
        starts = {int(batches.sequence(epoch * 10 + i)[0]) for i in range(10)}
        assert starts == set(range(0, 100, 10))
