"""What `runyard run export` exports: which checkpoint, which tokenizer, and the call.

The export runs here, in the CLI's process, on a machine that sees the shared filesystem
and has the worker's dependencies (torch, safetensors): it reads the committed DCP
checkpoint directly (worker/hf/export.py), whatever layout and world size wrote it. The
service only says where the checkpoints are (always inside the run's own checkpoint folder:
it refuses a worker's report of any other path) and what shape the model has.

Whoever types it (the run's owner, a teammate, an admin) runs it with their own rights on
files the run's owner wrote, so nothing here or in the export unpickles or `torch.load`s
those files as code: the checkpoint is read as data only (worker/hf/dcp_reader.py), and
the tokenizer and dataset files are JSON read as JSON or copied as bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract import (
    DatasetIndexError,
    ModelShape,
    TokenizerIdentity,
    read_dataset_index,
)


class ExportChoiceError(Exception):
    """Nothing to export, or not from this machine; the message says what to do."""


@dataclass(frozen=True)
class ExportSource:
    """A committed checkpoint of a run and what its Hugging Face folder needs besides."""

    step: int
    path: Path
    shape: ModelShape
    max_positions: int
    tokenizer: Path | None
    tokenizer_sha256: str | None
    eos_id: int | None
    note: str | None  # why the tokenizer is missing, for people


def committed_checkpoint(rows: list[dict[str, Any]], step: int | None) -> tuple[int, Path]:
    """The newest committed checkpoint, or the one at `step`."""
    committed = sorted((c["step"], c["path"]) for c in rows if c["state"] == "COMMITTED")
    if not committed:
        raise ExportChoiceError("the run has no committed checkpoint yet")
    if step is None:
        found_step, path = committed[-1]
    else:
        matches = [c for c in committed if c[0] == step]
        if not matches:
            steps = ", ".join(str(s) for s, _ in committed)
            raise ExportChoiceError(f"no committed checkpoint at step {step} (committed: {steps})")
        found_step, path = matches[0]
    if not Path(path).is_dir():
        raise ExportChoiceError(
            f"{path} is not visible from this machine: run the export where the shared "
            "filesystem is mounted"
        )
    return found_step, Path(path)


def _data_tokenizer(data: str) -> TokenizerIdentity | None:
    if data == "builtin":
        return None
    try:
        return read_dataset_index(Path(data)).tokenizer
    except DatasetIndexError:
        return None  # the data folder is gone: nothing to check the tokenizer against


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def export_source(
    run: dict[str, Any], checkpoints: list[dict[str, Any]], step: int | None, tokenizer: Path | None
) -> ExportSource:
    """The checkpoint and tokenizer `runyard run export` writes for `run`. The tokenizer is
    `tokenizer` if given (the export refuses it if the data was tokenized with another),
    else the from_hf folder's when it is the data's, else none (with a note saying why)."""
    if run.get("model_shape") is None:
        raise ExportChoiceError("the service did not say the run's model shape (upgrade it)")
    shape = ModelShape.model_validate(run["model_shape"])
    found_step, path = committed_checkpoint(checkpoints, step)
    spec = run["spec"]
    identity = _data_tokenizer(spec.get("data", "builtin"))
    expected = identity.sha256 if identity else None
    note = None
    if tokenizer is None:
        model = spec.get("model")
        candidate = (
            Path(model["from_hf"]) if isinstance(model, dict) and "from_hf" in model else None
        )
        if candidate is not None and (candidate / "tokenizer.json").is_file():
            if expected is None or _sha256(candidate / "tokenizer.json") == expected:
                tokenizer = candidate
            else:
                note = f"{candidate}'s tokenizer is not the data's"
        if tokenizer is None and identity is not None:
            note = (note + "; " if note else "") + (
                f"the data was tokenized with {identity.name!r}: pass --tokenizer FOLDER "
                "to include it"
            )
    return ExportSource(
        step=found_step,
        path=path,
        shape=shape,
        max_positions=int(spec.get("seq_len", 2048)),
        tokenizer=tokenizer,
        tokenizer_sha256=expected,
        eos_id=identity.eos_id if identity else None,
        note=note,
    )
