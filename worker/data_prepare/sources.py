"""What a corpus is made of: input files cut into units, and the documents of one unit.

A unit is the piece of input one pool process tokenizes at a time, and the granule the
journal records: a run of whole `.txt` files (one document each), a byte range of a `.jsonl`
file cut at line starts (one document per line), a run of Parquet row groups, or a row range
of a dataset saved with Hugging Face `datasets`. Units are planned once, from the inputs
alone, so an interrupted prepare resumes over exactly the same cut.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from pathlib import Path
from typing import Any

from .errors import PrepareError

UNIT_BYTES = 1024 * 1024  # of input text per unit: about a second of one core's tokenizing


class SourceKind(StrEnum):
    TEXT = "txt"  # a whole file is one document
    JSONL = "jsonl"  # one JSON object per line, its text field one document
    PARQUET = "parquet"  # one row per document
    HF_DATASET = "hf_dataset"  # a folder written by datasets' save_to_disk; one row a document


SUFFIXES = {".txt": SourceKind.TEXT, ".jsonl": SourceKind.JSONL, ".parquet": SourceKind.PARQUET}
TRAIN_SPLIT = "train"  # the split taken from a saved DatasetDict


@dataclass(frozen=True)
class Unit:
    """Documents [start, stop) of `paths` (TEXT: files; JSONL: bytes; PARQUET: row groups;
    HF_DATASET: rows)."""

    kind: SourceKind
    paths: tuple[str, ...]
    start: int
    stop: int

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "paths": list(self.paths),
            "range": [self.start, self.stop],
        }


def _is_hf_dataset(folder: Path) -> bool:
    return (folder / "dataset_dict.json").exists() or (folder / "state.json").exists()


def find_sources(paths: list[Path]) -> list[tuple[Path, SourceKind]]:
    """Every input file (folders searched recursively, sorted) with what it claims to be."""
    found: list[tuple[Path, SourceKind]] = []
    for path in paths:
        if path.is_dir() and _is_hf_dataset(path):
            found.append((path, SourceKind.HF_DATASET))
        elif path.is_dir():
            inside = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
            if not inside:
                raise PrepareError(
                    f"{path}: no .txt, .jsonl or .parquet files and not a saved `datasets` folder"
                )
            found += [(p, SUFFIXES[p.suffix]) for p in inside]
        elif path.is_file():
            if path.suffix not in SUFFIXES:
                raise PrepareError(
                    f"{path}: unsupported input (give .txt, .jsonl, .parquet files or a folder "
                    "saved with datasets' save_to_disk)"
                )
            found.append((path, SUFFIXES[path.suffix]))
        else:
            raise PrepareError(f"{path}: no such file or folder")
    return found


def fingerprint(sources: list[tuple[Path, SourceKind]]) -> list[list[Any]]:
    """(path, size, mtime) of every file read: a changed input makes a resume unsafe."""
    files = []
    for path, _ in sources:
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if f.is_file():
                stat = f.stat()
                files.append([str(f), stat.st_size, stat.st_mtime_ns])
    return files


def _jsonl_units(path: Path, unit_bytes: int) -> list[Unit]:
    size, units, start = path.stat().st_size, [], 0
    with open(path, "rb") as f:
        while start < size:
            f.seek(min(start + unit_bytes, size))
            f.readline()  # cut at the start of the next line
            stop = f.tell() if start + unit_bytes < size else size
            units.append(Unit(SourceKind.JSONL, (str(path),), start, stop))
            start = stop
    return units


def _parquet_units(path: Path, text_field: str, unit_bytes: int) -> list[Unit]:
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise PrepareError(f"{path}: not a Parquet file ({exc})") from None
    if text_field not in meta.schema.names:
        raise PrepareError(
            f"{path}: no column {text_field!r} (columns: {', '.join(meta.schema.names)}); "
            "name the text column with --text-field"
        )
    units, first, size = [], 0, 0
    for group in range(meta.num_row_groups):
        size += meta.row_group(group).total_byte_size
        if size >= unit_bytes or group == meta.num_row_groups - 1:
            units.append(Unit(SourceKind.PARQUET, (str(path),), first, group + 1))
            first, size = group + 1, 0
    return units


def _hf_units(path: Path, text_field: str, unit_bytes: int) -> list[Unit]:
    dataset = _load_hf_dataset(str(path))
    if text_field not in dataset.column_names:
        raise PrepareError(
            f"{path}: no column {text_field!r} (columns: {', '.join(dataset.column_names)}); "
            "name the text column with --text-field"
        )
    rows = dataset.num_rows
    per_row = max(1, dataset.data.nbytes // max(rows, 1))
    step = max(1, unit_bytes // per_row)
    return [
        Unit(SourceKind.HF_DATASET, (str(path),), start, min(start + step, rows))
        for start in range(0, rows, step)
    ]


def plan_units(
    sources: list[tuple[Path, SourceKind]], text_field: str, unit_bytes: int = UNIT_BYTES
) -> list[Unit]:
    """The whole corpus cut into units, in input order."""
    units: list[Unit] = []
    texts: list[str] = []
    texts_size = 0

    def close_texts() -> None:
        nonlocal texts, texts_size
        if texts:
            units.append(Unit(SourceKind.TEXT, tuple(texts), 0, len(texts)))
        texts, texts_size = [], 0

    for path, kind in sources:
        if kind is SourceKind.TEXT:  # consecutive small files share a unit
            texts.append(str(path))
            texts_size += path.stat().st_size
            if texts_size >= unit_bytes:
                close_texts()
            continue
        close_texts()
        if kind is SourceKind.JSONL:
            units += _jsonl_units(path, unit_bytes)
        elif kind is SourceKind.PARQUET:
            units += _parquet_units(path, text_field, unit_bytes)
        else:
            units += _hf_units(path, text_field, unit_bytes)
    close_texts()
    return units


@cache
def _load_hf_dataset(folder: str) -> Any:
    """The saved dataset (memory-mapped Arrow files), once per process; a DatasetDict's
    train split."""
    import datasets

    try:
        loaded = datasets.load_from_disk(folder)
    except Exception as exc:  # datasets raises FileNotFoundError, ValueError, ArrowInvalid...
        raise PrepareError(f"{folder}: not a dataset saved with save_to_disk ({exc})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if TRAIN_SPLIT not in loaded:
            raise PrepareError(
                f"{folder}: a DatasetDict without a {TRAIN_SPLIT!r} split "
                f"(splits: {', '.join(loaded)}); give the split's own folder"
            )
        loaded = loaded[TRAIN_SPLIT]
    return loaded


def _utf8(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PrepareError(f"{where}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def _jsonl_documents(unit: Unit, text_field: str) -> list[str]:
    path = unit.paths[0]
    with open(path, "rb") as f:
        f.seek(unit.start)
        block = f.read(unit.stop - unit.start)
    documents = []
    offset = unit.start
    for line in block.split(b"\n"):
        where = f"{path} at byte {offset}"
        offset += len(line) + 1
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise PrepareError(f"{where}: not a JSON line ({exc})") from None
        text = record.get(text_field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            raise PrepareError(
                f"{where}: no string field {text_field!r}; name it with --text-field"
            )
        documents.append(text)
    return documents


def read_documents(unit: Unit, text_field: str) -> list[str]:
    """The unit's documents, in order; PrepareError names the file and place that is not
    what its name claims."""
    if unit.kind is SourceKind.TEXT:
        return [_utf8(Path(p).read_bytes(), p) for p in unit.paths]
    if unit.kind is SourceKind.JSONL:
        return _jsonl_documents(unit, text_field)
    if unit.kind is SourceKind.PARQUET:
        import pyarrow.parquet as pq

        try:
            table = pq.ParquetFile(unit.paths[0]).read_row_groups(
                list(range(unit.start, unit.stop)), columns=[text_field]
            )
        except Exception as exc:  # a corrupt page: pyarrow's several error types
            raise PrepareError(f"{unit.paths[0]}: unreadable Parquet data ({exc})") from None
        column = table.column(text_field).to_pylist()
    else:
        dataset = _load_hf_dataset(unit.paths[0])
        column = dataset.select_columns([text_field])[unit.start : unit.stop][text_field]
    bad = next((i for i, text in enumerate(column) if not isinstance(text, str)), None)
    if bad is not None:
        first_row = unit.start if unit.kind is SourceKind.HF_DATASET else 0
        parquet = unit.kind is SourceKind.PARQUET
        where = f" (row groups {unit.start}..{unit.stop - 1})" if parquet else ""
        raise PrepareError(
            f"{unit.paths[0]}{where} row {first_row + bad}: {text_field!r} is "
            f"{type(column[bad]).__name__}, not text"
        )
    return column
