"""Read a DCP checkpoint's tensors as data only: nothing in its files can run code here.

Why not `dcp.load`: DCP's `.metadata` is a pickle, and DCP's reader opens it with a plain
`pickle.load`, which calls any function the file names. A checkpoint's files are written by
the run's job, that is by the run's owner (or by whatever the owner's training script
chose to write), and `runyard run export` runs as whoever types it: a teammate or an admin
exporting a colleague's run would run the colleague's code with their own rights. So:

- `.metadata` is unpickled by `MetadataUnpickler`, whose `find_class` hands out only the
  classes DCP's metadata is made of (METADATA_GLOBALS: what torch 2.13's FileSystemWriter
  writes, checked against the worker's own checkpoints) and whose constructors only store
  their arguments. Anything else is refused before it is called: `CheckpointHoldsCodeError`.
- Each tensor piece is `torch.load(..., weights_only=True)`: torch's own restricted
  unpickler, which rebuilds tensors and storages and calls nothing else (the same call DCP's
  FileSystemReader.read_data makes for tensors). Non-tensor values (DCP's BYTE_IO items,
  which DCP's planner opens with `weights_only=False`) are never read.
- Every piece must lie in a regular file directly in the checkpoint folder: a path with a
  folder in it, or a link, is refused, so the metadata cannot point the export elsewhere.

This reads a checkpoint whatever layout and world size wrote it, as DCP does: each saved
chunk is copied into its place in the whole tensor.
"""

from __future__ import annotations

import io
import os
import pathlib
import pickle
from collections import OrderedDict
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

import torch
from torch.distributed.checkpoint import filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

METADATA_FILE = ".metadata"  # DCP's name for it (torch.distributed.checkpoint.filesystem)

# The globals a DCP `.metadata` pickle names, each a class or function that only builds a
# value from its arguments (no I/O, no import, no call of anything it is given).
METADATA_GLOBALS: dict[tuple[str, str], Any] = {
    **{
        ("torch.distributed.checkpoint.metadata", name): getattr(dcp_metadata, name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "_MEM_FORMAT_ENCODING",  # an Enum: a call looks a member up
        )
    },
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): filesystem._StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,  # a dict lookup
    ("pathlib", "PosixPath"): pathlib.PosixPath,  # StorageMeta.checkpoint_id: no I/O
    ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
    ("collections", "OrderedDict"): OrderedDict,
    # dtypes are pickled by name (torch.float32): values, not callables.
    **{
        ("torch", name): value
        for name, value in vars(torch).items()
        if isinstance(value, torch.dtype)
    },
}


class UntrustedCheckpointError(Exception):
    """A checkpoint file the export will not read; the message names the file and why."""


class CheckpointHoldsCodeError(UntrustedCheckpointError):
    """A pickle in the checkpoint names something other than checkpoint data: code."""


class MetadataUnpickler(pickle.Unpickler):
    """`pickle.Unpickler` that resolves only METADATA_GLOBALS (Python's documented way to
    restrict unpickling: every global a pickle calls or builds passes through here)."""

    def __init__(self, file: IO[bytes], path: Path) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        allowed = METADATA_GLOBALS.get((module, name))
        if allowed is None:
            raise CheckpointHoldsCodeError(
                f"{self.path} holds code, not data: its pickle asks for {module}.{name}, which "
                "is no part of a checkpoint's metadata; refused, nothing in it was run"
            )
        return allowed

    def persistent_load(self, pid: Any) -> Any:
        raise UntrustedCheckpointError(f"{self.path} is not DCP metadata (a persistent id)")


def _open_own_file(folder: Path, name: object) -> IO[bytes]:
    """A regular file directly in `folder`, never through a link."""
    if not isinstance(name, str) or name in ("", ".", "..") or name != os.path.basename(name):
        raise UntrustedCheckpointError(
            f"{folder / METADATA_FILE} points at {name!r}, not at a file of the checkpoint folder"
        )
    path = folder / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        if path.is_symlink():  # O_NOFOLLOW's refusal (ELOOP)
            raise UntrustedCheckpointError(
                f"{path} is a link: a checkpoint reads its own files"
            ) from exc
        raise
    return os.fdopen(fd, "rb")


def read_metadata(folder: Path) -> Metadata:
    """The checkpoint's DCP metadata, unpickled with MetadataUnpickler and checked."""
    path = folder / METADATA_FILE
    with _open_own_file(folder, METADATA_FILE) as file:
        try:
            metadata = MetadataUnpickler(file, path).load()
        except UntrustedCheckpointError:
            raise
        except Exception as exc:  # a malformed pickle: anything pickle or a constructor raises
            raise UntrustedCheckpointError(f"{path} is not DCP metadata: {exc!r}") from None
    if not (
        isinstance(metadata, Metadata)
        and isinstance(metadata.state_dict_metadata, dict)
        and isinstance(metadata.storage_data, dict)
    ):
        raise UntrustedCheckpointError(f"{path} is not DCP metadata (a {type(metadata)})")
    return metadata


def _checked_tensor_meta(path: Path, fqn: str, meta: TensorStorageMetadata) -> None:
    """Shapes, dtype and chunk bounds are what a tensor's metadata must be, before any is
    used to allocate or slice."""
    properties, size = meta.properties, meta.size
    ok = (
        isinstance(properties, TensorProperties)
        and isinstance(properties.dtype, torch.dtype)
        and isinstance(size, torch.Size)
        and isinstance(meta.chunks, list)
    )
    for chunk in meta.chunks if ok else []:
        ok = ok and (
            isinstance(chunk, ChunkStorageMetadata)
            and isinstance(chunk.offsets, torch.Size)
            and isinstance(chunk.sizes, torch.Size)
            and len(chunk.offsets) == len(chunk.sizes) == len(size)
            and all(
                min(o, s) >= 0 and o + s <= n
                for o, s, n in zip(chunk.offsets, chunk.sizes, size, strict=True)
            )
        )
    if not ok:
        raise UntrustedCheckpointError(f"{path} describes {fqn} inconsistently")


def _checked_place(path: Path, fqn: str, info: object) -> filesystem._StorageInfo:
    """Where a chunk's bytes are, if the metadata says so plainly."""
    if not (
        isinstance(info, filesystem._StorageInfo)
        and isinstance(info.offset, int)
        and isinstance(info.length, int)
        and info.offset >= 0
        and info.length >= 0
    ):
        raise UntrustedCheckpointError(f"{path} does not say where {fqn} is stored")
    if getattr(info, "transform_descriptors", None):
        raise UntrustedCheckpointError(
            f"{path} stores {fqn} transformed ({info.transform_descriptors}): not read here"
        )
    return info


def _read_piece(
    file: IO[bytes], path: Path, fqn: str, info: filesystem._StorageInfo
) -> torch.Tensor:
    """One saved chunk: `info.length` bytes at `info.offset`, a `torch.save`d tensor."""
    file.seek(info.offset)
    raw = file.read(info.length)
    if len(raw) != info.length:
        raise UntrustedCheckpointError(f"{path} ends before {fqn}'s data")
    try:
        # weights_only: torch's restricted unpickler, tensors and storages only.
        piece = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UntrustedCheckpointError(f"{path}: {fqn} is not a tensor ({exc})") from None
    if not isinstance(piece, torch.Tensor):
        raise UntrustedCheckpointError(f"{path}: {fqn} is not a tensor")
    return piece


def read_tensors(folder: Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor whose DCP key starts with `prefix`, whole, by its key without it."""
    path = folder / METADATA_FILE
    metadata = read_metadata(folder)
    wanted = {
        fqn: meta
        for fqn, meta in metadata.state_dict_metadata.items()
        if isinstance(fqn, str) and fqn.startswith(prefix)
        if isinstance(meta, TensorStorageMetadata)
    }
    tensors: dict[str, torch.Tensor] = {}
    with ExitStack() as files:
        opened: dict[str, IO[bytes]] = {}
        for fqn, meta in wanted.items():
            _checked_tensor_meta(path, fqn, meta)
            # zeros, not empty: chunks that overlap could leave a hole the count below
            # misses; it then holds zeros, never what this process's memory held before.
            whole = torch.zeros(tuple(meta.size), dtype=meta.properties.dtype)
            covered = 0
            for chunk in meta.chunks:
                index = MetadataIndex(fqn, chunk.offsets)
                info = _checked_place(path, fqn, metadata.storage_data.get(index))
                name = info.relative_path
                if name not in opened:
                    opened[name] = files.enter_context(_open_own_file(folder, name))
                piece = _read_piece(opened[name], folder / name, fqn, info)
                if piece.shape != chunk.sizes or piece.dtype != whole.dtype:
                    raise UntrustedCheckpointError(
                        f"{folder / name}: a chunk of {fqn} is not the shape or dtype its "
                        "metadata says"
                    )
                region = tuple(
                    slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes, strict=True)
                )
                whole[region].copy_(piece)
                covered += piece.numel()
            if covered != whole.numel():
                raise UntrustedCheckpointError(f"{path}: the chunks of {fqn} do not cover it")
            tensors[fqn.removeprefix(prefix)] = whole
    return tensors
