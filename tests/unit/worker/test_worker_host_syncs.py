"""The training loop reads device values back to the host only on reporting steps.

On a GPU every such read (`.item()`, `.tolist()`, `float(t)`, `if t:`) makes the host wait
until the device has drained its queue, so the GPU idles while the next step's kernels are
launched. On a CPU those reads cost nothing, but they can still be seen: the tensor methods
that read a value back are wrapped to log each call made directly by the worker's code
(torch's own internal reads, such as AdamW's CPU step counters, are not device syncs and
are not logged). Copies from pageable memory to a GPU also synchronise; only a GPU shows
those (bench/gpu_mfu.py runs the real step under torch.cuda.set_sync_debug_mode).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from worker_helpers import tiny_spec

import worker
from contract import WorkerRunConfig
from worker.data import TokenBatches
from worker.distributed import read_launch_env
from worker.reporter import Reporter
from worker.train import train

WORKER_DIR = str(Path(worker.__file__).parent)
# Methods that read a tensor's value into Python: a device-to-host copy the host waits for.
READ_BACK = ("item", "tolist", "numpy", "cpu", "__float__", "__int__", "__bool__", "__index__")
# torch's Python-level plumbing between a caller and the read (e.g. f"{t:.3f}" goes through
# Tensor.__format__, which calls item()): the read is attributed to whoever called these.
TORCH_PLUMBING = tuple(
    str(Path(torch.__file__).parent / name)
    for name in ("_tensor.py", "_tensor_str.py", "overrides.py", "_jit_internal.py")
)

Event = tuple[str, Any]


def _caller_file() -> str:
    frame = sys._getframe(2)  # 0: this function, 1: the wrapper, 2: the caller
    while frame.f_back is not None and frame.f_code.co_filename.startswith(TORCH_PLUMBING):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


def _logging(name: str, original: Callable[..., Any], log: list[Event]) -> Callable[..., Any]:
    def read_back(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        where = _caller_file()
        if where.startswith(WORKER_DIR):
            log.append(("read", f"{name} at {where}"))
        return original(self, *args, **kwargs)

    return read_back


class LoggingReporter(Reporter):
    def __init__(self, log: list[Event]) -> None:
        self.log = log

    def metric(self, step: int, loss: float, tokens_per_s: float, step_time_s: float) -> None:
        self.log.append(("metric", step))


def steps_of(log: list[Event]) -> dict[int, list[Event]]:
    """The log cut at each step's first micro batch: step -> what happened until the next."""
    by_step: dict[int, list[Event]] = {}
    current: list[Event] = []  # before step 1: setup, not checked
    for kind, value in log:
        if kind == "step":
            current = by_step.setdefault(value, [])
        else:
            current.append((kind, value))
    return by_step


def test_only_reporting_steps_read_values_back_from_the_device(
    tmp_path: Path, data_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[Event] = []
    for name in READ_BACK:
        monkeypatch.setattr(torch.Tensor, name, _logging(name, getattr(torch.Tensor, name), log))
    original_micro_batch = TokenBatches.micro_batch

    def micro_batch(self: TokenBatches, step: int, micro_step: int, *args: Any) -> Any:
        if micro_step == 0:
            log.append(("step", step))
        return original_micro_batch(self, step, micro_step, *args)

    monkeypatch.setattr(TokenBatches, "micro_batch", micro_batch)
    # A report interval of an hour: reports at steps 1 and 2 (before the loop has measured
    # a step) and at the end (a checkpoint), none in between.
    spec = tiny_spec(
        tmp_path / "ckpt",
        data_cache_dir,
        layout={"dp": 1, "micro_batch_size": 4},  # 2 micro batches a step
        steps=12,
        checkpoint_every=1000,
        report_interval_s=3600.0,
    )
    train(WorkerRunConfig.model_validate(spec), read_launch_env({}), LoggingReporter(log))

    by_step = steps_of(log)
    assert sorted(by_step) == list(range(1, 13))
    reported = [event[1] for events in by_step.values() for event in events if event[0] == "metric"]
    assert reported == list(range(1, 13))  # every step's loss still reaches the reporter
    reporting = {step for step, events in by_step.items() if ("metric", step) in events}
    assert reporting == {1, 2, 12}
    reads = {step: [v for kind, v in events if kind == "read"] for step, events in by_step.items()}
    # The detector sees the report's read-back (else this test could not fail)...
    assert all(reads[step] for step in reporting), reads
    # ...and the steps between reports read nothing back.
    assert {step: found for step, found in reads.items() if step not in reporting and found} == {}
