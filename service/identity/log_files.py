"""Reading a rank's output file in chunks that end at a line break. Plain file reading, no
service imports: the owner's process (service/identity/as_owner.py) runs it with the
owner's rights."""

from __future__ import annotations

from pathlib import Path


def read_chunk(path: Path, offset: int, limit: int, *, complete: bool) -> tuple[bytes, int]:
    """Bytes from `offset` (at most `limit`), cut after the last line break unless the file
    is `complete` and fully read; returns them with the file's size."""
    with path.open("rb") as f:
        size = f.seek(0, 2)
        f.seek(min(offset, size))
        data = f.read(limit)
    reached_end = offset + len(data) >= size
    if complete and reached_end:
        return data, size
    if b"\n" in data:
        return data[: data.rindex(b"\n") + 1], size
    # No line break: at the end of a live file the line is still being written (wait for
    # it); short of the end it is a line longer than `limit` (hand it over in pieces).
    return (b"" if reached_end else data), size
