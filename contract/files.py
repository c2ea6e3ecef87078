"""Reading the small files a run names (a dataset's index.json, a checkpoint's config.json)
without trusting what the path is: whoever names it may have made it a FIFO (a read that
never returns), a device (one that never ends) or a huge file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_SMALL_FILE_BYTES = 16 << 20  # an index of 100,000 shards is a few MB


def read_small_text(path: Path, limit: int = MAX_SMALL_FILE_BYTES) -> str:
    """The text of a regular file of at most `limit` bytes; ValueError for anything else,
    OSError (FileNotFoundError, PermissionError) as the OS says. Opened without blocking,
    so a FIFO is refused at once instead of waited on."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if found.st_size > limit:
            raise ValueError(f"{path} is {found.st_size} bytes, more than {limit}")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise ValueError(f"{path} grew past {limit} bytes while read")
        return b"".join(chunks).decode()
    finally:
        os.close(fd)
