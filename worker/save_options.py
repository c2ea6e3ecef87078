"""How an asynchronous checkpoint save keeps its work off training's path.

Each option is a change measured to lower what a save costs training (docs/design.md, "What
a checkpoint costs training"); the defaults are the measured best. bench/checkpoint.py
turns each off in turn to measure what it is worth. RUNYARD_CHECKPOINT_WRITER=process makes
the training loop write from a process of its own (DCP's process-based async save) instead
of a thread: not the default, because with two ranks (DTensor state) training's process
died of SIGSEGV at the first such save under torch 2.13 (tests/unit/worker/test_worker_resume
.py; docs/design.md, "What a checkpoint costs training").
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

WRITER_ENV = "RUNYARD_CHECKPOINT_WRITER"  # "thread" (default) or "process"


@dataclass(frozen=True)
class SaveOptions:
    """How AsyncCheckpointer copies and writes (worker/checkpoint.py)."""

    # GPU: the device-to-host copy runs on a CUDA stream of its own, and training's next
    # update waits for it on the device; off, it runs on the default stream between
    # training's kernels and the update waits for it on the host.
    copy_stream: bool = True
    # GPU: the host copy is page-locked (cudaHostRegister), so the copy engines move it at
    # full PCIe speed; off, it is pageable memory.
    pinned: bool = True
    # torch.save's zip CRC-32 of every record: a second pass over the whole state on the
    # writer's CPU; the SHA-256 manifest already covers every byte, so it is off.
    zip_crc32: bool = False
    # Serialise, write and checksum the files in a process of the rank's own (DCP's
    # process-based async save), at the lowest CPU priority, instead of a thread of
    # training's process, where every line of Python it runs holds the GIL training needs.
    # Off by default (see the module's docstring).
    writer_process: bool = False

    @classmethod
    def from_env(cls) -> SaveOptions:
        """The defaults, with the writer RUNYARD_CHECKPOINT_WRITER names, if any."""
        writer = os.environ.get(WRITER_ENV, "thread")
        if writer not in ("process", "thread"):
            raise ValueError(f"{WRITER_ENV}={writer!r}: use process or thread")
        return replace(cls(), writer_process=writer == "process")
