"""Pipeline parallel with torch.distributed.pipelining: stages, their blocks, the schedule.

The model's blocks are cut into pp x vp contiguous stages. With 1F1B (vp 1) pp rank r runs
stage r. With interleaved 1F1B, rank r runs vp stages, r, r + pp, r + 2pp, ... (the
"looped" placement of Narayanan et al. 2021), which divides the pipeline bubble by vp at the
cost of vp times more activation sends.

Uneven splits are allowed: when pp x vp does not divide the layers, the extra blocks go to
the stages farthest from both ends. The first stage also holds the embedding and, under
1F1B, the most micro batches in flight; the last holds the output head and the loss; so
Llama 3 took a block off each (Llama 3 paper, section 3.3.2). The busiest stage then has
ceil(layers / (pp x vp)) blocks, which is what the planner charges (planner/layout.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleInterleaved1F1B,
    _PipelineSchedule,
)
from torch.distributed.pipelining.stage import _PipelineStageBase

from contract import ParallelLayout, PipelineSchedule
from worker.model import Transformer


def split_layers(num_layers: int, num_stages: int) -> list[list[int]]:
    """Block ids of each stage: contiguous, as even as possible, extras in the middle."""
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"cannot cut {num_layers} layers into {num_stages} stages")
    base, extra = divmod(num_layers, num_stages)
    # Middle stages first (farthest from an end), then by index for a stable order.
    by_preference = sorted(range(num_stages), key=lambda s: (-min(s, num_stages - 1 - s), s))
    gets_extra = set(by_preference[:extra])
    stages, first = [], 0
    for stage in range(num_stages):
        size = base + (stage in gets_extra)
        stages.append(list(range(first, first + size)))
        first += size
    return stages


def stage_ids(pp_rank: int, pp: int, vp: int) -> list[int]:
    """The stages pp rank `pp_rank` runs, in schedule order ("looped" placement)."""
    return [pp_rank + k * pp for k in range(vp)]


def stage_model(whole: Transformer, stage: int, num_stages: int) -> Transformer:
    """A copy of `whole` (on the meta device: a copy costs nothing) cut down to one stage.
    Kept blocks keep their keys, so parameter names are those of the whole model and a
    checkpoint loads into any split."""
    part = copy.deepcopy(whole)
    keep = {str(i) for i in split_layers(whole.shape.layers, num_stages)[stage]}
    for key in [k for k in part.layers if k not in keep]:
        del part.layers[key]
    if stage > 0:
        part.tok_embeddings = None
    if stage < num_stages - 1:
        part.norm, part.output = None, None
    return part


def split_model(whole: Transformer, pp_rank: int, layout: ParallelLayout) -> list[Transformer]:
    """This rank's stage models, in stage_ids order."""
    num_stages = layout.pp * layout.vp
    return [stage_model(whole, s, num_stages) for s in stage_ids(pp_rank, layout.pp, layout.vp)]


def build_schedule(
    parts: list[Transformer],
    pp_mesh: DeviceMesh,
    layout: ParallelLayout,
    num_micro_batches: int,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> _PipelineSchedule:
    """The schedule that runs one data share's micro batches through this rank's stages.

    It calls the loss per micro batch on the last stage, divided by the number of micro
    batches: the same gradient as averaging the micro-batch losses without a pipeline. The
    schedule's own scale_grads would divide every gradient accumulated so far at the end of
    each call instead, which is wrong when a step calls it more than once (a replica group
    training a missing group's share too: worker/step.py); the losses it returns are scaled
    alike, and the caller multiplies them back.
    """
    num_stages = layout.pp * layout.vp
    ids = stage_ids(pp_mesh.get_local_rank(), layout.pp, layout.vp)
    stages: list[_PipelineStageBase] = [
        PipelineStage(part, stage, num_stages, device, group=pp_mesh.get_group())
        for part, stage in zip(parts, ids, strict=True)
    ]

    def share_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return loss_fn(logits, targets) / num_micro_batches

    if layout.schedule is PipelineSchedule.INTERLEAVED_1F1B:
        return ScheduleInterleaved1F1B(
            stages, n_microbatches=num_micro_batches, loss_fn=share_loss, scale_grads=False
        )
    return Schedule1F1B(
        stages[0], n_microbatches=num_micro_batches, loss_fn=share_loss, scale_grads=False
    )
