"""Token shards and the deterministic batch order.

On disk a corpus is a folder of flat token files (`shard_00000.bin`, ...) plus `index.json`
naming them; `index.json` is written last, so a folder with an index is complete. The
builtin corpus needs no download: the bytes of this Python's own standard-library sources
(byte-level tokens, vocab 256), packed once under `<data_cache_dir>/builtin-v1/`. A team's own
corpus comes from `runyard data prepare` (worker/data_prepare/): the same shards, plus a
held-out "validation" split and the tokenizer's identity (contract.dataset.DatasetIndex).

Which sequences make up a step depends only on (seed, step): global sequence
`step * global_batch + j` maps to a window of the token stream through a seeded bijection.
How the global batch is cut across dp ranks and micro steps does not change its contents,
so a resume on another dp degree sees the same data, and the data position is the step.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import platform
import sysconfig
from pathlib import Path

import numpy as np
import torch

from contract.dataset import INDEX_FILE, read_dataset_index
from worker.files import write_atomic

BUILTIN_NAME = "builtin-v1"
BUILTIN_MAX_BYTES = 8 * 1024 * 1024  # enough text for the tiny models to learn from
SHARD_TOKENS = 1024 * 1024  # 1 MiB of uint8 per shard
_DTYPES = {"uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32}


def write_shards(folder: Path, tokens: np.ndarray, vocab: int, source: str) -> None:
    """Pack a flat token array into shards plus an index, each file written atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    for number, start in enumerate(range(0, len(tokens), SHARD_TOKENS)):
        chunk = tokens[start : start + SHARD_TOKENS]
        name = f"shard_{number:05d}.bin"
        write_atomic(folder / name, chunk.tobytes())
        shards.append({"file": name, "num_tokens": len(chunk)})
    index = {
        "format": 1,
        "dtype": tokens.dtype.name,
        "vocab": vocab,
        "num_tokens": len(tokens),
        "sha256": hashlib.sha256(tokens.tobytes()).hexdigest(),  # to compare two packings
        "source": source,
        "shards": shards,
    }
    write_atomic(folder / INDEX_FILE, json.dumps(index, indent=2).encode())


def stdlib_source_bytes(max_bytes: int = BUILTIN_MAX_BYTES) -> bytes:
    """The standard library's .py files, sorted by relative path, concatenated, capped."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):
        # Installed packages are not the standard library and differ between machines.
        subfolders[:] = [d for d in subfolders if d not in ("site-packages", "__pycache__")]
        files += [Path(folder, n).relative_to(root).as_posix() for n in names if n.endswith(".py")]
    parts, total = [], 0
    for relative in sorted(files):
        text = (root / relative).read_bytes()
        parts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    return b"".join(parts)[:max_bytes]


def ensure_builtin_corpus(cache_dir: Path) -> Path:
    """Pack the builtin corpus once; safe to call from any number of processes at once.

    A file lock serialises concurrent packers on one filesystem; the atomic writes keep
    a reader that ignores the lock (or another node on a non-shared disk) from ever
    seeing a half-written shard.
    """
    folder = cache_dir / BUILTIN_NAME
    if (folder / INDEX_FILE).exists():
        return folder
    cache_dir.mkdir(parents=True, exist_ok=True)
    with open(cache_dir / f".{BUILTIN_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / INDEX_FILE).exists():  # another process may have packed it meanwhile
            tokens = np.frombuffer(stdlib_source_bytes(), dtype=np.uint8)
            source = f"Python {platform.python_version()} stdlib {sysconfig.get_paths()['stdlib']}"
            write_shards(folder, tokens, vocab=256, source=source)
    return folder


class TokenStream:
    """One split of a corpus, all its shards as one read-only token sequence (memory-mapped).

    `split` is "train" (the index's `shards`) or "validation" (the held-out split a prepared
    dataset has; the builtin corpus has none).
    """

    def __init__(self, folder: Path, split: str = "train") -> None:
        index_path = folder / INDEX_FILE
        if not index_path.exists():
            raise FileNotFoundError(f"{index_path} missing: not a packed token folder")
        index = read_dataset_index(folder)
        if split == "train":
            shards = index.shards
        elif split == "validation" and index.validation is not None:
            shards = index.validation.shards
        else:
            raise ValueError(f"{folder} has no {split!r} split")
        dtype = _DTYPES[index.dtype]
        self.index = index
        self.vocab: int = index.vocab
        self.shards = [
            np.memmap(folder / s.file, dtype=dtype, mode="r", shape=(s.num_tokens,))
            for s in shards
            if s.num_tokens  # numpy cannot map an empty file
        ]
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])
        self.num_tokens = int(self.starts[-1])

    def read(self, offset: int, length: int) -> np.ndarray:
        """Tokens [offset, offset + length), crossing shard boundaries when needed."""
        pieces, end = [], offset + length
        shard = int(np.searchsorted(self.starts, offset, side="right")) - 1
        while offset < end:
            local = offset - int(self.starts[shard])
            take = min(end - offset, len(self.shards[shard]) - local)
            pieces.append(self.shards[shard][local : local + take])
            offset += take
            shard += 1
        return np.concatenate(pieces).astype(np.int64)


class TokenBatches:
    """(inputs, targets) for any (step, micro step, dp rank), from (seed, step) alone.

    The stream is cut into non-overlapping windows of seq_len + 1 tokens. Epoch e visits
    them in the order i -> (a * i + b) mod n with a coprime to n: a seeded bijection that
    costs O(1) memory however large the corpus (a stored permutation would not).
    """

    def __init__(self, stream: TokenStream, seq_len: int, global_batch: int, seed: int) -> None:
        self.stream, self.seq_len, self.global_batch, self.seed = (
            stream,
            seq_len,
            global_batch,
            seed,
        )
        self.num_windows = (stream.num_tokens - 1) // seq_len
        if self.num_windows < 1:
            raise ValueError(f"data has {stream.num_tokens} tokens, fewer than seq_len + 1")
        self._epoch_maps: dict[int, tuple[int, int]] = {}

    def _epoch_map(self, epoch: int) -> tuple[int, int]:
        if epoch not in self._epoch_maps:
            rng = np.random.default_rng([self.seed, epoch])
            n = self.num_windows
            a = int(rng.integers(1, max(n, 2)))
            while math.gcd(a, n) != 1:
                a += 1
            self._epoch_maps[epoch] = (a, int(rng.integers(0, n)))
        return self._epoch_maps[epoch]

    def sequence(self, index: int) -> np.ndarray:
        """Global sequence `index` (seq_len + 1 tokens)."""
        epoch, position = divmod(index, self.num_windows)
        a, b = self._epoch_map(epoch)
        window = (a * position + b) % self.num_windows
        return self.stream.read(window * self.seq_len, self.seq_len + 1)

    def micro_batch(
        self, step: int, micro_step: int, dp_rank: int, dp_degree: int, micro_batch_size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's slice of step `step`: rows j = (micro_step * dp + dp_rank) * mbs + b."""
        first = (micro_step * dp_degree + dp_rank) * micro_batch_size
        if first + micro_batch_size > self.global_batch:
            raise ValueError(
                f"micro step {micro_step} on dp rank {dp_rank} is past the global batch"
            )
        rows = [
            self.sequence(step * self.global_batch + first + b) for b in range(micro_batch_size)
        ]
        block = torch.from_numpy(np.stack(rows))
        return block[:, :-1], block[:, 1:]  # targets are the inputs shifted left by one token


def open_corpus(data: str, cache_dir: Path, split: str = "train") -> TokenStream:
    """The token stream for config.data: "builtin" (packed on demand) or a shard folder
    (`runyard data prepare` writes one, with a "validation" split beside "train")."""
    folder = ensure_builtin_corpus(cache_dir) if data == "builtin" else Path(data)
    return TokenStream(folder, split)
