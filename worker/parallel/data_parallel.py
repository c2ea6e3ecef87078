"""Data parallel, from DDP to FSDP, all on FSDP2's composable API; and gradient clipping.

zero_stage 0 is DDP: `replicate` (FSDP2's data parallel without sharding), whose
parameters are DTensors like every other layout's, so it composes with tensor parallel and
its checkpoints reshard like the rest. Stages 1 to 3 are `fully_shard` with different
reshard options, applied per block so communication overlaps compute block by block:
  1  optimizer state sharded; parameters gathered once per step and kept for all its micro
     batches; gradients accumulated whole and reduce-scattered once, on the last one.
  2  also gradients sharded: reduce-scattered after every micro batch's backward.
  3  also parameters sharded: freed after each block's forward, gathered again in backward.
Gradients are averaged over dp x cp: context-parallel ranks hold the same weights but
different tokens of the same sequences.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from contract import ParallelLayout, Precision
from worker.model import Transformer


def mixed_precision(layout: ParallelLayout) -> MixedPrecisionPolicy:
    """BF16 compute with FP32 master weights and FP32 gradient reduction (an average over
    many ranks loses bits in BF16); FP32 layouts compute in FP32."""
    if layout.precision is Precision.FP32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def apply_data_parallel(model: Transformer, dp_mesh: DeviceMesh, layout: ParallelLayout) -> None:
    """Replicate or shard `model` (a whole model or one pipeline stage) over `dp_mesh`."""
    mp_policy = mixed_precision(layout)
    if layout.zero_stage == 0:
        for block in model.layers.values():
            replicate(block, mesh=dp_mesh, mp_policy=mp_policy)
        replicate(model, mesh=dp_mesh, mp_policy=mp_policy)
        return
    for block in model.layers.values():
        fully_shard(
            block,
            mesh=dp_mesh,
            mp_policy=mp_policy,
            reshard_after_forward=layout.zero_stage == 3,
        )
    # The root group (embeddings, final norm, output head) is needed again first thing in
    # backward: None keeps it gathered after forward, whatever the stage.
    fully_shard(
        model,
        mesh=dp_mesh,
        mp_policy=mp_policy,
        reshard_after_forward=None if layout.zero_stage == 3 else False,
    )


def set_micro_batch_sync(parts: Sequence[nn.Module], zero_stage: int, last: bool) -> None:
    """Before each micro batch's backward (no pipeline): whether its gradients are reduced
    now and whether parameters are freed after it, following the stage's rules above.
    (Pipeline schedules make this call themselves.)"""
    for part in parts:
        if isinstance(part, FSDPModule):
            part.set_requires_gradient_sync(last or zero_stage >= 2)
            part.set_reshard_after_backward(last or zero_stage == 3)


def clip_grad_norm(
    parameters: Sequence[nn.Parameter], max_norm: float, pp_mesh: DeviceMesh | None
) -> torch.Tensor:
    """Clip by the global gradient norm over `parameters`, every one of this rank's parts.

    A DTensor norm is the norm of this rank's shards; `full_tensor()` combines it over the
    ranks that shard the parameters (dp, tp). Pipeline stages hold different parameters, so
    their squared norms are summed over the pp group.
    """
    params = [p for p in parameters if p.grad is not None]
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    if pp_mesh is not None and pp_mesh.size() > 1:
        squared = norm**2
        dist.all_reduce(squared, group=pp_mesh.get_group())  # sync: every stage's share
        norm = squared.sqrt()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)
    return norm
