"""Appending tokens to a split's shards, and the journal that makes a prepare resumable.

Units are written strictly in order. After each one the shards are fsynced, then one line
naming the unit and each split's token count is appended to the journal and fsynced. An
interrupt at any point leaves shards at least as long as the journal says; a resume cuts them
back to the journal's last line and goes on with the next unit. So no document is written
twice or lost, and the result is byte for byte the uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from contract.dataset import ShardFile


class ShardAppender:
    """One split's token stream as files of `shard_tokens` tokens each (the last shorter)."""

    def __init__(self, folder: Path, prefix: str, dtype: np.dtype, shard_tokens: int) -> None:
        self.folder, self.prefix, self.dtype = folder, prefix, dtype
        self.shard_tokens = shard_tokens
        self.num_tokens = 0
        self._touched: set[Path] = set()

    def _path(self, number: int) -> Path:
        return self.folder / f"{self.prefix}_{number:05d}.bin"

    def append(self, tokens: np.ndarray) -> None:
        position, data = self.num_tokens, tokens.astype(self.dtype, copy=False)
        while len(data):
            number, offset = divmod(position, self.shard_tokens)
            take = min(len(data), self.shard_tokens - offset)
            path = self._path(number)
            with open(path, "r+b" if path.exists() else "wb") as f:
                f.seek(offset * self.dtype.itemsize)
                f.write(data[:take].tobytes())
            self._touched.add(path)
            data, position = data[take:], position + take
        self.num_tokens = position

    def sync(self) -> None:
        """Make every write so far durable (before the journal says it happened)."""
        for path in self._touched:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._touched.clear()

    def cut_to(self, num_tokens: int) -> None:
        """Forget everything past `num_tokens` (written after the journal's last line)."""
        self.num_tokens = num_tokens
        last, offset = divmod(num_tokens, self.shard_tokens)
        for path in sorted(self.folder.glob(f"{self.prefix}_*.bin")):
            number = int(path.stem.rsplit("_", 1)[1])
            if number > last or (number == last and offset == 0):
                path.unlink()
            elif number == last:
                os.truncate(path, offset * self.dtype.itemsize)

    def shards(self) -> tuple[ShardFile, ...]:
        full, rest = divmod(self.num_tokens, self.shard_tokens)
        sizes = [self.shard_tokens] * full + ([rest] if rest else [])
        return tuple(
            ShardFile(file=self._path(n).name, num_tokens=size) for n, size in enumerate(sizes)
        )

    def sha256(self) -> str:
        """Of the whole stream as stored, read back from disk in 16 MiB blocks."""
        digest = hashlib.sha256()
        for shard in self.shards():
            with open(self.folder / shard.file, "rb") as f:
                while block := f.read(16 * 1024 * 1024):
                    digest.update(block)
        return digest.hexdigest()


class Journal:
    """JSON lines, one per finished unit, in unit order: {"unit", "train", "validation", ...}
    where train and validation are each split's token count after the unit."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[dict[str, Any]]:
        """The complete lines; a line torn by a crash, and anything after it, is dropped."""
        if not self.path.exists():
            return []
        entries: list[dict[str, Any]] = []
        keep = 0
        with open(self.path, "rb") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    break
                if not line.endswith(b"\n") or entry.get("unit") != len(entries):
                    break
                entries.append(entry)
                keep += len(line)
        os.truncate(self.path, keep)
        return entries

    def record(self, entry: dict[str, Any]) -> None:
        with open(self.path, "ab") as f:
            f.write(json.dumps(entry).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
