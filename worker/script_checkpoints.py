"""Checkpoints a script saves by itself (`resume: {save_flag, flag}` in a run spec), found
complete by their own layout's marker and committed by the launcher on rank 0.

The launcher hands the script the run's checkpoint folder through `save_flag`; the script
saves there as it always does. Directly in that folder, these are checkpoints:

- torchtitan: a `step-N` folder, complete once DCP's `.metadata` is in it (DCP writes it
  last, on rank 0, after every rank's files);
- Hugging Face Trainer: a `checkpoint-N` folder, complete once `trainer_state.json` is in it
  (written after the weights, the optimizer and the RNG states);
- Lightning: a `.ckpt` file named with `step=N` (the default `epoch=E-step=N.ckpt`) or
  `step-N.ckpt` / `step_N.ckpt`, complete once a later one exists or the script exited 0
  (a file is written in one go, and the next save starts after the last one closed; the
  newest is not trusted after a crash, which may have cut it short);
- generic: a `step_N` or `step-N` folder, complete once a `COMPLETE` file (or DCP's
  `.metadata`) is in it.

Links are never checkpoints (the service refuses a path leading out of the run's folder).

A checkpoint counts only once its marker appeared or changed after the script started:
one left over from an attempt that died while writing it, or written after the point the
service resumed from (a rollback), is not this attempt's until the script writes it again.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import threading
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from worker.reporter import Reporter

SCAN_INTERVAL_S = 2.0  # a commit lags its marker by at most this; a scan is one listing
STEP_FOLDER = re.compile(r"step[-_](\d+)")
HF_FOLDER = re.compile(r"checkpoint-(\d+)")
LIGHTNING_FILE = re.compile(r"(?:.*[-_])?step=(\d+)(?:[-_].*)?\.ckpt|step[-_](\d+)\.ckpt")
FOLDER_MARKERS = {
    # step-N / step_N: torchtitan's (DCP's metadata) or anyone's (an explicit marker).
    "step": ((".metadata", "torchtitan"), ("COMPLETE", "generic")),
    "checkpoint": (("trainer_state.json", "huggingface"),),
}


class Layout(StrEnum):
    """Whose checkpoint a found one is, by its name and marker."""

    TORCHTITAN = "torchtitan"
    HUGGINGFACE = "huggingface"
    LIGHTNING = "lightning"
    GENERIC = "generic"


@dataclass(frozen=True)
class Found:
    """A checkpoint in the folder: its step, its path (a folder, or a Lightning file), and
    the file whose presence says it is complete (a Lightning file is its own marker)."""

    step: int
    path: Path
    layout: Layout
    marker: Path


Signature = tuple[int, int, int]  # inode, modification time (ns), size


def found_in(folder: Path) -> list[Found]:
    """Every checkpoint of a known layout directly in `folder` with its marker present,
    oldest step first. A Lightning file is listed whether or not it is complete yet."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []  # not made yet, or unreachable for a moment: the next scan looks again
    found: list[Found] = []
    for entry in entries:  # links are neither folders nor files here, nor are markers
        if entry.is_dir(follow_symlinks=False):
            found.extend(_folder_checkpoint(Path(entry.path)))
        elif entry.is_file(follow_symlinks=False):
            match = LIGHTNING_FILE.fullmatch(entry.name)
            if match:
                step = int(match.group(1) or match.group(2))
                found.append(Found(step, Path(entry.path), Layout.LIGHTNING, Path(entry.path)))
    return sorted(found, key=lambda f: (f.step, f.path.name))


def _folder_checkpoint(path: Path) -> list[Found]:
    for kind, pattern in (("step", STEP_FOLDER), ("checkpoint", HF_FOLDER)):
        match = pattern.fullmatch(path.name)
        if match is None:
            continue
        for marker, layout in FOLDER_MARKERS[kind]:
            if _is_file(path / marker):
                return [Found(int(match.group(1)), path, Layout(layout), path / marker)]
    return []


def complete(found: list[Found], *, script_exited_ok: bool) -> list[Found]:
    """Those of `found` that are complete: a folder has its marker; a Lightning file has a
    later one beside it, or the script exited 0 (its last save closed)."""
    lightning_steps = [f.step for f in found if f.layout == Layout.LIGHTNING]
    newest_lightning = max(lightning_steps, default=None)
    return [
        f
        for f in found
        if f.layout != Layout.LIGHTNING or script_exited_ok or f.step != newest_lightning
    ]


def signature(path: Path) -> Signature | None:
    try:
        found = os.lstat(path)
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns, found.st_size


def size_of(path: Path) -> int:
    """Bytes in a checkpoint (a file, or a folder's files), links not followed."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # rotated away meanwhile
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


class CheckpointWatcher:
    """Commits, on a thread of its own, each checkpoint the script completes in `folder`
    with a step past `after_step` (the resume point), oldest first."""

    def __init__(
        self,
        folder: Path,
        reporter: Reporter,
        after_step: int,
        interval_s: float = SCAN_INTERVAL_S,
    ) -> None:
        self.folder, self.reporter, self.last_step = folder, reporter, after_step
        self.committed: list[Found] = []
        # What was there before the script started: not its, until it writes them again.
        self._before = {f.marker: signature(f.marker) for f in found_in(folder)}
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runyard-checkpoints", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, script_exited_ok: bool) -> None:
        """The script exited: a last look, knowing whether it closed its last save."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.scan(script_exited_ok=script_exited_ok)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.scan(script_exited_ok=False)
            except Exception as exc:  # a bad scan must not end the watch
                print(f"[runyard] checkpoint scan failed: {exc!r}", file=sys.stderr, flush=True)

    def scan(self, *, script_exited_ok: bool) -> list[Found]:
        """Commit what became complete since the last scan; the ones committed."""
        fresh = [f for f in found_in(self.folder) if self._is_new(f)]
        done = []
        for found in complete(fresh, script_exited_ok=script_exited_ok):
            if found.step <= self.last_step:
                continue
            path = str(found.path.resolve())
            print(
                f"[runyard] {found.layout} checkpoint {path} of step {found.step} complete",
                flush=True,
            )
            # Like a script's own commit (runyard_client): the service resumes from it once
            # it has it; one it never got is not sent again (the next one will be).
            self.reporter.checkpoint(found.step, path, "COMMITTED", size_of(found.path))
            self.last_step = found.step
            self.committed.append(found)
            done.append(found)
        return done

    def _is_new(self, found: Found) -> bool:
        if found.marker not in self._before:
            return True
        return signature(found.marker) != self._before[found.marker]
