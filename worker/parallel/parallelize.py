"""Apply the layout to a model: for now data parallel only (DDP).

torchtitan's order, which later stages will follow here: tensor parallel, then activation
checkpointing, then torch.compile, then FSDP. Until those exist, layouts that need them
are refused up front with a clear message rather than silently trained another way.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from worker.config import ParallelLayout, Precision, Recompute
from worker.errors import UnsupportedLayoutError


def check_supported(layout: ParallelLayout) -> None:
    """Raise UnsupportedLayoutError, naming the field, for what this worker cannot do yet."""
    unsupported = [
        f"{name}={getattr(layout, name)}"
        for name in ("tp", "pp", "cp")
        if getattr(layout, name) > 1
    ]
    if layout.zero_stage > 0:
        unsupported.append(f"zero_stage={layout.zero_stage}")
    if layout.recompute is not Recompute.NONE:
        unsupported.append(f"recompute={layout.recompute.value}")
    if layout.precision is Precision.FP8:
        unsupported.append("precision=fp8")
    if unsupported:
        raise UnsupportedLayoutError(
            f"layout {', '.join(unsupported)} is not supported yet by this worker "
            "(supported: data parallel with zero_stage=0, recompute=none, fp32/bf16)"
        )


def parallelize_llama(
    model: nn.Module, mesh: DeviceMesh, layout: ParallelLayout
) -> DistributedDataParallel:
    """Wrap the model for the layout; returns the module the training loop calls."""
    check_supported(layout)
    device = next(model.parameters()).device
    # DDP all-reduces gradient buckets during backward, overlapping communication with
    # the rest of the backward pass; the loop uses no_sync() to skip it on accumulation steps.
    return DistributedDataParallel(
        model,
        process_group=mesh.get_group("dp"),
        device_ids=[device.index] if device.type == "cuda" else None,
        # The only buffers (RoPE tables) are computed identically on every rank: broadcasting
        # them from rank 0 before every forward would be a wasted collective per micro step
        # (torch 2.13 name; it still syncs them once at construction, which is harmless).
        forward_sync_buffers=False,
    )
