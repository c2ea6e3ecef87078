"""Sharded checkpoints with torch.distributed.checkpoint (DCP) and commit markers.

A checkpoint is `<checkpoint_dir>/step_<NNNNNNNN>/`: the DCP files every rank wrote for its
own part, plus a `COMMITTED` marker rank 0 writes only after every rank finished. A folder
without the marker is a save that died half-way; it is never loaded and is pruned.

What is saved is a dict of Stateful objects under named keys (torchtitan's habit): the model
and optimizer through `torch.distributed.checkpoint.state_dict`, which understands DDP now
and FSDP/DTensor later (and reshards on load), the trainer's counters, and each rank's RNG.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from worker.config import ResumePoint
from worker.errors import CheckpointNotCommittedError
from worker.faults import maybe_crash
from worker.files import folder_size, remove_tree, write_atomic

MARKER = "COMMITTED"
_STEP_FOLDER = re.compile(r"^step_(\d{8})$")


def step_folder(checkpoint_dir: Path, step: int) -> Path:
    return checkpoint_dir / f"step_{step:08d}"


@dataclass
class TrainerState(Stateful):
    """The loop's counters. The data position is the step (see data.py), kept explicit."""

    step: int = 0
    data_step: int = 0
    consumed_tokens: int = 0

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step = int(state_dict["step"])
        self.data_step = int(state_dict["data_step"])
        self.consumed_tokens = int(state_dict["consumed_tokens"])


class ModelState(Stateful):
    """Model weights with wrapper prefixes (DDP's `module.`) stripped."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_model_state_dict(self.model, state_dict)


class OptimizerState(Stateful):
    """Optimizer state keyed by parameter name, so it survives a change of wrapping."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state_dict)


class RNGState(Stateful):
    """This rank's RNG streams (dropout, sampling); different on every rank."""

    def state_dict(self) -> dict[str, Any]:
        state = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["cpu"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state(state_dict["cuda"])


def training_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, trainer: TrainerState, rank: int
) -> dict[str, Stateful]:
    """What a checkpoint holds. The RNG key names the rank: DCP keeps one copy of each key
    (it deduplicates what it takes to be replicated), which would drop the other ranks'."""
    return {
        "model": ModelState(model),
        "optimizer": OptimizerState(model, optimizer),
        "trainer": trainer,
        f"rng_rank{rank}": RNGState(),
    }


@dataclass(frozen=True)
class SavedCheckpoint:
    path: Path
    num_bytes: int  # size on disk of the whole folder (0 on ranks other than 0)
    write_s: float


def save(checkpoint_dir: Path, step: int, state: dict[str, Stateful]) -> SavedCheckpoint:
    """Save collectively, then commit. Every rank must call it."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    path = step_folder(checkpoint_dir, step)
    start = time.perf_counter()
    if rank == 0 and path.exists():
        # Left by an attempt that died while saving this step (or that saved it before a
        # resume from an older step): its marker goes first, so it is never loaded half-gone.
        remove_tree(path, first=MARKER)
    dist.barrier()  # sync: nobody writes into the folder before the stale one is gone
    dcp.save(state, checkpoint_id=path)  # collective: each rank writes its part, rank 0 metadata
    dist.barrier()  # sync: every rank's files are complete before the commit
    maybe_crash("before_commit", step, rank)
    num_bytes = 0
    if rank == 0:
        marker = {"step": step, "world_size": world_size, "time": datetime.now(UTC).isoformat()}
        write_atomic(path / MARKER, json.dumps(marker).encode())
        num_bytes = folder_size(path)
    return SavedCheckpoint(path=path, num_bytes=num_bytes, write_s=time.perf_counter() - start)


def is_committed(path: Path) -> bool:
    return (path / MARKER).is_file()


def _step_folders(checkpoint_dir: Path) -> list[tuple[int, Path]]:
    """(step, folder) for every step folder, committed or not, oldest first."""
    if not checkpoint_dir.is_dir():
        return []
    found = []
    for child in checkpoint_dir.iterdir():
        match = _STEP_FOLDER.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_committed(checkpoint_dir: Path) -> ResumePoint | None:
    """The newest committed checkpoint in the folder, or None."""
    committed = [(step, path) for step, path in _step_folders(checkpoint_dir) if is_committed(path)]
    if not committed:
        return None
    step, path = committed[-1]
    return ResumePoint(step=step, path=str(path.resolve()))


def load(path: Path, state: dict[str, Stateful]) -> None:
    """Load a committed checkpoint into `state` in place. Every rank must call it."""
    if not is_committed(path):
        raise CheckpointNotCommittedError(f"{path} has no {MARKER} marker: refusing to load it")
    saved_keys = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    # A rank that did not exist when the checkpoint was written keeps its fresh RNG.
    wanted = {
        key: value
        for key, value in state.items()
        if not key.startswith("rng_rank") or any(k.startswith(f"{key}.") for k in saved_keys)
    }
    dcp.load(wanted, checkpoint_id=path)


def prune(checkpoint_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` committed checkpoints, and failed saves older than
    the newest commit. Rank 0 only, and only after a save committed. Returns what went."""
    folders = _step_folders(checkpoint_dir)
    committed = [(step, path) for step, path in folders if is_committed(path)]
    if not committed:
        return []
    newest_step = committed[-1][0]
    doomed = [path for _, path in committed[:-keep]]
    doomed += [path for step, path in folders if step < newest_step and not is_committed(path)]
    for path in doomed:
        remove_tree(path, first=MARKER)
    return sorted(doomed)
