"""Reading a W&B run back from its run folders, as W&B itself stores it, with no network.

The SDK writes every record of a run (history rows, alerts, summary, exit) to
`run-<id>.wandb` in the run's folder, as protobuf `Record` messages of wandb's own schema
(`wandb.proto.wandb_internal_pb2`), framed as a LevelDB log: 32 KiB blocks of chunks, each
with a 7-byte header (checksum, length, type: full, first, middle or last piece), after a
7-byte file header (":W&B", a magic number, a version). wandb 0.31 reads these files only
in its Go core (`wandb sync`, `wandb beta leet`), so the framing is read here; the records
are wandb's. A run continued after a service restart has one folder per process, all with
the same run id: they are read in order.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BLOCK_BYTES = 32 * 1024  # LevelDB log format (leveldb/doc/log_format.md)
HEADER_BYTES = 7
FILE_MAGIC = b":W&B"
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def raw_records(path: Path) -> Iterator[bytes]:
    """Each record's bytes; a truncated last record (a writer killed mid-write) is skipped."""
    data = path.read_bytes()
    if data[:4] != FILE_MAGIC:
        raise ValueError(f"{path}: not a W&B run file (header {data[:7]!r})")
    position, pieces = HEADER_BYTES, b""
    while position + HEADER_BYTES <= len(data):
        room = BLOCK_BYTES - position % BLOCK_BYTES
        if room < HEADER_BYTES:  # a block's tail too short for a header is padding
            position += room
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[position : position + HEADER_BYTES])
        if kind == 0 and length == 0:  # zero padding to the block's end
            position += room
            continue
        chunk = data[position + HEADER_BYTES : position + HEADER_BYTES + length]
        position += HEADER_BYTES + length
        if len(chunk) < length:
            return
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pieces = chunk
        elif kind == MIDDLE:
            pieces += chunk
        elif kind == LAST:
            yield pieces + chunk
            pieces = b""


@dataclass
class WandbRunLog:
    """What a W&B run holds, merged over its folders."""

    history: dict[int, dict[str, Any]] = field(default_factory=dict)  # step -> row
    alerts: list[tuple[str, str]] = field(default_factory=list)  # (title, text)
    summary: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    exit_codes: list[int] = field(default_factory=list)
    num_folders: int = 0

    def values(self, key: str) -> dict[int, float]:
        """One history key by step."""
        return {step: row[key] for step, row in self.history.items() if key in row}

    def rows_logged(self, key: str) -> int:
        """How many history rows carried `key` (counts duplicates, which values() folds)."""
        return self._counts.get(key, 0)

    _counts: dict[str, int] = field(default_factory=dict)


def run_files(wandb_dir: Path, run_id: str) -> list[Path]:
    """The run's `.wandb` files under `wandb_dir` (the folder wandb.init(dir=...) got),
    oldest first."""
    folders = sorted((wandb_dir / "wandb").glob(f"*-{run_id}"))
    return [f for folder in folders for f in [folder / f"run-{run_id}.wandb"] if f.is_file()]


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def read_run(wandb_dir: Path, run_id: str) -> WandbRunLog:
    from wandb.proto import wandb_internal_pb2

    log = WandbRunLog()
    for path in run_files(wandb_dir, run_id):
        log.num_folders += 1
        for raw in raw_records(path):
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            try:
                record.ParseFromString(raw)
            except Exception:  # a damaged record: the rest of the file may still be good
                continue
            kind = record.WhichOneof("record_type")
            if kind == "history":
                row = {_key(item): json.loads(item.value_json) for item in record.history.item}
                step = int(row.get("_step", record.history.step.num))
                for key in row:
                    log._counts[key] = log._counts.get(key, 0) + 1
                log.history.setdefault(step, {}).update(row)
            elif kind == "alert":
                log.alerts.append((record.alert.title, record.alert.text))
            elif kind == "summary":
                for item in record.summary.update:
                    log.summary[_key(item)] = json.loads(item.value_json)
            elif kind == "config":
                for item in record.config.update:
                    log.config[_key(item)] = json.loads(item.value_json)
            elif kind == "run":
                for item in record.run.config.update:
                    log.config[_key(item)] = json.loads(item.value_json)
            elif kind == "exit":
                log.exit_codes.append(record.exit.exit_code)
    return log
