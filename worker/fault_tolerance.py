"""Replica groups: torchft's per-step fault tolerance, as the training loop's synchronizer.

A fault-tolerant run is several replica groups, each a complete copy of the model laid out
inside the group as its layout says (FSDP/ZeRO, tp, pp with virtual stages, cp) and each its
own Slurm job. Every step, the groups agree on a quorum through torchft's lighthouse (the
service starts one per run), sum their gradients over the groups in the quorum, and apply
the step only if every cross-group collective succeeded. A group that lost a node drops out
of the next quorum: the others go on without stopping. Its replacement (a new Slurm job on a
spare) joins the quorum, sees it is behind, and heals: torchft copies the weights, the
optimizer state and our counters from a live peer over HTTP, with no disk read. At most the
one step in flight when the group died is computed again.

Per mesh coordinate: every rank has its own torchft Manager (rank 0 of the group runs the
group's manager server, the others are its clients), and its cross-group process group
joins it to the rank with the same group rank in every other group. All groups share one
layout, so equal group ranks hold equal mesh coordinates and so the same shards: each rank
sums its own local gradient shards with its peers', whatever the layout (torchft's HSDP and
torchtitan's torchft integration work the same way), and heals from the rank at its
coordinates in a live group.

What torchft gives: the lighthouse, the quorum, the fault-tolerant cross-group process
group, healing over HTTP and the commit vote. What this module adds: the data shares that
keep the global batch (worker/cross_group.py), bucketed gradient sums, the cross-group
parameter comparison the SDC check uses, which group writes checkpoints (the one with
participating rank 0, one writer at a time), and the refusal to train alone from scratch.
The training loop is worker/train.py's, the same for every run.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL
from torchft.process_group import ProcessGroupWrapper

from contract import ParallelLayout, ReplicaGroupConfig, group_layout
from worker.cross_group import CrossGroupSync, GroupValues
from worker.shards import local_shard

# A replacement group waits this long for a quorum (its peers may be mid-step, or the
# lighthouse waiting on a group that just died); survivors never wait this long.
QUORUM_TIMEOUT_S = 300.0
# A group starting (from scratch or from disk) asks again this often for a quorum that holds
# a strict majority of the run's groups; a few lighthouse ticks (torchft's is 100 ms).
START_RETRY_S = 0.5
# Gradients cross the groups in flat buckets of at most this size, one collective each:
# PyTorch DDP's default bucket_cap_mb (25 MiB, torch.nn.parallel.DistributedDataParallel).
BUCKET_BYTES = 25 * 2**20


class NoPeerToHealFromError(RuntimeError):
    """A replacement group found no live group: it must not train alone from scratch."""


class TooFewGroupsAtStartError(RuntimeError):
    """Starting groups never met a quorum of a strict majority of the run's groups."""


def majority(participants: int, groups: int) -> bool:
    """Whether `participants` of `groups` are a strict majority: two such sets always
    share a group, so two quorums that each hold one cannot both train the same step."""
    return participants * 2 > groups


def leave_on_sigterm() -> None:
    """scancel means this group is being replaced (its node failed): leave at once, so the
    peers' next collective fails now and the lighthouse drops the group after its heartbeat
    timeout. submitit's handler would ignore SIGTERM and leave the ranks running until
    Slurm's KillWait sends SIGKILL, while every peer waits on them."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: os._exit(128 + signal.SIGTERM))


def _cross_group_pg(ft: ReplicaGroupConfig) -> ProcessGroupWrapper:
    """The reconfigurable process group joining this rank to its peers in the other groups
    (the ranks with the same group rank); torchft builds a new one for every new quorum."""
    timeout = timedelta(seconds=ft.timeout_s)
    return (
        ProcessGroupNCCL(timeout=timeout)
        if torch.cuda.is_available()
        else ProcessGroupGloo(timeout=timeout)
    )


def drop_cross_group_links(pg: ProcessGroupWrapper) -> None:
    """After a failed step: close this rank's links to the other groups now, not at the next
    quorum. A ring collective only tells the dead group's two neighbours at once (their
    sockets reset); every other survivor waits in its receive until the collective timeout
    (10 s: the whole stall of a failure). Closing the links here resets theirs, and theirs
    the next ones', so every survivor learns within a fraction of a second and asks the
    lighthouse for the next quorum. gloo's abort() alone keeps the sockets open; they close
    when the last reference to the context goes (the collectives' handles went with
    _sum_buckets' frame), hence the collect. The next quorum has a new id (the lighthouse
    bumps it on a commit failure), so torchft configures a fresh group before the next
    collective."""
    pg.abort()
    gc.collect()


def _buckets(tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """`tensors` in order, cut into runs of one dtype and device of at most BUCKET_BYTES."""
    buckets: list[list[torch.Tensor]] = []
    size = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        last = buckets[-1][-1] if buckets else None
        same = last is not None and (last.dtype, last.device) == (t.dtype, t.device)
        if not same or size + nbytes > BUCKET_BYTES:
            buckets.append([])
            size = 0
        buckets[-1].append(t)
        size += nbytes
    return buckets


class ReplicaGroupSync(CrossGroupSync):
    """This rank's link to its peers in the other replica groups, through torchft."""

    def __init__(
        self, ft: ReplicaGroupConfig, run_id: int, store_addr: str, store_port: int
    ) -> None:
        """Every rank of the group, after its process group is up: `store_addr:store_port`
        is the group's TCPStore (where rank 0 publishes its manager server's address)."""
        self.ft = ft
        self.groups = ft.groups
        self._pg = _cross_group_pg(ft)
        self._manager = Manager(
            pg=self._pg,
            load_state_dict=None,
            state_dict=None,
            min_replica_size=ft.min_healthy_groups,
            use_async_quorum=False,  # heal before the forward pass, in the step that needs it
            timeout=timedelta(seconds=ft.timeout_s),
            quorum_timeout=timedelta(seconds=QUORUM_TIMEOUT_S),
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            store_addr=store_addr,
            store_port=store_port,
            lighthouse_addr=ft.lighthouse_addr,
            replica_id=f"run{run_id}_group{ft.group}",
            # Every group starts from the same state (the same seed's weights, the same
            # Hugging Face weights or the same disk checkpoint), so nothing is sent at step
            # 0. Sent, it broke the run: a group healed at step 0 from a peer's empty Adam
            # state trained step 2 to another loss than the single-group run (5.443 against
            # 5.412, tests/unit/worker/test_replica_group_layouts.py when both groups
            # started together); a heal from a peer that has stepped is exact.
            init_sync=False,
        )
        self._shares: list[int] = []
        self._start_step: int | None = None  # until this group's first step is agreed
        self._healed = False  # healed from a peer since the last SDC exchange

    def group_layout(self, layout: ParallelLayout) -> ParallelLayout:
        return group_layout(layout, self.groups)

    def attach(self, state: dict[str, Any], resumed_step: int | None) -> None:
        # Healing sends exactly what a checkpoint holds, from a live peer instead of the disk.
        self._manager.register_state_dict_fn(
            "train",
            lambda sd: [state[k].load_state_dict(v) for k, v in sd.items()],
            lambda: {k: v.state_dict() for k, v in state.items()},
        )
        if resumed_step is not None:  # the classic path: every group from the same disk step
            self._manager.load_state_dict({"step": resumed_step, "batches_committed": resumed_step})
        # A replacement heals into whatever step its peers are at; every other group starts
        # at this step together with the others (worker/fault_tolerance.py, next_step).
        self._start_step = None if self.ft.heal_from_peer else (resumed_step or 0)

    def next_step(self, trained: int) -> int:
        # sync (groups): the quorum of live groups for this step; a group that is behind (a
        # replacement) heals here, into the state attach() named, before its forward pass.
        before = self._manager.current_step()
        self._manager.start_quorum()
        self._await_majority_to_start()
        # Only a heal moves the step between two quorums (a commit moves it in should_commit)
        self._healed |= self._manager.current_step() != before
        step = self._manager.current_step() + 1
        participants = self._manager.num_participants()
        if self.ft.heal_from_peer and step == 1 and participants == 1:
            # A replacement alone in the quorum: its peers are gone (or finished), so there
            # is nothing to heal from; training from scratch would overwrite the run's
            # checkpoints. The service takes the classic path instead.
            raise NoPeerToHealFromError("no live replica group to heal from")
        me = self._manager.participating_rank() or 0
        # Participant r trains shares r, r + P, ...: all of them, whoever is alive.
        self._shares = [v for v in range(self.groups) if v % participants == me]
        return step

    def _await_majority_to_start(self) -> None:
        """Until a strict majority of the run's groups agrees on the starting step, ask for
        the quorum again instead of training.

        Why: groups start as separate Slurm jobs, seconds apart. torchft's lighthouse forms
        a quorum of whoever heartbeats, so the first group up trained step 1 alone (every
        share of the batch); the others, finding it busy past the join timeout, trained
        their own step 1 without it. Both sides then stood at step 1, so torchft saw no one
        to heal, and the same sums added in another order left the copies a few ulps
        apart for good: the SDC check found them differing at its first comparison
        (bench/recovery.py --compare, 4 groups of dp). Two strict majorities share a group,
        so only one timeline can start. A group that heals meanwhile (a majority started
        without it) has joined that timeline and goes on at once."""
        if self._start_step is None:
            return
        deadline = time.monotonic() + QUORUM_TIMEOUT_S
        while self._manager.current_step() == self._start_step and not majority(
            self._manager.num_participants(), self.groups
        ):
            if time.monotonic() > deadline:
                raise TooFewGroupsAtStartError(
                    f"only {self._manager.num_participants()} of {self.groups} replica groups "
                    f"met to start at step {self._start_step} in {QUORUM_TIMEOUT_S:.0f} s"
                )
            time.sleep(START_RETRY_S)
            self._manager.start_quorum()
        self._start_step = None

    def shares(self) -> list[int]:
        return self._shares

    def sum_gradients(
        self, grads: Sequence[torch.Tensor], loss_sum: torch.Tensor, num_losses: int
    ) -> tuple[torch.Tensor, int]:
        # sync (groups): a dead peer makes a reduction fail; the manager records it and
        # should_commit then says no (nothing raises here).
        local = [local_shard(g) for g in grads]
        loss = loss_sum.reshape(1).clone()
        self._sum_buckets([*local, loss])
        for g in local:
            g.div_(self.groups)  # the mean over every share's rows
        # Each share contributes the same number of losses on this rank's coordinate.
        per_share = num_losses // max(1, len(self._shares))
        return loss.reshape(()), per_share * self.groups

    def _sum_buckets(self, tensors: Sequence[torch.Tensor]) -> None:
        """Sum `tensors` over the groups in the quorum, in place, a bucket per collective.
        The collectives' handles live and die in this frame: a handle keeps the group's
        sockets open, and drop_cross_group_links needs them closed."""
        for bucket in _buckets(tensors):
            flat = torch.cat([t.reshape(-1) for t in bucket])
            self._manager.allreduce(flat, reduce_op=dist.ReduceOp.SUM).wait()
            offset = 0
            for t in bucket:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()

    def should_commit(self) -> bool:
        # sync (groups): every group votes; one failed collective anywhere and no group
        # applies this step: they all compute it again with the next quorum.
        ok = self._manager.should_commit()
        if not ok:
            drop_cross_group_links(self._pg)
        return ok

    def writes_checkpoints(self) -> bool:
        # The same answer on every rank of a group, as they share the quorum.
        return self._manager.participating_rank() == 0

    def gather_across_groups(self, value: torch.Tensor) -> GroupValues | None:
        participants = self._manager.num_participants()
        me = self._manager.participating_rank()
        # Every group of the run, or no verdict: a strict majority of those present is not
        # one of the run's groups when some are missing (3 present of 4: 2 against 1).
        # Every rank of the quorum sees the same count, so all of them skip alike.
        if participants < self.groups or me is None:
            return None
        slots = torch.zeros(2 * participants, dtype=torch.int64, device=value.device)
        slots[me], slots[participants + me] = value, int(self._healed)
        # sync (groups): one small collective, on the steps the SDC check compares
        self._manager.allreduce(slots, reduce_op=dist.ReduceOp.SUM).wait()
        self._healed = False
        if self._manager.errored() is not None:  # a group failed meanwhile: no verdict
            return None
        seen = [int(v) for v in slots.tolist()]
        return GroupValues(seen[:participants], me, [bool(h) for h in seen[participants:]])

    def close(self, failed: bool) -> None:
        if failed:  # the peers learn now, not at their collective timeout
            drop_cross_group_links(self._pg)
        self._manager.shutdown(wait=False)
