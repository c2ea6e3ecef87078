"""Validation loss on the held-out split of a prepared dataset, every `eval_every` steps.

The evaluation set is fixed for the whole run: the first `num_batches` global batches the
seeded window order gives over the validation stream (the same for every eval, every
attempt, and any data-parallel degree; see data.TokenBatches), so the curve it draws
compares like with like. Every rank runs its share of those batches forward only, through
the same layout as training (pipeline stages, tensor and context parallel shards), and one
all-reduce gives every rank the mean loss.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.distributed as dist

from contract import WorkerRunConfig
from worker.data import TokenBatches, open_corpus
from worker.parallel import ParallelDims, TrainingModel
from worker.parallel.context_parallel import shard_sequence
from worker.step import next_token_loss

# Global batches per evaluation at most: 8 x global_batch sequences keeps an eval within
# about eight steps' forward time (a third of eight training steps' compute).
MAX_EVAL_BATCHES = 8


class Evaluator:
    """The held-out batches of one run and the forward passes that score them."""

    def __init__(self, config: WorkerRunConfig, dims: ParallelDims, device: torch.device) -> None:
        stream = open_corpus(config.data, Path(config.data_cache_dir), split="validation")
        self.batches = TokenBatches(stream, config.seq_len, config.global_batch, config.seed)
        self.num_batches = min(
            MAX_EVAL_BATCHES, math.ceil(self.batches.num_windows / config.global_batch)
        )
        self.config, self.dims, self.device = config, dims, device
        self.every = config.eval_every or 1

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def _batch_losses(self, model: TrainingModel, batch: int) -> tuple[torch.Tensor, int]:
        """Sum and count of this rank's micro-batch losses on held-out batch `batch`. A
        replica group scores every share of it (worker/cross_group.py), so its figure is
        the whole batch's, as a run without groups has it."""
        config, dims = self.config, self.dims
        accum, mbs = config.grad_accum, config.layout.micro_batch_size
        dp_rank, cp_rank = dims.mesh("dp").get_local_rank(), dims.mesh("cp").get_local_rank()
        run_dp = config.layout.dp
        micro = [
            tuple(
                shard_sequence(t, dims.cp, cp_rank).to(self.device)
                for t in self.batches.micro_batch(batch, m, share * dims.dp + dp_rank, run_dp, mbs)
            )
            for share in range(run_dp // dims.dp)
            for m in range(accum)
        ]
        if model.schedule is not None:
            # The schedule's forward-only pass, a share at a time (its losses come back
            # divided by accum: worker/parallel/pipeline.py); sync: activations go
            # point-to-point.
            losses: list[torch.Tensor] = []
            for first in range(0, len(micro), accum):
                chunk = micro[first : first + accum]
                inputs, targets = (torch.cat([mb[i] for mb in chunk]) for i in (0, 1))
                share_losses: list[torch.Tensor] = []  # the schedule clears the list it fills
                with model.autocast():
                    if model.has_first_stage:
                        model.schedule.eval(inputs, target=targets, losses=share_losses)
                    else:
                        model.schedule.eval(target=targets, losses=share_losses)
                losses += share_losses
            if not losses:
                return torch.zeros((), device=self.device), 0
            return torch.stack(losses).sum() * accum, len(losses)
        total = torch.zeros((), device=self.device)
        for inputs, targets in micro:
            with model.autocast():
                logits = model.parts[0](inputs)
            total += next_token_loss(logits, targets)
        return total, len(micro)

    @torch.no_grad()
    def loss(self, model: TrainingModel) -> float:
        """Mean next-token loss over the evaluation set; every rank calls it at one step."""
        total = torch.zeros((), device=self.device)
        count = 0
        for batch in range(self.num_batches):
            batch_total, batch_count = self._batch_losses(model, batch)
            total += batch_total.float()
            count += batch_count
        stats = torch.stack([total, torch.tensor(float(count), device=self.device)])
        dist.all_reduce(stats)  # sync: losses summed over the ranks that computed one
        loss_sum, num_losses = stats.tolist()  # host sync, once per evaluation
        return loss_sum / num_losses
