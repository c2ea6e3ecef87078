"""runyard for Lightning (`lightning.pytorch`): one callback.

    runyard = RunyardCallback()                       # connects to runyard (or standalone)
    trainer = Trainer(..., callbacks=[runyard, ModelCheckpoint(every_n_train_steps=50)])
    trainer.fit(model, data, ckpt_path=runyard.ckpt_path())

What it does, hook by hook:
- reports at the Trainer's logging cadence (`log_every_n_steps`), at a stop and at the end:
  the step, the loss (what `training_step` returned, summed over the micro-batches of an
  optimizer step as Lightning scales them, meaned over the window and over every rank in
  one all-reduce per report), the learning rate the step used (the first parameter
  group's, read just before the optimizer steps) and the tokens per step: each training
  batch's token count, from its shape only (its `input_ids`, or its first integer tensor:
  batch size x sequence length, padding included), times the world size. A batch of
  another form takes `tokens_in_batch=`. Between reports the loss stays on the device.
- commits each checkpoint once `Trainer.save_checkpoint` has returned. Lightning calls
  the callbacks' `on_save_checkpoint` while it builds the checkpoint, before any byte is
  written, and ModelCheckpoint runs after every other callback, so no hook of ours comes
  after its save within the step. `Trainer.save_checkpoint` is where every save goes
  (ModelCheckpoint's, ours at a stop, the script's own) and it ends in a barrier of every
  rank, so the callback wraps that one method of this Trainer for the duration of `fit`:
  when it returns the file is complete on every rank, and rank 0 commits it. Saves
  outside the run's folder (an export) and weights-only saves (they cannot resume
  training) are not committed; AsyncCheckpointIO, whose save returns before the file is
  written, is refused.
- on `session.should_stop` (cancel, preemption, the end of a time-limited segment,
  SIGUSR2), agreed by every rank through the strategy's `reduce_boolean_decision` (only
  rank 0 hears the service) once per optimizer step, saves `stop-step=N.ckpt` in the
  run's folder with `trainer.save_checkpoint` and sets `trainer.should_stop`. Lightning
  keeps training while `min_steps` / `min_epochs` are not reached, as it does for early
  stopping.
- fills in the run's folder as the `dirpath` of any ModelCheckpoint left without one, and
  hands over the newest committed checkpoint as `ckpt_path`; reports the run finished when
  `fit` ends other than by runyard's stop.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO

from runyard_client import Session, connect
from runyard_client.integrations._common import (
    ReportWindow,
    is_inside,
    num_bytes,
    require_inside,
    warn,
)


class RunyardCallback(Callback):
    """Reports, commits, stops and resumes a Lightning `fit` under runyard."""

    def __init__(
        self,
        session: Session | None = None,
        tokens_in_batch: Callable[[Any], int] | None = None,
    ) -> None:
        """`session`: the script's own, when it connected already; by default the callback
        connects, and closes the session when `fit` ends. `tokens_in_batch`: this rank's
        token count of a training batch, where the default reading of its shape does not
        fit the batch's form."""
        self._owns_session = session is None
        self.session = session if session is not None else connect()
        self._tokens_in_batch = tokens_in_batch or batch_tokens
        self._window = ReportWindow()
        self._step = 0  # the optimizer step the last batch ended
        self._loss_sum: torch.Tensor | None = None  # over the window's batches, on the device
        self._lr: float | None = None
        self._stopped = False  # runyard asked; saved and stopping
        self._warned_no_tokens = False

    @property
    def dirpath(self) -> str:
        """The run's checkpoint folder: ModelCheckpoint(dirpath=...) (filled in if unset)."""
        return str(self.session.checkpoint_dir)

    def ckpt_path(self) -> str | None:
        """The newest committed checkpoint, for `trainer.fit(..., ckpt_path=...)`; None on a
        fresh start."""
        return self.session.resume.path if self.session.resume is not None else None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if isinstance(trainer.strategy.checkpoint_io, AsyncCheckpointIO):
            raise ValueError(
                "AsyncCheckpointIO returns before the checkpoint is written, so runyard could "
                "commit an incomplete one: leave it out under runyard"
            )
        # Lightning runs ModelCheckpoint's setup after ours: it keeps a dirpath set here.
        for checkpoint in trainer.checkpoint_callbacks:
            if isinstance(checkpoint, ModelCheckpoint):
                if checkpoint.dirpath is None:
                    checkpoint.dirpath = os.path.realpath(self.dirpath)
                require_inside(checkpoint.dirpath, self.session.checkpoint_dir, "dirpath")
        save = trainer.save_checkpoint

        def save_then_commit(
            filepath: str | Path,
            weights_only: bool | None = None,
            storage_options: Any = None,
        ) -> None:
            save(filepath, weights_only, storage_options)
            if not weights_only:
                self._commit(trainer, Path(filepath))

        trainer.save_checkpoint = save_then_commit  # type: ignore[method-assign]

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        vars(trainer).pop("save_checkpoint", None)  # the class's own again
        if self._owns_session:
            self.session.close()

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._step = trainer.global_step
        self._window.start(trainer.global_step)
        self._loss_sum = None

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self._lr = float(optimizer.param_groups[0]["lr"])  # the rate this step uses

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            # Lightning divides each micro-batch's loss by accumulate_grad_batches: summed,
            # they make the step's loss. A device add: no synchronisation.
            # (A copy first: the report's all-reduce works in place.)
            loss = loss.detach()
            self._loss_sum = loss.clone() if self._loss_sum is None else self._loss_sum + loss
        self._count_tokens(trainer, batch)
        if trainer.global_step == self._step:
            return  # accumulating: the optimizer has not stepped yet
        self._step = trainer.global_step
        stop = trainer.strategy.reduce_boolean_decision(self.session.should_stop, all=False)
        every = getattr(trainer, "log_every_n_steps", 0)  # set by Lightning; 0: no logging
        if stop or (every > 0 and self._step % every == 0):
            self._report(trainer)
        if stop:
            trainer.save_checkpoint(Path(self.dirpath) / f"stop-step={self._step}.ckpt")
            trainer.should_stop = self._stopped = True

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._report(trainer)  # the steps since the last report
        # Stopped at runyard's request, the run is not done: the next attempt resumes.
        if self.session.is_rank0 and not self._stopped:
            self.session.finish(trainer.global_step)

    def _count_tokens(self, trainer: Trainer, batch: Any) -> None:
        tokens = self._tokens_in_batch(batch)
        if tokens == 0 and not self._warned_no_tokens:
            warn("no token ids found in the training batch: pass tokens_in_batch= to count them")
            self._warned_no_tokens = True
        self._window.num_tokens += tokens * trainer.world_size

    def _report(self, trainer: Trainer) -> None:
        """The window's mean loss over every rank (every rank calls this at the same step)."""
        if self._loss_sum is None or trainer.global_step == self._window.last_step:
            return
        num_steps = trainer.global_step - self._window.last_step
        loss = trainer.strategy.reduce(self._loss_sum, reduce_op="mean").item() / num_steps
        self._loss_sum = None
        tokens = self._window.close(trainer.global_step)
        if tokens is not None:
            self.session.report(trainer.global_step, loss, tokens, lr=self._lr)

    def _commit(self, trainer: Trainer, path: Path) -> None:
        """After Trainer.save_checkpoint returned: complete on every rank."""
        fitting = trainer.state.fn == "fit"
        if not (trainer.is_global_zero and fitting and path.exists()):
            return
        if is_inside(path, self.session.checkpoint_dir, strictly=True):
            self.session.committed(trainer.global_step, path.resolve(), num_bytes(path))


def batch_tokens(batch: Any) -> int:
    """This rank's tokens in a training batch, from its shape: the `input_ids` of a mapping,
    else the first integer tensor found (a tensor, or inside a mapping or a sequence)."""
    if isinstance(batch, torch.Tensor):
        is_ids = not batch.dtype.is_floating_point and not batch.dtype.is_complex
        return batch.numel() if is_ids and batch.dtype != torch.bool else 0
    if isinstance(batch, Mapping):
        if isinstance(batch.get("input_ids"), torch.Tensor):
            return batch["input_ids"].numel()
        batch = list(batch.values())
    if isinstance(batch, Sequence) and not isinstance(batch, str):
        for item in batch:
            if tokens := batch_tokens(item):
                return tokens
    return 0
