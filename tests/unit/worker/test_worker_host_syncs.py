"""The training loop reads device values back to the host only on reporting steps.

On a GPU every such read (`.item()`, `.tolist()`, `float(t)`, `if t:`) makes the host wait
until the device has drained its queue, so the GPU idles while the next step's kernels are
launched. On a CPU those reads cost nothing, but they can still be seen: the tensor methods
that read a value back are wrapped to log each call made directly by the worker's code
(torch's own internal reads, such as AdamW's CPU step counters, are not device syncs and
are not logged). A second test watches every operator the step runs, torch's own code
included (autograd, the loss, clipping, the optimizer), for those that make a GPU wait
whatever calls them: reading a value back, and operators whose output size depends on the
data (nonzero, boolean masks, unique...). Copies from pageable memory to a GPU also
synchronise; only a GPU shows those (bench/gpu_mfu.py runs the real step under
torch.cuda.set_sync_debug_mode and names the code of every sync it sees).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from worker_helpers import tiny_spec

import worker
from contract import WorkerRunConfig
from worker.data import TokenBatches
from worker.launch import read_launch_env
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

_aten = torch.ops.aten
# Operators that make the host wait for a GPU: a value read back, or an output whose size
# depends on the data (the host must learn it before it can allocate). From CUDA's kernels
# that call c10::cuda::stream_synchronize or memcpy_and_sync.
SYNCING_OPS = {
    _aten._local_scalar_dense.default,  # item(), float(t), int(t), bool(t), if t:
    _aten.nonzero.default,
    _aten.nonzero_static.default,
    _aten.masked_select.default,
    _aten.masked_scatter.default,
    _aten.is_nonzero.default,
    _aten.equal.default,
    _aten._unique2.default,
    _aten.unique_consecutive.default,
    _aten.unique_dim.default,
    _aten.repeat_interleave.Tensor,
    _aten.bincount.default,
    _aten.histc.default,
    _aten.multinomial.default,
}
# AdamW keeps its step counters on the host on a GPU too (capturable=False): reading them
# is no device sync.
HOST_COUNTERS = str(Path(torch.__file__).parent / "optim")


# The dispatch machinery between an operator's caller and the mode (dynamo's wrappers).
DISPATCH_PLUMBING = tuple(
    str(Path(torch.__file__).parent / name) for name in ("_dynamo", "_compile.py", "utils")
)


def _python_caller() -> str:
    """The innermost Python frame outside torch's plumbing and this file."""
    frame = sys._getframe(1)
    while frame.f_back is not None and (
        frame.f_code.co_filename == __file__
        or frame.f_code.co_filename.startswith(DISPATCH_PLUMBING)
        or frame.f_code.co_filename.startswith(TORCH_PLUMBING)
    ):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class SyncingOps(TorchDispatchMode):
    """Logs every operator of SYNCING_OPS run under it, whoever calls it (bool-mask
    indexing too), except the optimizer's reads of its host counters."""

    def __init__(self, log: list[Event]) -> None:
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        syncs = func in SYNCING_OPS or (
            func is _aten.index.Tensor
            and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool
                for i in args[1]
                if i is not None
            )
        )
        if syncs:
            where = _python_caller()
            kind = "host_counter" if where.startswith(HOST_COUNTERS) else "sync"
            self.log.append((kind, f"{func} at {where}"))
        return func(*args, **kwargs)


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

    def metric(
        self, step: int, loss: float, tokens_per_s: float, step_time_s: float, **_: Any
    ) -> None:
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


def test_no_operator_between_reports_makes_a_gpu_wait(
    tmp_path: Path, data_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every operator of the steps between reports, torch's included, must leave the
    device running ahead: no read-back and no data-dependent output size anywhere."""
    log: list[Event] = []
    original_micro_batch = TokenBatches.micro_batch

    def micro_batch(self: TokenBatches, step: int, micro_step: int, *args: Any) -> Any:
        if micro_step == 0:
            log.append(("step", step))
        return original_micro_batch(self, step, micro_step, *args)

    monkeypatch.setattr(TokenBatches, "micro_batch", micro_batch)
    spec = tiny_spec(
        tmp_path / "ckpt",
        data_cache_dir,
        layout={"dp": 1, "micro_batch_size": 4},
        steps=8,
        checkpoint_every=1000,
        report_interval_s=3600.0,  # reports at steps 1, 2 and 8 only
    )
    with SyncingOps(log):
        train(WorkerRunConfig.model_validate(spec), read_launch_env({}), LoggingReporter(log))

    by_step = steps_of(log)
    assert sorted(by_step) == list(range(1, 9))
    syncs = {step: [v for kind, v in events if kind == "sync"] for step, events in by_step.items()}
    # The mode sees torch's own code (else this test could not fail): AdamW reads its
    # step counters, host tensors on a GPU too, in every step...
    assert all(("host_counter" in dict(events)) for events in by_step.values()), by_step
    # ...and nothing in the steps between reports makes the device wait. (The reports'
    # read-back is a copy to the host, which only a GPU shows: the other test sees it.)
    assert {step: found for step, found in syncs.items() if step not in (1, 2, 8) and found} == {}
