"""One optimizer step's forward and backward passes, whatever the layout.

Without a pipeline, the rank runs its micro batches one after another and accumulates
gradients, telling data parallel when to reduce them. With one, the pipeline schedule runs
them through this rank's stages in 1F1B order. Either way the loss is the mean next-token
cross entropy and the gradient is that of the mean over the whole global batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from contract import WorkerRunConfig
from worker.data import TokenBatches
from worker.parallel import ParallelDims, TrainingModel
from worker.parallel.context_parallel import shard_sequence
from worker.parallel.data_parallel import set_micro_batch_sync


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy, in fp32 whatever the compute dtype."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def build_optimizer(part: torch.nn.Module, config: WorkerRunConfig) -> torch.optim.AdamW:
    """AdamW over one model part (a pipeline stage has its own: its parameters live only on
    its ranks), with Llama's betas; its learning rate is set every step by the loop."""
    decay = [p for p in part.parameters() if p.dim() >= 2]  # no weight decay on norm gains
    no_decay = [p for p in part.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=(0.9, 0.95),
    )


def forward_backward(
    model: TrainingModel,
    batches: TokenBatches,
    step: int,
    config: WorkerRunConfig,
    dims: ParallelDims,
    device: torch.device,
) -> tuple[torch.Tensor, int]:
    """Every micro batch of `step` forward and backward, gradients accumulating in the
    parameters. Returns the sum of the micro-batch losses this rank computed, and how many."""
    accum, mbs = config.grad_accum, config.layout.micro_batch_size
    dp_rank, cp_rank = dims.mesh("dp").get_local_rank(), dims.mesh("cp").get_local_rank()
    micro = []
    for m in range(accum):
        inputs, targets = batches.micro_batch(step, m, dp_rank, dims.dp, mbs)
        # Context parallel: each cp rank keeps its two chunks of every sequence.
        micro.append(
            tuple(shard_sequence(t, dims.cp, cp_rank).to(device) for t in (inputs, targets))
        )
    if model.schedule is not None:
        # The schedule cuts the step's batch back into `accum` micro batches and runs 1F1B:
        # sync: activations and their gradients go point-to-point between stages.
        inputs, targets = (torch.cat([mb[i] for mb in micro]) for i in (0, 1))
        losses: list[torch.Tensor] = []
        with model.autocast():
            if model.has_first_stage:
                model.schedule.step(inputs, target=targets, losses=losses)
            else:
                model.schedule.step(target=targets, losses=losses)
        total = torch.stack(losses).sum() if losses else torch.zeros((), device=device)
        return total.detach(), len(losses)
    total = torch.zeros((), device=device)
    for m, (inputs, targets) in enumerate(micro):
        # sync: data parallel reduces gradients during backward; on all but the last micro
        # batch it holds them back (DDP, ZeRO-1) so accumulation costs one reduction a step.
        set_micro_batch_sync(model.parts, config.layout.zero_stage, last=m == accum - 1)
        with model.autocast():
            logits = model.parts[0](inputs)
        loss = next_token_loss(logits, targets)
        (loss / accum).backward()
        total += loss.detach()
    return total, accum
