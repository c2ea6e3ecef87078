"""What the training loop asks of the other replica groups, and the answer of a run of one.

A run is one or more replica groups, each a complete copy of the model laid out as its
layout says (worker/fault_tolerance.py: torchft, docs/design.md "Fast recovery"). The
training loop (worker/train.py) is the same for both: it asks a `CrossGroupSync` which step
comes next, which shares of the global batch this group trains, to sum gradients over the
groups, whether the step may be applied, and whether this group writes checkpoints. This
class is the synchronizer of a run without replica groups: one group, one share, nothing
to sum, every step applied, and it writes every checkpoint. So a plain run and a
replica-group run differ only in the object passed in, the way torchtitan's trainer takes
an optional FTManager rather than having a second loop.

The data split keeps the global batch what the user asked whoever is alive: the run's
data-parallel degree D is cut into `groups` equal shares of D / groups ranks each (share v
holds data-parallel ranks v * D / groups .. (v + 1) * D / groups - 1 of the run), and each
group trains the shares `shares()` names, accumulating their gradients; summed over the
groups and divided by `groups`, they are the gradient of the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from contract import ParallelLayout


@dataclass(frozen=True)
class GroupValues:
    """One value from every replica group, as the SDC check compares them."""

    values: list[int]  # by participating rank
    mine: int  # this group's index in `values`
    healed: list[bool]  # groups that healed from a peer since the last exchange: copies


class CrossGroupSync:
    """A run that is a single group: no peers, so every call is the identity."""

    groups = 1  # replica groups in the run (the shares of its global batch)

    def group_layout(self, layout: ParallelLayout) -> ParallelLayout:
        """The layout this group trains with (its share of the run's data parallel)."""
        return layout

    def attach(self, state: dict[str, Any], resumed_step: int | None) -> None:
        """The checkpoint state a peer heals from, and the step a resume loaded."""

    def next_step(self, trained: int) -> int:
        """The step to train after `trained` (the last one this group applied). Replica
        groups agree on it with the others first and may heal into `state` here."""
        return trained + 1

    def shares(self) -> list[int]:
        """The shares of the global batch this group trains this step."""
        return [0]

    def sum_gradients(
        self, grads: Sequence[torch.Tensor], loss_sum: torch.Tensor, num_losses: int
    ) -> tuple[torch.Tensor, int]:
        """Sum this rank's gradient shards and losses with its peers' in the other groups
        (in place for the gradients) and make the gradients the mean over every share.
        Returns the loss sum and count over every share."""
        return loss_sum, num_losses

    def should_commit(self) -> bool:
        """Whether every collective of this step succeeded in every group (apply it)."""
        return True

    def writes_checkpoints(self) -> bool:
        """Whether this group writes the run's checkpoints (one writer at a time)."""
        return True

    def gather_across_groups(self, value: torch.Tensor) -> GroupValues | None:
        """Every group's `value` (an int64 scalar) at this rank's mesh coordinate, which of
        them is this group's, and which groups healed since the last such exchange; None
        when not every group of the run is there to compare (a group lost, or one failed
        during the exchange)."""
        return None

    def close(self, failed: bool) -> None:
        """Leave the other groups; `failed`: the loop raised (peers must learn at once)."""
