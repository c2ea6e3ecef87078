"""Where a run's files live: its owner's folder under each root (jobs, checkpoints, the data
cache), the run's folder in it, and each attempt's. The reconciler and the API both ask."""

from __future__ import annotations

from pathlib import Path

from service.config import Settings
from service.models import Run, Sweep


def owner_root(root: Path, owner: Run | Sweep) -> Path:
    """Where a run's folders live under each root (jobs, checkpoints, the data cache): its
    owner's own folder, made for them by an admin (docs/install.md), so nobody else can make
    a run's folder first, plant files in it or squat its name."""
    return root / (owner.unix_user or "shared")


def checkpoint_folder(settings: Settings, run: Run) -> Path:
    return owner_root(settings.checkpoints_dir, run) / run_folder(run)


def attempt_folder(settings: Settings, run: Run, number: int) -> Path:
    return owner_root(settings.jobs_dir, run) / run_folder(run) / f"attempt-{number:03d}"


def owner_roots(settings: Settings, owner: Run | Sweep) -> tuple[Path, ...]:
    """The owner's folders a submission needs to exist and be theirs."""
    roots = (settings.jobs_dir, settings.checkpoints_dir, settings.data_cache_dir)
    return tuple(owner_root(root, owner) for root in roots)


def run_folder(run: Run) -> str:
    """The run's folder name under the checkpoint and job roots. The creation time makes it
    unique even if ids restart (a new database over old folders must never resume from, or
    prune against, another run's checkpoints)."""
    return f"run-{run.id:06d}-{run.created_at:%Y%m%dT%H%M%S}"
