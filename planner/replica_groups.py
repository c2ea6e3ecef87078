"""How many replica groups a run is split into, chosen together with its layout.

Replica groups (docs/design.md, "Fast recovery") make a node failure cost one group's start
and a step, not the whole run's restart and the work since the last checkpoint. They are
not free, and what they cost depends on the layout:
- ZeRO/FSDP shards only inside a group (dp / G ranks, times cp), so each GPU holds G times
  more of the sharded states: a layout that fits as one group may not fit split in G;
- every step, each rank sums its local gradient shards with its peers in the other groups
  (an all-reduce over G ranks, one group's size apart, after the backward pass: the worker
  does not overlap it, worker/fault_tolerance.py), and the shards are larger when the
  groups are smaller;
- a failure still stalls every GPU for the fast path's stall and one step, and takes the
  failed group's 1 / G of the GPUs out while it restarts and heals (planner/reliability.py,
  with the failure rate, the spare pool it sizes and the costs measured by
  bench/recovery.py --compare).
So the planner costs every (layout, G) pair among the fastest layouts, G = 1 (no groups)
and every G the contract allows (contract.replica_layout_problems: G divides dp and the
nodes), and keeps the one with the most expected training throughput, tokens per second
times goodput. A pinned G is costed alone; a layout or size that admits no G >= 2 is
planned on the classic path only, and no fast-path figure is shown for it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from contract import replica_layout_problems

from .collectives import Fabric
from .layout import Layout
from .memory import memory_per_gpu, stage_params
from .reliability import Reliability, ReliabilityAssumptions, assess
from .search import TIE, Candidate, Request
from .step_time import estimate_step

# The gradient shards the groups sum are FP32: FSDP2 keeps gradients in the FP32 master
# parameters' dtype and reduces in FP32 (worker/parallel/data_parallel.py mixed_precision).
CROSS_GROUP_GRAD_BYTES = 4


@dataclass(frozen=True, slots=True)
class GroupChoice:
    """A layout split into `groups` replica groups (1: none), and what that costs."""

    candidate: Candidate  # the run as planned: ZeRO sharded in a group, its step time
    groups: int
    reliability: Reliability  # assessed at the candidate's step time, with `groups`

    @property
    def goodput(self) -> float:
        """The goodput of the path this choice recovers on."""
        fast = self.reliability.goodput_fast
        return fast if self.groups > 1 and fast is not None else self.reliability.goodput

    @property
    def throughput_per_s(self) -> float:
        """Expected productive steps per second of allocated time."""
        return self.goodput / self.candidate.step.total_s


def group_counts(layout: Layout, num_nodes: int) -> list[int]:
    """Every G >= 2 the contract lets `layout` on `num_nodes` nodes be split into."""
    return [g for g in range(2, layout.dp + 1) if not replica_layout_problems(layout, g, num_nodes)]


def cross_group_s(request: Request, fabric: Fabric, layout: Layout, groups: int) -> float:
    """One step's sum of every rank's local gradient shards over the G groups: an
    all-reduce of ranks one group's size apart (`layout` is the whole run's)."""
    group_dp = layout.dp // groups
    shards = group_dp * layout.cp if layout.zero_stage >= 1 else 1
    local = stage_params(request.model, layout) / shards * CROSS_GROUP_GRAD_BYTES
    group_ranks = layout.num_gpus // groups
    return fabric.collective_s(local, groups, group_ranks, passes=2)


def with_groups(
    request: Request,
    fabric: Fabric,
    candidate: Candidate,
    groups: int,
    assumptions: ReliabilityAssumptions,
) -> GroupChoice | None:
    """`candidate` (a layout as the search costed it, one group) split into `groups`
    groups; None when it no longer fits in memory."""
    layout = candidate.layout
    if groups > 1:
        group = dataclasses.replace(layout, dp=layout.dp // groups)
        memory = memory_per_gpu(
            request.model,
            group,
            request.seq_len,
            candidate.grad_accum,
            request.hardware.fused_loss,
        )
        if memory.total > request.hardware.hbm_bytes:
            return None
        step = estimate_step(
            request.model,
            request.hardware,
            fabric,
            group,
            request.seq_len,
            candidate.grad_accum,
            request.scale,
        )
        cross = cross_group_s(request, fabric, layout, groups) * request.scale.communication
        step = dataclasses.replace(step, dp_comm_s=step.dp_comm_s + cross)
        candidate = Candidate(layout, candidate.grad_accum, memory, step)
    rel = assess(
        request.model,
        request.num_gpus,
        request.gpus_per_node,
        candidate.step.total_s,
        dataclasses.replace(assumptions, replica_groups=groups if groups > 1 else 0),
    )
    return GroupChoice(candidate, groups, rel)


@dataclass(frozen=True, slots=True)
class GroupDecision:
    """The planner's (layout, G), and for a choice of no groups, the best split it turned
    down (None when no layout could be split, or G was pinned), so the plan can say why."""

    chosen: GroupChoice
    best_split: GroupChoice | None = None
    considered: int = 0  # layouts costed (the fastest; a pinned G: every one that fits)
    splittable: bool = False  # whether any of them has a G >= 2 the contract allows
    pinned: bool = False  # G was given (1: the classic path asked for), not chosen


def choose_groups(
    request: Request,
    ranked: list[Candidate],
    assumptions: ReliabilityAssumptions,
    pinned: int | None,
) -> GroupDecision | None:
    """The (layout, G) with the most expected throughput among `ranked` (fastest first);
    `pinned`: G fixed (1: no groups), None: the planner's choice. None when no ranked
    layout can take a pinned G."""
    fabric = Fabric.of(request.hardware, request.network, request.gpus_per_node)
    num_nodes = max(1, request.num_gpus // request.gpus_per_node)
    options: list[GroupChoice] = []
    splittable = False
    for candidate in ranked:
        counts = [1, *group_counts(candidate.layout, num_nodes)]
        splittable = splittable or len(counts) > 1
        for groups in counts if pinned is None else [g for g in counts if g == pinned]:
            choice = with_groups(request, fabric, candidate, groups, assumptions)
            if choice is not None:
                options.append(choice)
    if not options:
        return None
    # The most expected throughput; below the models' resolution (the search's TIE), the
    # search's order (the simpler layout) and then fewer groups (fewer jobs, less
    # cross-group traffic): groups are chosen only where they clearly pay.
    best = max(c.throughput_per_s for c in options)
    chosen = next(c for c in options if c.throughput_per_s >= best * (1 - TIE))
    splits = [c for c in options if c.groups > 1]
    declined = (
        max(splits, key=lambda c: c.throughput_per_s)
        if pinned is None and chosen.groups == 1 and splits
        else None
    )
    return GroupDecision(chosen, declined, len(ranked), splittable, pinned is not None)
