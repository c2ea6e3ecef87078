"""The copy of a checkpoint's state to host memory, beside training.

An asynchronous save first copies every tensor it saves to host memory (staging), and only
then writes files from that copy, so training may change its weights as soon as the copy is
done. How that copy is made decides what it costs training:

- DCP's own stager copies with UntypedStorage.copy_, which holds the GIL for the whole copy:
  in the background it stalls the training thread as surely as in the foreground (measured:
  a Python loop ran at 15% of its speed beside it). Tensor.copy_ releases the GIL.
- Buffers are allocated by the first save and reused: a fresh gigabyte each time is
  page-faulted in at a third of the copy's speed. They are one slab of exactly the state's
  size, carved into one view per tensor; on a GPU the slab is page-locked once
  (cudaHostRegister), so the device-to-host copy runs at full PCIe speed. (Per-tensor
  pin_memory buffers would be rounded up to powers of two by the caching host allocator:
  up to twice the memory.) With a writer process the slab is shared memory, which the
  writer maps: what crosses the pipe each save is the tensors' handles, not their bytes.
- On a GPU the copies run on a stream of their own, after an event recorded on training's
  stream when the save started. Training's next forward and backward run on the compute
  engines while the copy engines move the state; the next optimizer update, the first thing
  that changes what is saved, waits for the copy on the device (Stream.wait_event), not on
  the host. On the default stream, the copy was queued between the next step's kernels and
  each waited for the other.

`HostCopy.wait_for_copy()` is what training calls before its next update.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.tensor import DTensor

from worker.save_options import SaveOptions

_ALIGN_BYTES = 64  # each view starts on a cache line (and on any dtype's element size)

Key = tuple[str, ...]


def _local(value: torch.Tensor) -> torch.Tensor:
    return value.to_local() if isinstance(value, DTensor) else value


def _tensors(value: Any, key: Key = ()) -> list[tuple[Key, torch.Tensor]]:
    """Every tensor of a (nested) state dict, by its key path, in a fixed order."""
    if isinstance(value, dict):
        return [kv for k, v in value.items() for kv in _tensors(v, (*key, str(k)))]
    if type(value) in (list, tuple):
        return [kv for i, v in enumerate(value) for kv in _tensors(v, (*key, str(i)))]
    if isinstance(value, torch.Tensor):
        return [(key, _local(value))]
    return []


class _Slab:
    """One host allocation holding a view for every tensor of a state dict's layout."""

    def __init__(
        self, layout: dict[Key, tuple[torch.Size, torch.dtype]], pin: bool, shared: bool
    ) -> None:
        offsets, total = {}, 0
        for key, (shape, dtype) in layout.items():
            offsets[key] = total
            nbytes = shape.numel() * dtype.itemsize
            total += -(-nbytes // _ALIGN_BYTES) * _ALIGN_BYTES
        self.layout, self.num_bytes = layout, total
        self.memory = torch.empty(max(total, 1), dtype=torch.uint8)
        if shared:
            # A writer process maps it rather than receiving a copy of the state each save
            # (moved into shared memory now, while it is empty, and before it is pinned).
            self.memory.share_memory_()
        self.pinned = False
        if pin:
            # Page-locks the slab once (what DCP's own stager does for shared buffers); the
            # caching host allocator would round each buffer up to a power of two instead.
            cudart = torch.cuda.cudart()
            err = cudart.cudaHostRegister(self.memory.data_ptr(), self.memory.numel(), 0)
            if int(getattr(err, "value", err)) != 0:  # cudaSuccess
                raise RuntimeError(f"cudaHostRegister of {total} bytes failed: {err}")
            self.pinned = True
        self.views = {
            key: self.memory[offsets[key] : offsets[key] + shape.numel() * dtype.itemsize]
            .view(dtype)
            .view(shape)
            for key, (shape, dtype) in layout.items()
        }

    def release(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.memory.data_ptr())
            self.pinned = False


class HostCopy(AsyncStager):
    """Copies a state dict to host memory in a thread of its own, into a slab kept between
    saves; on a GPU on a copy stream of its own (see the module's docstring)."""

    _synchronize_after_execute = False  # waited for through wait_for_copy() / the future

    def __init__(self, options: SaveOptions | None = None) -> None:
        self.options = options or SaveOptions()
        self._slab: _Slab | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runyard-staging")
        self._stream: torch.cuda.Stream | None = None
        # Resolved once every copy of the save in flight is queued: with the CUDA event the
        # copies complete at (None on a CPU, where they are complete by then).
        self._queued: Future[torch.cuda.Event | None] | None = None
        self._lock = threading.Lock()

    @property
    def host_bytes(self) -> int:
        """The size of the host copy kept between saves (0 before the first)."""
        return self._slab.num_bytes if self._slab is not None else 0

    def stage(self, state_dict: dict[str, Any]) -> Future[dict[str, Any]]:  # type: ignore[override]
        """Start copying `state_dict` (called by dcp.async_save on training's thread)."""
        ready = None
        on_gpu = torch.cuda.is_available() and any(t.is_cuda for _, t in _tensors(state_dict))
        if on_gpu and self.options.copy_stream:
            # Everything training queued so far (the update that produced this state) comes
            # before the copy; recorded here, on training's stream, not in the thread.
            ready = torch.cuda.Event()
            ready.record()
        queued: Future[torch.cuda.Event | None] = Future()
        with self._lock:
            self._queued = queued
        return self._thread.submit(self._copy_all, state_dict, ready, queued)

    def wait_for_copy(self) -> None:
        """Training, before anything saved changes (the next optimizer update): on a CPU,
        wait until the copy is done; on a GPU, wait on the host only until the copies are
        queued, and make training's stream wait for them on the device. Raises what the
        copy raised. Free when no copy is in flight."""
        with self._lock:
            queued, self._queued = self._queued, None
        if queued is None:
            return
        copied = queued.result()
        if copied is not None:
            torch.cuda.current_stream().wait_event(copied)

    def _copy_all(
        self,
        state_dict: dict[str, Any],
        ready: torch.cuda.Event | None,
        queued: Future[torch.cuda.Event | None],
    ) -> dict[str, Any]:
        try:
            tensors = _tensors(state_dict)
            layout = {key: (t.shape, t.dtype) for key, t in tensors}
            if self._slab is None or self._slab.layout != layout:
                if self._slab is not None:
                    self._slab.release()
                self._slab = None  # the old slab goes before the new one is allocated
                on_gpu = any(t.is_cuda for _, t in tensors)
                self._slab = _Slab(
                    layout,
                    pin=on_gpu and self.options.pinned,
                    shared=self.options.writer_process,
                )
            views = self._slab.views
            copied = None
            if ready is not None:
                if self._stream is None:
                    self._stream = torch.cuda.Stream()
                with torch.cuda.stream(self._stream):
                    self._stream.wait_event(ready)
                    for key, tensor in tensors:
                        views[key].copy_(tensor, non_blocking=tensor.is_cuda)
                    copied = torch.cuda.Event()
                    copied.record(self._stream)
            else:  # a CPU, or (to measure what the copy stream is worth) training's stream
                for key, tensor in tensors:
                    views[key].copy_(tensor)
        except BaseException as exc:
            queued.set_exception(exc)
            raise
        queued.set_result(copied)
        if copied is not None:
            copied.synchronize()  # this thread waits for the copy engines; training does not
        return self._rebuild(state_dict, ())

    def _rebuild(self, value: Any, key: Key) -> Any:
        """`value` with every tensor replaced by its host copy."""
        if isinstance(value, dict):
            return {k: self._rebuild(v, (*key, str(k))) for k, v in value.items()}
        if type(value) in (list, tuple):
            return type(value)(self._rebuild(v, (*key, str(i))) for i, v in enumerate(value))
        if isinstance(value, torch.Tensor):
            assert self._slab is not None
            local = self._slab.views[key]
            if isinstance(value, DTensor):
                # This rank's shard in host memory, under the same global layout (DCP's own
                # stager does the same). Not DTensor.from_local: it would move the shard
                # back to the mesh's GPU.
                return DTensor(local, value._spec, requires_grad=False)
            return local
        return value  # numbers and strings: read when state_dict() was called

    def synchronize_staging(self) -> None:
        """Nothing: AsyncCheckpointer waits through wait_for_copy() and the future."""

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        if self._slab is not None:
            self._slab.release()
            self._slab = None
