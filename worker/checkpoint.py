"""Sharded checkpoints with torch.distributed.checkpoint (DCP) and commit markers.

A checkpoint is `<checkpoint_dir>/step_<NNNNNNNN>/`: the DCP files every rank wrote for its
own part, plus a `COMMITTED` marker rank 0 writes only after every rank finished. A folder
without the marker is a save that died half-way; it is never loaded and is pruned.

What is saved is a dict of Stateful objects under named keys (torchtitan's habit): the model
and optimizer through `torch.distributed.checkpoint.state_dict`, which names every tensor by
the whole model's parameter name and keeps sharded ones sharded (DTensor), so a checkpoint
written by one layout and world size loads into any other; the trainer's counters; and each
rank's RNG. Training saves asynchronously (AsyncCheckpointer): it waits only for the copy to
host memory (worker/checkpoint_staging.py), and each save reports what it cost training in all
(worker/checkpoint_cost.py): that wait, plus how much slower the steps beside it ran.

Checksums. Every rank records the SHA-256 and size of each file it wrote in
`MANIFEST.rank<r>.json`, where it writes them (ChecksummingWriter); rank 0 merges them with
the `.metadata` file's into `MANIFEST.json` when DCP finishes the save, and there, once every
rank's files are written, verifies every file against the manifest, leaving its verdict in
`VERDICT.json` (all of it off the training thread). A mismatch writes a `CORRUPT` marker
instead of the commit, and the checkpoint is reported CORRUPT, never COMMITTED. A load
verifies first too, each rank a share of the files; a mismatch marks the folder CORRUPT and
raises CheckpointCorruptError, so the service resumes from the checkpoint before it. A
folder with a CORRUPT marker is never loaded, never the newest, and does not count among
the kept ones when pruning.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_saver import (
    AsyncCheckpointerType,
    AsyncSaveResponse,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future as TorchFuture

from contract import ResumePoint
from worker.background import lower_priority
from worker.checkpoint_cost import SaveCost, SaveCostMeter
from worker.checkpoint_staging import HostCopy
from worker.errors import CheckpointNotCommittedError, WorkerError
from worker.fault_points import NO_FAULTS, FaultPoints
from worker.files import folder_size, remove_tree, write_atomic
from worker.save_options import SaveOptions

MARKER = "COMMITTED"
CORRUPT_MARKER = "CORRUPT"  # overrides MARKER: the files failed their checksums
MANIFEST = "MANIFEST.json"  # every file of the checkpoint: {"files": {name: {sha256, bytes}}}
VERDICT = "VERDICT.json"  # rank 0's check of every file before the commit: {"problem": ...}
CHECKSUM = "sha256"
_HASH_CHUNK = 8 << 20  # hashlib releases the GIL for chunks this large


class CheckpointCorruptError(WorkerError):
    """A committed checkpoint's files do not match the checksums recorded when they were
    written. Retryable: the service marks it CORRUPT and resumes from the one before."""

    def __init__(self, step: int, path: str, detail: str) -> None:
        super().__init__(f"checkpoint at step {step} is corrupt: {detail}")
        self.step, self.path, self.detail = step, path, detail


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


# Optimizer state keyed by parameter name, param groups too ("state.<fqn>.exp_avg",
# "param_groups.<fqn>.lr"): pipeline stages and any wrapping then agree on every key.
_FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


class ModelState(Stateful):
    """The weights of this rank's model parts (pipeline stages) under the whole model's
    parameter names, wrapper prefixes stripped; sharded parameters stay sharded (DTensor),
    so each rank writes only its shards and DCP reshards them for any other layout."""

    def __init__(self, parts: Sequence[nn.Module]) -> None:
        self.parts = parts

    def state_dict(self) -> dict[str, Any]:
        return {k: v for part in self.parts for k, v in get_model_state_dict(part).items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part in self.parts:
            own = get_model_state_dict(part).keys()
            set_model_state_dict(part, {k: state_dict[k] for k in own})


class OptimizerState(Stateful):
    """Optimizer state of every model part (one optimizer each), keyed by parameter name,
    so it survives a change of wrapping, sharding or pipeline split."""

    def __init__(
        self, parts: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer]
    ) -> None:
        self.pairs = list(zip(parts, optimizers, strict=True))

    def state_dict(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for part, optimizer in self.pairs:
            merged.update(get_optimizer_state_dict(part, optimizer, options=_FLAT))
        return merged

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for part, optimizer in self.pairs:
            own = get_optimizer_state_dict(part, optimizer, options=_FLAT).keys()
            set_optimizer_state_dict(
                part, optimizer, {k: state_dict[k] for k in own}, options=_FLAT
            )


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
    parts: Sequence[nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
    trainer: TrainerState,
    rank: int,
) -> dict[str, Stateful]:
    """What a checkpoint holds. The RNG key names the rank: DCP keeps one copy of each key
    (it deduplicates what it takes to be replicated), which would drop the other ranks'."""
    return {
        "model": ModelState(parts),
        "optimizer": OptimizerState(parts, optimizers),
        "trainer": trainer,
        f"rng_rank{rank}": RNGState(),
    }


def file_digest(path: Path) -> dict[str, Any]:
    """The checksum and size of one file, as manifests record them."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return {CHECKSUM: digest.hexdigest(), "bytes": size}


def rank_manifest(folder: Path, rank: int) -> Path:
    return folder / f"MANIFEST.rank{rank}.json"


class ChecksummingWriter(FileSystemWriter):
    """DCP's file writer that also records what it wrote: each rank the checksum of each of
    its files, in the thread that wrote them (the async save's, never the training thread's)
    and before its write results reach rank 0; rank 0, finishing the save, merges every
    rank's manifest with the `.metadata` file's into MANIFEST.json. A rank whose manifest
    is missing fails the save, so a checkpoint without checksums is never committed.

    The files are written without torch.save's zip CRC-32 of every record: our SHA-256
    manifest already covers every byte, and the CRC is a second pass over the state on the
    writer's CPU, beside training (torch.load reads such files; zip tools would warn).
    `fault_points` travel with the writer, pickled to a writer process with it."""

    def __init__(
        self,
        path: Path,
        rank: int,
        step: int = -1,
        options: SaveOptions | None = None,
        fault_points: FaultPoints = NO_FAULTS,
    ) -> None:
        super().__init__(path)
        self.folder, self.own_rank = path, rank  # FileSystemWriter has a `rank` of its own
        self.step = step  # what the fault points are told
        self.options = options or SaveOptions()
        self.fault_points = fault_points

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> TorchFuture[list[WriteResult]]:
        if self.options.writer_process:  # in the writer's own process, never training's
            lower_priority()
        self.fault_points.write(self.step, self.own_rank)  # a slow disk, a writer holding the GIL
        crc32 = torch.serialization.get_crc32_options()
        torch.serialization.set_crc32_options(self.options.zip_crc32)  # only checkpoints save
        try:
            written = super().write_data(plan, planner)  # FileSystemWriter writes synchronously
        finally:
            torch.serialization.set_crc32_options(crc32)
        names = sorted({r.storage_data.relative_path for r in written.wait()})
        files = {name: file_digest(self.folder / name) for name in names}
        write_atomic(
            rank_manifest(self.folder, self.own_rank), json.dumps({"files": files}).encode()
        )
        return written

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        super().finish(metadata, results)  # writes .metadata
        files: dict[str, Any] = {}
        # Every rank wrote its manifest before its results reached this rank (write_data).
        for own in sorted(self.folder.glob("MANIFEST.rank*.json")):
            files.update(json.loads(own.read_text())["files"])
        expected = {r.storage_data.relative_path for rank_results in results for r in rank_results}
        if missing := expected - files.keys():
            raise RuntimeError(f"no checksum recorded for {sorted(missing)}")
        files[".metadata"] = file_digest(self.folder / ".metadata")
        manifest = {"algorithm": CHECKSUM, "files": files}
        write_atomic(self.folder / MANIFEST, json.dumps(manifest).encode())
        # The commit's check, once every rank's files are written: read them all back.
        self.fault_points.before_verify(self.step, 0, self.folder)
        write_atomic(self.folder / VERDICT, json.dumps({"problem": verify(self.folder)}).encode())


def verify(folder: Path, share: tuple[int, int] = (0, 1)) -> str | None:
    """Check the files of a checkpoint against its MANIFEST.json: None if they match, else
    what is wrong, for people. `share` (i, n): check only every n-th file from the i-th, so
    n ranks verify a checkpoint together. A checkpoint written before checksums existed
    (its marker does not say so) passes unchecked; I/O errors raise (they are not proof of
    corruption)."""
    marker = folder / MARKER
    if marker.is_file() and CHECKSUM not in json.loads(marker.read_text()).get("checksums", ""):
        return None  # written before checksums: nothing to check against
    if not (folder / MANIFEST).is_file():
        return f"{folder / MANIFEST} is missing"
    files = json.loads((folder / MANIFEST).read_text())["files"]
    index, num_shares = share
    for name in sorted(files)[index::num_shares]:
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        expected = files[name]
        if path.stat().st_size != expected["bytes"]:
            return f"{path}: {path.stat().st_size} bytes, {expected['bytes']} when written"
        actual = file_digest(path)[CHECKSUM]
        if actual != expected[CHECKSUM]:
            return f"{path}: {CHECKSUM} {actual[:16]}..., {expected[CHECKSUM][:16]}... when written"
    return None


def mark_corrupt(folder: Path, why: str) -> None:
    """Rank 0: write the CORRUPT marker, so nothing on disk takes the folder for a commit."""
    write_atomic(folder / CORRUPT_MARKER, json.dumps({"why": why}).encode())


def _verdict(path: Path) -> str | None:
    """Rank 0, once its save completed: what its writer's check found wrong (None: nothing)."""
    problem: str | None = json.loads((path / VERDICT).read_text())["problem"]
    return problem


@dataclass(frozen=True)
class SavedCheckpoint:
    step: int
    path: Path
    num_bytes: int  # size on disk of the whole folder (0 on ranks other than 0)
    write_s: float  # from the call until committed
    blocking_s: float  # how long training waited for it (worker/checkpoint_cost.py)
    # Rank 0: why the commit's verification failed (the folder is marked CORRUPT, not
    # committed); None when committed, and always on other ranks.
    corrupt: str | None = None
    # How much longer the steps beside it took than the usual pace (async saves), and
    # how many there were.
    excess_s: float = 0.0
    num_steps_beside: int = 0

    @property
    def stall_s(self) -> float:
        """What the save cost training in all, the run's checkpoint badput: the blocking
        time plus the overlapped steps' excess."""
        return SaveCost(self.blocking_s, self.excess_s, self.num_steps_beside).stall_s


def _remove_stale(path: Path, rank: int) -> None:
    """A folder for this step left by an attempt that died while saving it (or that saved
    it before a resume from an older step) goes first, its marker first of all, so it is
    never loaded half-gone; nobody writes into it before that."""
    if rank == 0 and path.exists():
        remove_tree(path, first=MARKER)
    dist.barrier()  # sync: the stale folder is gone on every rank's view


def _commit(
    path: Path, step: int, rank: int, corrupt: str | None, fault_points: FaultPoints
) -> int:
    """Rank 0 writes the marker (CORRUPT instead, if the files failed verification);
    returns the folder's size there (0 elsewhere)."""
    fault_points.before_commit(step, rank)
    if rank != 0:
        return 0
    if corrupt is not None:
        mark_corrupt(path, corrupt)
        return folder_size(path)
    marker = {
        "step": step,
        "world_size": dist.get_world_size(),
        "time": datetime.now(UTC).isoformat(),
        "checksums": CHECKSUM,  # MANIFEST.json holds them; verify() checks against it
    }
    write_atomic(path / MARKER, json.dumps(marker).encode())
    fault_points.after_commit(step, rank, path)
    return folder_size(path)


def save(
    checkpoint_dir: Path,
    step: int,
    state: dict[str, Stateful],
    fault_points: FaultPoints = NO_FAULTS,
) -> SavedCheckpoint:
    """Save synchronously, then commit: training waits for the whole write. Every rank
    must call it. (AsyncCheckpointer is what training uses; this is the baseline.)"""
    rank = dist.get_rank()
    path = step_folder(checkpoint_dir, step)
    start = time.perf_counter()
    _remove_stale(path, rank)
    writer = ChecksummingWriter(path, rank, step, fault_points=fault_points)
    # collective: each rank writes its part and its checksums, rank 0 metadata and manifest
    dcp.save(state, checkpoint_id=path, storage_writer=writer)
    dist.barrier()  # sync: every rank's files are complete before the commit
    corrupt = _verdict(path) if rank == 0 else None
    num_bytes = _commit(path, step, rank, corrupt, fault_points)
    elapsed = time.perf_counter() - start
    return SavedCheckpoint(step, path, num_bytes, elapsed, elapsed, corrupt)


@dataclass
class _InFlight:
    step: int
    path: Path
    future: Future[Any]  # the files written (and, on rank 0, every rank's)
    start: float


class AsyncCheckpointer:
    """Saves with `dcp.async_save`, one save in flight; rank 0 commits each one it completes.

    Training waits only for the copy of the state to host memory, and only if it is still
    running when the next optimizer update starts (on a GPU not even then: the update
    waits for it on the device; see worker/checkpoint_staging.py). The files are written
    by a thread of training's process, or (SaveOptions.writer_process) by a process of each
    rank's own, DCP's process-based async save, at the lowest CPU priority, so that
    serialising, writing and checksumming never take the GIL or a contended core from
    training.
    The writer's collectives (DCP plans the save, then gathers every rank's write results to
    rank 0, which writes the metadata, checks every file and leaves its verdict) run on a
    gloo process group of their own, never interleaved with training's collectives. Rank
    0's save completes only after all of that, so once its future is done rank 0 commits
    without another collective.

    Each save's cost to training is measured (worker/checkpoint_cost.py): every wait for it
    here, and the steps beside it against the usual pace, which needs poll() once a step.
    `fault_points` (worker/fault_points.py) go to every save's writer and commit.
    """

    def __init__(
        self,
        checkpoint_dir: Path,
        state: dict[str, Stateful],
        options: SaveOptions | None = None,
        fault_points: FaultPoints = NO_FAULTS,
    ) -> None:
        self.checkpoint_dir, self.state = checkpoint_dir, state
        self.options = options or SaveOptions.from_env()
        self.fault_points = fault_points
        self.rank = dist.get_rank()
        self.group = dist.new_group(backend="gloo")  # collective: every rank creates it
        self.in_flight: _InFlight | None = None
        self.stager = HostCopy(self.options)
        self.cost = SaveCostMeter()

    def save(self, step: int) -> None:
        """Start saving `step`; call wait() first if a save is in flight (two at once would
        contend for the group and double the host memory)."""
        if self.in_flight is not None:
            raise RuntimeError(f"step {self.in_flight.step} is still being saved: wait() first")
        start = time.perf_counter()
        path = step_folder(self.checkpoint_dir, step)
        _remove_stale(path, self.rank)
        response = dcp.async_save(
            self.state,
            checkpoint_id=path,
            storage_writer=ChecksummingWriter(
                path, self.rank, step, self.options, self.fault_points
            ),
            process_group=self.group,
            async_checkpointer_type=AsyncCheckpointerType.PROCESS
            if self.options.writer_process
            else AsyncCheckpointerType.THREAD,
            async_stager=self.stager,
        )
        if not isinstance(response, AsyncSaveResponse):  # what a stager returning a future gets
            raise TypeError(f"dcp.async_save returned {type(response).__name__}")
        self.in_flight = _InFlight(step, path, response.upload_completion, start)
        self.cost.blocked(time.perf_counter() - start)
        self.cost.started()

    def wait_for_staging(self) -> None:
        """Call before anything saved changes (the optimizer's update): returns once the
        save in flight no longer needs the state as it is (see HostCopy.wait_for_copy).
        Free once the copy is done; raises what the copy raised."""
        start = time.perf_counter()
        self.stager.wait_for_copy()
        self.cost.blocked(time.perf_counter() - start)

    def close(self) -> None:
        """Finish the save in flight (uncommitted: call wait() for that) and free the copy."""
        if self.in_flight is not None:
            self.in_flight.future.result()
        self.stager.close()

    def poll(self) -> SavedCheckpoint | None:
        """Call once per training step, after it: times the step (worker/checkpoint_cost.py)
        and commits the save in flight if it completed (no collective)."""
        self.cost.step_ended()
        done = self.in_flight
        if done is not None and done.future.done():
            return self.wait()
        return None

    def wait(self) -> SavedCheckpoint | None:
        """Block until the save in flight completed, and commit it; None if there was none.
        Raises what the save raised on any rank (a failed write is never committed). On rank
        0 a save whose files fail their checksums is marked CORRUPT instead (see `corrupt`).
        The wait counts as the save's blocking time: training is not stepping meanwhile."""
        if self.in_flight is None:
            return None
        done, self.in_flight = self.in_flight, None
        start = time.perf_counter()
        done.future.result()
        corrupt = _verdict(done.path) if self.rank == 0 else None
        num_bytes = _commit(done.path, done.step, self.rank, corrupt, self.fault_points)
        now = time.perf_counter()
        self.cost.blocked(now - start)
        cost = self.cost.finished()
        return SavedCheckpoint(
            done.step,
            done.path,
            num_bytes,
            write_s=now - done.start,
            blocking_s=cost.blocking_s,
            corrupt=corrupt,
            excess_s=cost.excess_s,
            num_steps_beside=cost.num_steps_beside,
        )


def _step_of(path: Path) -> int:
    match = _STEP_FOLDER.match(path.name)
    return int(match.group(1)) if match else -1


def is_committed(path: Path) -> bool:
    """Committed, and not found corrupt since."""
    return (path / MARKER).is_file() and not is_corrupt(path)


def is_corrupt(path: Path) -> bool:
    """Its files failed their checksums, at the commit or at a load."""
    return (path / CORRUPT_MARKER).exists()


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


def verify_for_load(path: Path) -> None:
    """Every rank checks its share of the files, and all learn what any found: on a
    mismatch rank 0 marks the folder CORRUPT and every rank raises CheckpointCorruptError
    (so no rank is left in a collective the others never enter). Every rank must call it."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    problem = verify(path, share=(rank, world_size))
    found: list[str | None] = [None] * world_size
    dist.all_gather_object(found, problem)  # sync: every rank's verdict
    problems = [p for p in found if p]
    if problems:
        if rank == 0:
            mark_corrupt(path, problems[0])
        dist.barrier()  # sync: the marker is written before any rank exits
        raise CheckpointCorruptError(_step_of(path), str(path), problems[0])


def load(path: Path, state: dict[str, Stateful]) -> None:
    """Verify a committed checkpoint's checksums, then load it into `state` in place.
    Every rank must call it. Raises CheckpointCorruptError (and marks it) on a mismatch,
    or if it was marked before (the service may not have heard: it hears it now)."""
    if is_corrupt(path):
        why = json.loads((path / CORRUPT_MARKER).read_text()).get("why", "")
        raise CheckpointCorruptError(
            _step_of(path), str(path), f"marked {CORRUPT_MARKER} before: {why}"
        )
    if not is_committed(path):
        raise CheckpointNotCommittedError(
            f"{path} has no {MARKER} marker or is marked {CORRUPT_MARKER}: refusing to load it"
        )
    verify_for_load(path)  # collective
    saved_keys = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    # A rank that did not exist when the checkpoint was written keeps its fresh RNG.
    wanted = {
        key: value
        for key, value in state.items()
        if not key.startswith("rng_rank") or any(k.startswith(f"{key}.") for k in saved_keys)
    }
    dcp.load(wanted, checkpoint_id=path)


def discard_abandoned(checkpoint_dir: Path, resume_step: int) -> list[Path]:
    """Delete the committed checkpoints above the step an attempt resumes from (0: from
    scratch). The service resumes from the newest checkpoint it trusts, so any committed
    folder above it is one it stopped trusting (written after silent data corruption
    began, or corrupt) or never heard of: an abandoned timeline. Left on disk, `prune`
    would count them as the newest and delete this attempt's fresh commits instead, which
    the service still resumes from. Rank 0 of a plain run only, before its first step; the
    attempt saves these steps again as it reaches them. Returns what went."""
    doomed = [
        path
        for step, path in _step_folders(checkpoint_dir)
        if step > resume_step and is_committed(path)
    ]
    for path in doomed:
        remove_tree(path, first=MARKER)
    return doomed


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
