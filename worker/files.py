"""Small filesystem helpers shared by the data packer and the checkpointer."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename: readers see all or nothing."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def folder_size(folder: Path) -> int:
    """Bytes of all regular files under `folder`."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def remove_tree(folder: Path, first: str | None = None) -> None:
    """Delete `folder`; remove the file `first` before anything else (a commit marker, so a
    half-deleted folder never looks complete)."""
    if first is not None:
        (folder / first).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
