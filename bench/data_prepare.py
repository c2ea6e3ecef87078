"""`runyard data prepare` against the tokenizer's own batch speed, on the same input, in one run.

Corpus: this Python's standard-library sources as JSON lines, one module a document
(BENCH_PREPARE_MB, default 16 MB). Tokenizer: a 32,000-id byte-level BPE trained here with
`tokenizers` on the first 4 MB (no model hub is reachable). Reference: a freshly loaded
tokenizer's `encode_batch` over all documents held in memory, on all cores (its own Rust
thread pool), nothing read or written; `encode_batch_fast` (no character offsets) is shown
beside it. Ours: the whole prepare, end to end: starting the pool, reading and parsing the
file, tokenizing, the held-out split, writing and fsyncing shards, the journal, the sha256s
and the index. Each side runs three times, interleaved, and keeps its best (the machine is shared).
Target: the prepare at >= 80% of encode_batch's tokens/s.

    .venv/bin/python bench/data_prepare.py [--smoke]   # --smoke: 0.25 MB, 1,000 ids, 1 round
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.tokenizer_folders import train_bpe_folder
from worker.data_prepare import PrepareSettings, prepare_dataset

TARGET_RATIO = 0.8  # the target: at least 80% of the tokenizer's own batch speed
CORPUS_MB = float(os.environ.get("BENCH_PREPARE_MB", "16"))
VOCAB = 32_000  # Llama 2's vocabulary size
ROUNDS = 3
SAMPLE_MB = 4.0  # the tokenizer's training text
SMOKE_MB, SMOKE_VOCAB = 0.25, 1000


def stdlib_documents(max_bytes: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    documents, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        documents.append(text)
        total += len(text.encode())
        if total >= max_bytes:
            break
    return documents


def reference_rate(tokenizer_dir: Path, documents: list[str], fast: bool) -> tuple[float, int]:
    """Tokens/s of a fresh tokenizer's batch call (a fresh one: BPE caches words it saw)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    encode = tokenizer.encode_batch_fast if fast else tokenizer.encode_batch
    start = time.perf_counter()
    encodings = encode(documents, add_special_tokens=True)
    elapsed = time.perf_counter() - start
    num_tokens = sum(len(e.ids) for e in encodings)
    return num_tokens / elapsed, num_tokens


def prepare_rate(source: Path, tokenizer_dir: Path, out: Path, workers: int) -> tuple[float, int]:
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    index = prepare_dataset([source], tokenizer_dir, out, PrepareSettings(), workers)
    elapsed = time.perf_counter() - start
    assert index.validation is not None and index.num_documents is not None
    held_out = index.validation.num_tokens - index.validation.num_documents
    document_tokens = index.num_tokens - index.num_documents + held_out  # EOS not counted
    return document_tokens / elapsed, document_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{SMOKE_MB} MB, a {SMOKE_VOCAB}-id tokenizer, one round: seconds, no figure",
    )
    args = parser.parse_args()
    corpus_mb, sample_mb, vocab, rounds = CORPUS_MB, SAMPLE_MB, VOCAB, ROUNDS
    if args.smoke:
        corpus_mb, sample_mb, vocab, rounds = SMOKE_MB, SMOKE_MB, SMOKE_VOCAB, 1
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        root = Path(tmp)
        documents = stdlib_documents(int(corpus_mb * 1024 * 1024))
        size_mb = sum(len(d.encode()) for d in documents) / 2**20
        source = root / "corpus.jsonl"
        source.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
        start = time.perf_counter()
        sample = stdlib_documents(int(sample_mb * 1024 * 1024))
        tokenizer_dir = train_bpe_folder(root / "bpe", sample, vocab)
        print(f"corpus: {len(documents)} documents, {size_mb:.1f} MB; {cores} cores")
        trained_s = time.perf_counter() - start
        print(f"tokenizer: byte-level BPE, {vocab} ids, trained in {trained_s:.1f} s")
        best = {"encode_batch": 0.0, "encode_batch_fast": 0.0, "prepare": 0.0}
        counts = set()
        for round_number in range(1, rounds + 1):
            rate, count = reference_rate(tokenizer_dir, documents, fast=False)
            best["encode_batch"] = max(best["encode_batch"], rate)
            fast_rate, fast_count = reference_rate(tokenizer_dir, documents, fast=True)
            best["encode_batch_fast"] = max(best["encode_batch_fast"], fast_rate)
            ours, our_count = prepare_rate(source, tokenizer_dir, root / "out", cores)
            best["prepare"] = max(best["prepare"], ours)
            counts |= {count, fast_count, our_count}
            print(
                f"round {round_number}: encode_batch {rate:,.0f} tok/s, encode_batch_fast "
                f"{fast_rate:,.0f} tok/s, runyard data prepare ({cores} processes) "
                f"{ours:,.0f} tok/s"
            )
    same_tokens = len(counts) == 1
    ratio = best["prepare"] / best["encode_batch"]
    ratio_fast = best["prepare"] / best["encode_batch_fast"]
    print(f"same token count on every path: {same_tokens} ({counts.pop():,} tokens)")
    print(f"prepare / encode_batch: {ratio:.2f} (target >= {TARGET_RATIO})")
    print(f"prepare / encode_batch_fast: {ratio_fast:.2f} (for reference)")
    result = {
        "bench": "data_prepare",
        "smoke": args.smoke,
        "vocab": vocab,
        "corpus_mb": round(size_mb, 1),
        "cores": cores,
        "tokens_per_s": {k: round(v) for k, v in best.items()},
        "ratio_vs_encode_batch": round(ratio, 3),
        "ratio_vs_encode_batch_fast": round(ratio_fast, 3),
        "same_tokens": same_tokens,
        "target_ratio": TARGET_RATIO,
        "target_met": same_tokens and ratio >= TARGET_RATIO,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
