"""A Lightning script that runs under runyard with one callback.

The tiny Llama of examples/hf_trainer.py as a LightningModule, on the same bytes of Python's
standard library, trained with DDP on CPUs. runyard adds one callback, named where Lightning
asks for it:

    runyard = RunyardCallback()
    trainer = Trainer(..., callbacks=[runyard, ModelCheckpoint(every_n_train_steps=20)])
    trainer.fit(module, ckpt_path=runyard.ckpt_path())

(ModelCheckpoint's folder is left unset: the callback makes it the run's checkpoint folder.)

Under runyard (`entrypoint: {script: /shared/code/examples/lightning_train.py}` in a run
spec) the launcher starts one copy per rank with torchrun's variables
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Lightning reads exactly those
through its TorchElasticEnvironment, named here because Lightning would otherwise see
Slurm's variables (the launcher runs inside a Slurm job) and take its ranks from SLURM_*.
Standalone: `python examples/lightning_train.py --steps 50`.

Batches are a function of the step: after a resume from a checkpoint taken mid-epoch,
Lightning restarts the data from the start of the epoch unless the data knows where it
was, so `train_dataloader` starts the stream after the trainer's (restored) global step,
and a resumed run trains on exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

import torch
from hf_trainer import stdlib_bytes, tiny_llama
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from runyard_client.integrations.lightning import RunyardCallback
from transformers import get_cosine_schedule_with_warmup


class StepBatches:
    """This rank's batches from batch `first` on, each a function of its index and rank
    only: the same in every attempt. Endless; `max_steps` ends training."""

    def __init__(
        self, data: torch.Tensor, first: int, rank: int, batch_size: int, seq_len: int
    ) -> None:
        self.data, self.first, self.rank = data, first, rank
        self.batch_size, self.seq_len = batch_size, seq_len

    def __iter__(self) -> Iterator[torch.Tensor]:
        index = self.first
        while True:
            index += 1
            generator = torch.Generator().manual_seed(index * 1000 + self.rank)
            starts = torch.randint(0, len(self.data) - self.seq_len, (self.batch_size,),
                                   generator=generator)  # fmt: skip
            yield torch.stack([self.data[s : s + self.seq_len] for s in starts.tolist()])


class TinyLlama(LightningModule):
    def __init__(self, steps: int, seq_len: int = 64, batch_size: int = 8, lr: float = 3e-3):
        super().__init__()
        self.steps, self.seq_len, self.batch_size, self.lr = steps, seq_len, batch_size, lr
        self.model = tiny_llama(seq_len)
        self.data = stdlib_bytes()

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.model(input_ids=batch, labels=batch).loss  # the model shifts the labels

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=0.01)
        warmup = min(10, self.steps // 10)  # as examples/hf_trainer.py
        schedule = get_cosine_schedule_with_warmup(optimizer, warmup, self.steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def train_dataloader(self) -> StepBatches:
        # Called after a checkpoint is restored: global_step is the resumed step by then.
        first = self.trainer.global_step * self.trainer.accumulate_grad_batches
        return StepBatches(self.data, first, self.global_rank, self.batch_size, self.seq_len)


def ranks_per_node() -> int:
    """torchrun's LOCAL_WORLD_SIZE, else Slurm's tasks per node (runyard: one per GPU)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE") or 1)


def make_trainer(runyard: RunyardCallback, steps: int, save_steps: int) -> Trainer:
    world_size, devices = int(os.environ.get("WORLD_SIZE", "1")), ranks_per_node()
    strategy = (
        DDPStrategy(cluster_environment=TorchElasticEnvironment()) if world_size > 1 else "auto"
    )
    return Trainer(
        accelerator="cpu",
        strategy=strategy,
        devices=devices,
        num_nodes=world_size // devices,
        max_steps=steps,
        log_every_n_steps=1,  # runyard reports at Lightning's logging cadence
        callbacks=[runyard, ModelCheckpoint(every_n_train_steps=save_steps)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=0, help="default: the run spec's steps")
    parser.add_argument("--save-steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per rank")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    runyard = RunyardCallback()
    steps = args.steps or runyard.session.steps or 200
    module = TinyLlama(steps, args.seq_len, args.batch_size, args.lr)
    trainer = make_trainer(runyard, steps, args.save_steps)
    if runyard.ckpt_path() is not None and runyard.session.is_rank0:
        print(f"resuming from {runyard.ckpt_path()}", flush=True)
    trainer.fit(module, ckpt_path=runyard.ckpt_path())


if __name__ == "__main__":
    main()
