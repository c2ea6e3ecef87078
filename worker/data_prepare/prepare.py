"""Prepare a corpus: plan units, tokenize them over a process pool, write shards in order.

The output folder holds `shard_NNNNN.bin` (training tokens), `val_NNNNN.bin` (the held-out
split), `.prepare/` (the plan and the journal) and, written last, `index.json`
(contract.dataset.DatasetIndex, format 2). Units are tokenized out of order by the pool but
written in order, so the token stream depends on the inputs, the tokenizer and the settings
alone: not on the number of processes, and not on how often the prepare was interrupted.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from contract.dataset import (
    INDEX_FILE,
    DatasetIndex,
    TokenizerIdentity,
    TokenSplit,
    dtype_for_vocab,
)
from worker.files import write_atomic

from .encoder import (
    EncodedUnit,
    EncoderSettings,
    encode_unit,
    load_encoder,
    load_tokenizer,
    start_process,
)
from .errors import PrepareError
from .sources import UNIT_BYTES, Unit, find_sources, fingerprint, plan_units
from .writer import Journal, ShardAppender

SHARD_TOKENS = 32 * 1024 * 1024  # tokens per shard file: 128 MiB at uint32
WORK_DIR = ".prepare"
JOURNAL_FILE = "journal.jsonl"
# Test hook, like worker/faults.py: SIGKILL the prepare after unit N's tokens are on disk
# and before the journal records it (the moment a resume must cut the shards back).
FAULT_ENV = "RUNYARD_PREPARE_FAULT"


@dataclass(frozen=True)
class PrepareSettings:
    """Everything that decides the token stream (a resume must be given the same)."""

    text_field: str = "text"
    val_fraction: float = 0.005
    seed: int = 0  # of the validation draw
    eos_token: str | None = None  # None: the tokenizer folder's eos_token
    shard_tokens: int = SHARD_TOKENS
    unit_bytes: int = UNIT_BYTES


@dataclass
class PrepareProgress:
    """Where a prepare is: handed to the progress callback after every unit."""

    num_units: int
    units_done: int = 0
    units_skipped: int = 0  # done by an earlier, interrupted prepare
    tokens: int = 0  # written by this invocation
    documents: int = 0
    chars: int = 0
    resumed: bool = False
    notes: list[str] = field(default_factory=list)


def _check_settings(settings: PrepareSettings) -> None:
    if not 0 <= settings.val_fraction < 1:
        raise PrepareError(f"--val-fraction must be in [0, 1), got {settings.val_fraction}")
    if settings.shard_tokens < 1 or settings.unit_bytes < 1:
        raise PrepareError("shard_tokens and unit_bytes must be positive")


@contextmanager
def _exclusive(out: Path) -> Iterator[None]:
    """Hold `out` for one prepare at a time (two would interleave their writes)."""
    if out.exists() and not (out / WORK_DIR).exists() and any(out.iterdir()):
        raise PrepareError(f"{out} is not empty and holds no prepare: choose an empty --out")
    (out / WORK_DIR).mkdir(parents=True, exist_ok=True)
    with open(out / WORK_DIR / "lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PrepareError(
                f"{out}: another prepare is writing there; wait for it or choose another --out"
            ) from None
        yield  # the lock goes with the file's closing


def _claim_output(out: Path, plan: dict[str, Any]) -> bool:
    """Make `out` ours; True when it holds this very prepare, interrupted (or finished)."""
    plan_path = out / WORK_DIR / "plan.json"
    if plan_path.exists() and json.loads(plan_path.read_text()) != plan:
        if Journal(out / WORK_DIR / JOURNAL_FILE).entries() or (out / INDEX_FILE).exists():
            raise PrepareError(
                f"{out} holds a prepare of other inputs, tokenizer or settings (or an input "
                "changed since): delete it or choose another --out"
            )
        # Nothing finished yet (say the first unit hit a bad file, since fixed): start over.
        for stale in [*out.glob("shard_*.bin"), *out.glob("val_*.bin"), plan_path]:
            stale.unlink()
    elif plan_path.exists():
        return True
    if any(p.name != WORK_DIR for p in out.iterdir()):
        raise PrepareError(f"{out} is not empty and holds no prepare: choose an empty --out")
    write_atomic(plan_path, json.dumps(plan).encode())
    return False


def _maybe_fault(unit: int) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if spec == f"kill_before_journal:{unit}":
        os.kill(os.getpid(), signal.SIGKILL)


def prepare_dataset(
    sources: list[Path],
    tokenizer_dir: Path,
    out: Path,
    settings: PrepareSettings | None = None,
    num_workers: int | None = None,
    on_progress: Callable[[PrepareProgress], None] | None = None,
) -> DatasetIndex:
    """Tokenize `sources` with the tokenizer in `tokenizer_dir` into `out`, resuming an
    interrupted prepare of the same inputs there. Raises PrepareError on bad input."""
    settings = settings or PrepareSettings()
    _check_settings(settings)
    _, identity = load_tokenizer(tokenizer_dir, settings.eos_token)
    found = find_sources(sources)
    units = plan_units(found, settings.text_field, settings.unit_bytes)
    plan = {
        "settings": asdict(settings),
        "tokenizer": identity.model_dump(),
        "inputs": fingerprint(found),
        "units": [u.to_json() for u in units],
    }
    with _exclusive(out):
        resumed = _claim_output(out, plan)
        workers = num_workers or os.cpu_count() or 1
        return _write_dataset(
            out, units, tokenizer_dir, identity, settings, resumed, workers, on_progress
        )


def _write_dataset(
    out: Path,
    units: list[Unit],
    tokenizer_dir: Path,
    identity: TokenizerIdentity,
    settings: PrepareSettings,
    resumed: bool,
    num_workers: int,
    on_progress: Callable[[PrepareProgress], None] | None,
) -> DatasetIndex:
    """The units not yet journaled, then the index (the caller holds the output's lock)."""
    if (out / INDEX_FILE).exists():  # finished before: nothing to do
        return DatasetIndex.model_validate_json((out / INDEX_FILE).read_text())

    writer = _DatasetWriter(out, identity, settings, len(units), resumed, on_progress)
    if on_progress is not None:
        on_progress(writer.progress)
    encoder = EncoderSettings(
        tokenizer_dir=str(tokenizer_dir),
        eos_token=identity.eos_token,
        text_field=settings.text_field,
        val_fraction=settings.val_fraction,
        seed=settings.seed,
        num_units=len(units),
    )
    num_done = writer.num_units_done
    _run_pool(units[num_done:], num_done, encoder, num_workers, writer.write)

    index = writer.index(units)
    write_atomic(out / INDEX_FILE, index.model_dump_json(indent=2).encode())  # last
    os.chmod(out / INDEX_FILE, 0o644)  # mkstemp made it private; the service reads it too
    return index


class _DatasetWriter:
    """The output's two splits and its journal, taken up where the journal's last entry
    left them: a unit's tokens are appended and synced before the journal records the
    unit, so that a resume cuts the shards back to the end of the last unit recorded. Its
    own class so that _write_dataset reads as: resume, encode the rest, write the index."""

    def __init__(
        self,
        out: Path,
        identity: TokenizerIdentity,
        settings: PrepareSettings,
        num_units: int,
        resumed: bool,
        on_progress: Callable[[PrepareProgress], None] | None,
    ) -> None:
        self.out, self.identity, self.on_progress = out, identity, on_progress
        dtype = np.dtype(dtype_for_vocab(identity.vocab))
        self.train = ShardAppender(out, "shard", dtype, settings.shard_tokens)
        self.validation = ShardAppender(out, "val", dtype, settings.shard_tokens)
        self.journal = Journal(out / WORK_DIR / JOURNAL_FILE)
        done = self.journal.entries()
        last = done[-1] if done else {"train": 0, "validation": 0, "documents": 0, "val_docs": 0}
        self.train.cut_to(last["train"])
        self.validation.cut_to(last["validation"])
        self.num_units_done = len(done)  # by earlier, interrupted prepares
        self.progress = PrepareProgress(num_units, len(done), len(done), resumed=resumed)
        self.num_documents, self.num_val_documents = last["documents"], last["val_docs"]

    def write(self, encoded: EncodedUnit) -> None:
        """The next unit, in order: its tokens on disk, then its journal entry."""
        self.train.append(encoded.train)
        self.validation.append(encoded.validation)
        self.train.sync()
        self.validation.sync()
        _maybe_fault(encoded.number)
        self.num_documents += encoded.num_documents
        self.num_val_documents += encoded.num_validation_documents
        self.journal.record(
            {
                "unit": encoded.number,
                "train": self.train.num_tokens,
                "validation": self.validation.num_tokens,
                "documents": self.num_documents,
                "val_docs": self.num_val_documents,
            }
        )
        progress = self.progress
        progress.units_done += 1
        progress.tokens += len(encoded.train) + len(encoded.validation)
        progress.documents += encoded.num_documents + encoded.num_validation_documents
        progress.chars += encoded.num_chars
        if self.on_progress is not None:
            self.on_progress(progress)

    def index(self, units: list[Unit]) -> DatasetIndex:
        """The index of what was written, every unit in (PrepareError if no training token)."""
        if self.train.num_tokens == 0:
            raise PrepareError(f"{self.out}: no training tokens (are the inputs empty?)")
        return DatasetIndex(
            format=2,
            dtype=dtype_for_vocab(self.identity.vocab),
            vocab=self.identity.vocab,
            num_tokens=self.train.num_tokens,
            sha256=self.train.sha256(),
            source=", ".join(sorted({p for u in units for p in u.paths})),
            shards=self.train.shards(),
            num_documents=self.num_documents,
            validation=TokenSplit(
                num_tokens=self.validation.num_tokens,
                num_documents=self.num_val_documents,
                sha256=self.validation.sha256(),
                shards=self.validation.shards(),
            ),
            tokenizer=self.identity,
        )


def _run_pool(
    units: list[Unit],
    first_number: int,
    encoder: EncoderSettings,
    num_workers: int,
    write: Callable[[EncodedUnit], None],
) -> None:
    """Encode `units` over `num_workers` processes; hand them to `write` in order. At most
    two units per process are in flight, which bounds memory however slow the head unit.
    With one worker, this process encodes (no pool to start)."""
    if num_workers == 1:
        load_encoder(encoder)
        for offset, unit in enumerate(units):
            write(encode_unit(first_number + offset, unit))
        return
    context = multiprocessing.get_context("spawn")  # no tokenizer state forked across
    pool = ProcessPoolExecutor(
        num_workers, mp_context=context, initializer=start_process, initargs=(encoder,)
    )
    pending: deque[Future[EncodedUnit]] = deque()
    next_unit = 0
    try:
        while pending or next_unit < len(units):
            while next_unit < len(units) and len(pending) < 2 * num_workers:
                pending.append(pool.submit(encode_unit, first_number + next_unit, units[next_unit]))
                next_unit += 1
            write(pending.popleft().result())
    except BaseException:
        # Interrupted or failed: queued units are cancelled and nothing of the ones in flight
        # is written (the journal says where to go on from). Their end is awaited (at most
        # two units per process): an executor left running when the interpreter exits
        # prints a traceback from its atexit hook over the one-line error.
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
