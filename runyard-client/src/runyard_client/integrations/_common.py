"""What both callbacks share: the report window, and where a checkpoint may be committed.

No framework import here: hf.py and lightning.py each bring their own.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path


class CheckpointFolderError(ValueError):
    """The framework would write its checkpoints outside the run's checkpoint folder, where
    runyard can neither record them (the service refuses such a path) nor resume from them."""


def is_inside(path: str | os.PathLike[str], folder: Path, *, strictly: bool) -> bool:
    """`path` lies in `folder` once both are resolved (links followed, as the service does);
    `strictly`: and is not the folder itself (a checkpoint is a file or folder inside it)."""
    resolved, root = Path(path).resolve(), folder.resolve()
    return resolved.is_relative_to(root) and not (strictly and resolved == root)


def require_inside(path: str | os.PathLike[str], folder: Path, setting: str) -> None:
    """Refuse, before the first step, a checkpoint location runyard could not resume from."""
    if not is_inside(path, folder, strictly=False):
        raise CheckpointFolderError(
            f"{setting} is {path}, outside the run's checkpoint folder {folder}: runyard "
            f"resumes only from checkpoints there; use the callback's folder ({setting}=...)"
        )


def num_bytes(path: Path) -> int:
    """The size of a checkpoint file, or of every file in a checkpoint folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def warn(message: str) -> None:
    print(f"[runyard] {message}", file=sys.stderr, flush=True)


@dataclass
class ReportWindow:
    """The optimizer steps since the last report and the tokens they trained on, all ranks
    together. A report may cover several steps (the framework's logging cadence); the
    session wants the tokens of one step, so the window hands out their mean."""

    last_step: int = 0
    num_tokens: int = 0

    def start(self, step: int) -> None:
        """Training (re)starts after `step`: nothing is pending."""
        self.last_step, self.num_tokens = step, 0

    def close(self, step: int) -> int | None:
        """Tokens per step over the steps up to `step`, and a new window from there; None
        when no step was trained since the last report (a repeated log of the same step)."""
        num_steps = step - self.last_step
        if num_steps <= 0:
            return None
        tokens_per_step = self.num_tokens // num_steps
        self.start(step)
        return tokens_per_step
