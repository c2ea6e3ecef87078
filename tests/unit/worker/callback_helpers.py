"""What the trainer-callback tests share: a standalone rank 0 whose reports land in a
JSON-lines file (runyard_client's metrics-file mode, RUNYARD_METRICS_FILE), the examples'
model and data, a check made at the moment of each commit, and SIGUSR2 sent mid-run."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from runyard_client import Session

REPO_ROOT = Path(__file__).resolve().parents[3]
# The examples' tiny Llama and byte data (examples/lightning_train.py imports hf_trainer).
sys.path.insert(0, str(REPO_ROOT / "examples"))

LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def standalone(
    monkeypatch: pytest.MonkeyPatch,
    root: Path,
    attempt: int = 1,
    resume: tuple[int, str] | None = None,
) -> Path:
    """This process as attempt `attempt` of a standalone run: rank 0, checkpoints in
    root/ckpt, reports appended to the file returned; `resume`: (step, path) as the service
    would hand them to the attempt. No launcher or Slurm variable of the machine's leaks
    in (pytest may run under srun)."""
    for name in list(os.environ):
        if name in LAUNCHER or name.startswith(("RUNYARD_", "SLURM_")):
            monkeypatch.delenv(name)
    metrics = root / f"attempt{attempt}.jsonl"
    monkeypatch.setenv("RUNYARD_CHECKPOINT_DIR", str(root / "ckpt"))
    monkeypatch.setenv("RUNYARD_METRICS_FILE", str(metrics))
    if resume is not None:
        monkeypatch.setenv("RUNYARD_RESUME_STEP", str(resume[0]))
        monkeypatch.setenv("RUNYARD_RESUME_PATH", resume[1])
    return metrics


def rows(metrics: Path, kind: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [row for row in found if row["kind"] == kind]


def losses(metrics: Path) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in rows(metrics, "metric")}


@dataclass
class CommitProbe:
    """Wraps a session's `committed` to look at the checkpoint at the moment it is
    committed: `complete(path, step)` says whether the framework has finished writing it."""

    complete: Callable[[Path, int], bool]
    seen: list[tuple[int, Path, bool]] = field(default_factory=list)

    def attach(self, session: Session) -> None:
        committed = session.committed

        def probe(step: int, path: str | Path, num_bytes: int = 0) -> bool:
            self.seen.append((step, Path(path), self.complete(Path(path), step)))
            return committed(step, path, num_bytes)

        session.committed = probe  # type: ignore[method-assign]


def time_limit_signal() -> None:
    """What Slurm sends before the time limit (the launcher forwards it to the script)."""
    os.kill(os.getpid(), signal.SIGUSR2)
