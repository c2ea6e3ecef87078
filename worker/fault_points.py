"""Where a test's fault may enter training: one named hook point per phase of a step and of
a checkpoint, the way `CrossGroupSync` names what the loop asks of other replica groups.

The training loop, the step and the checkpointer are handed a `FaultPoints` and call it at
each point; they never read the fault settings themselves. This class is production's: every
point does nothing, and `NO_FAULTS` is its one instance. The tests' faults (RUNYARD_FAULT,
parsed once when a rank starts) are a subclass that acts at the points they name
(worker/faults.py: InjectedFaults), built by train() only where the setting is present.

The points, in the order a step reaches them:
  in_update      inside the timed optimizer update, before the weights change (slow_step)
  after_update   the update is applied (flip_param)
  step_values    the step's loss, as the next report will read it (nan_at_step)
  after_step     the step is trained and its checkpoint, if due, started (after_step,
                 raise_after_step)
  step_end       the step's very end, outside the timed update (pace_step)
and those of a checkpoint, in the order a save reaches them:
  write          the writer (a thread or a process of its own), before it writes this
                 rank's files (slow_checkpoint_write, gil_checkpoint_write)
  before_verify  rank 0's writer, every rank's files written, before it checks them
                 against their checksums (corrupt_before_commit)
  before_commit  training's thread, the save complete, before rank 0's marker (before_commit)
  after_commit   rank 0, the COMMITTED marker written (corrupt_after_commit)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch


class FaultPoints:
    """The hook points of a run without injected faults: each does nothing (a subclass
    acts; any subclass must pickle, since a checkpoint writer process receives it)."""

    def in_update(self, step: int, rank: int) -> None:
        """Inside the timed optimizer update of `step`, before the weights change."""

    def after_update(self, step: int, rank: int, parameters: Sequence[torch.Tensor]) -> None:
        """`step`'s update is applied to `parameters` (this rank's shards)."""

    def step_values(self, step: int, rank: int, loss_sum: torch.Tensor) -> torch.Tensor:
        """`step`'s loss sum, on the device, as the next report will read it."""
        return loss_sum

    def after_step(self, step: int, rank: int) -> None:
        """`step` is trained, and its checkpoint, if one is due, started (or committed)."""

    def step_end(self, step: int, rank: int, started: float, shares: int) -> None:
        """The very end of `step`, begun at `started` (time.monotonic()), which trained
        `shares` shares of the global batch (worker/cross_group.py)."""

    def write(self, step: int, rank: int) -> None:
        """In the checkpoint writer, before it writes this rank's files of `step`'s save."""

    def before_verify(self, step: int, rank: int, folder: Path) -> None:
        """In rank 0's writer: every rank's files of `folder` are written, and the manifest;
        next they are checked against their checksums."""

    def before_commit(self, step: int, rank: int) -> None:
        """`step`'s save is complete on this rank; next rank 0 writes the marker."""

    def after_commit(self, step: int, rank: int, folder: Path) -> None:
        """Rank 0 wrote `folder`'s COMMITTED marker."""


NO_FAULTS = FaultPoints()  # production's: no point does anything
