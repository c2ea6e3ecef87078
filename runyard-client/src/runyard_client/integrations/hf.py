"""runyard for `transformers.Trainer`: one callback.

    runyard = RunyardCallback()                       # connects to runyard (or standalone)
    args = TrainingArguments(output_dir=runyard.output_dir, save_steps=50, logging_steps=1, ...)
    trainer = Trainer(model, args, train_dataset=data, callbacks=[runyard])
    trainer.train(resume_from_checkpoint=runyard.resume_from_checkpoint())

What it does, hook by hook:
- reports at the Trainer's own logging cadence (`logging_steps`): the step, the loss the
  Trainer logs (its mean over the steps since the last log and over every rank), the
  learning rate it logs, and the tokens trained per step. The Trainer keeps the loss on the
  device between logs and gathers it only to log, so the callback costs no synchronisation
  of its own; `logging_steps=1` reports every step at the price of the Trainer's gather.
  Tokens: `state.num_input_tokens_seen` when the Trainer counts them
  (`include_num_input_tokens_seen="all"` or `"non_padding"`: exact, all ranks, but a
  gather per micro-batch); otherwise the shape of each training batch's `input_ids` as the
  model sees it (batch size x sequence length, padding included) times the world size,
  read by a forward pre-hook without touching the data.
- commits `<output_dir>/checkpoint-N` in `on_save`, which the Trainer calls after it has
  written the folder; a barrier first waits for every rank's share (each writes its own
  RNG state, and sharded strategies their shards), and a folder without
  `trainer_state.json`, the file the Trainer resumes from, is never committed.
- on `session.should_stop` (cancel, preemption, the end of a time-limited segment,
  SIGUSR2) asks the Trainer to save and stop at the end of the step
  (`control.should_save`, `control.should_training_stop`). The Trainer does not share its
  control flags between ranks and only rank 0 hears the service, so the flag is all-reduced
  (any rank) every step when torch.distributed is initialised: one 1-element all-reduce.
- hands over the newest committed checkpoint as `resume_from_checkpoint`, and reports the
  run finished when the Trainer reaches `max_steps` (not after a stop).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.hooks import RemovableHandle
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from runyard_client import Session, connect
from runyard_client.integrations._common import (
    ReportWindow,
    is_inside,
    num_bytes,
    require_inside,
    warn,
)

TRAINER_STATE = "trainer_state.json"  # the Trainer writes it last but one; resumes from it
CHECKPOINT_PREFIX = "checkpoint-"  # transformers' PREFIX_CHECKPOINT_DIR


class RunyardCallback(TrainerCallback):
    """Reports, commits, stops and resumes a `transformers.Trainer` run under runyard."""

    def __init__(self, session: Session | None = None) -> None:
        """`session`: the script's own, when it connected already; by default the callback
        connects, and closes the session when training ends."""
        self._owns_session = session is None
        self.session = session if session is not None else connect()
        self._window = ReportWindow()
        self._hook: RemovableHandle | None = None
        self._tokens_seen = 0  # num_input_tokens_seen at the last report (when counted)
        self._stopped = False  # runyard asked, and the Trainer saved and stopped

    @property
    def output_dir(self) -> str:
        """The run's checkpoint folder: pass it as `TrainingArguments(output_dir=...)`."""
        return str(self.session.checkpoint_dir)

    def resume_from_checkpoint(self) -> str | None:
        """The newest committed `checkpoint-N` folder, for `trainer.train(
        resume_from_checkpoint=...)`; None on a fresh start."""
        return self.session.resume.path if self.session.resume is not None else None

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        require_inside(str(args.output_dir), self.session.checkpoint_dir, "output_dir")
        if args.save_only_model:
            raise ValueError(
                "save_only_model=True: such checkpoints hold no optimizer state and cannot "
                "resume training; leave it False under runyard"
            )
        self._window.start(state.global_step)
        self._tokens_seen = state.num_input_tokens_seen
        if args.include_num_input_tokens_seen == "no" and model is not None:
            self._hook = model.register_forward_pre_hook(self._count_tokens, with_kwargs=True)

    def _count_tokens(self, model: torch.nn.Module, args: tuple[Any, ...], kwargs: Any) -> None:
        """This rank's training batch, by its shape only (no device access)."""
        if not model.training:
            return
        name = getattr(model, "main_input_name", "input_ids")
        inputs = kwargs.get(name, args[0] if args else None)
        if isinstance(inputs, torch.Tensor):
            self._window.num_tokens += inputs.numel()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not _any_rank(self.session.should_stop, args):
            return
        # The Trainer logs, saves (on_save commits) and leaves its loop at this step's end.
        control.should_log = control.should_save = control.should_training_stop = True
        self._stopped = True

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if not logs or "loss" not in logs:  # evaluation and the final summary: not a step
            return
        if args.include_num_input_tokens_seen != "no":
            self._window.num_tokens = state.num_input_tokens_seen - self._tokens_seen
            self._tokens_seen = state.num_input_tokens_seen
        else:
            self._window.num_tokens *= args.world_size  # every rank trains a batch this shape
        tokens = self._window.close(state.global_step)
        if tokens is not None:
            self.session.report(
                state.global_step, logs["loss"], tokens, lr=logs.get("learning_rate")
            )

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if args.world_size > 1 and dist.is_initialized():
            dist.barrier()  # every rank has written its part (RNG state, shards) by now
        if not self.session.is_rank0:
            return
        folder = Path(str(args.output_dir)) / f"{CHECKPOINT_PREFIX}{state.global_step}"
        if not (folder / TRAINER_STATE).is_file():
            warn(f"{folder} has no {TRAINER_STATE}: not committed (the Trainer cannot resume it)")
            return
        if is_inside(folder, self.session.checkpoint_dir, strictly=True):
            self.session.committed(state.global_step, folder.resolve(), num_bytes(folder))

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        # Stopped early at runyard's request, the run is not done: the next attempt resumes.
        if self.session.is_rank0 and (not self._stopped or state.global_step >= state.max_steps):
            self.session.finish(state.global_step)
        if self._owns_session:
            self.session.close()


def _any_rank(flag: bool, args: TrainingArguments) -> bool:
    """True on every rank when any rank's `flag` is: only rank 0 hears the service."""
    if args.world_size <= 1 or not dist.is_initialized():
        return flag
    # NCCL reduces only device tensors; gloo (CPU runs) only host ones.
    device = args.device if dist.get_backend() == "nccl" else torch.device("cpu")
    shared = torch.tensor([int(flag)], device=device)
    dist.all_reduce(shared, op=dist.ReduceOp.MAX)
    return bool(shared.item())
