"""How often a run is interrupted, how often to checkpoint, what is left, how many spares.

A run on n GPUs is interrupted at n times the per-GPU rate; the checkpoint interval
balances the cost of writing checkpoints against the work lost at each interruption
(Young 1974; Daly 2006); the spare pool is sized so that, while failed nodes are being
repaired, the chance of needing more spares than the pool holds stays under a bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from contract import ModelShape

# The Llama 3 Herd of Models (Meta, 2024), section 3.3.4: 419 unexpected interruptions in
# a 54-day snapshot of pre-training on 16,384 H100 GPUs (78 % attributed to hardware).
LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
DEFAULT_FAILURES_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)

# What a checkpoint holds per parameter: FP32 master weights and Adam's two FP32 moments
# (the ZeRO paper's K = 12); BF16 weights are derived from the master copy on load.
CHECKPOINT_BYTES_PER_PARAM = 12
# Llama 3 paper, section 3.1 (Tectonic): 2 TB/s sustained storage throughput for 16K GPUs.
DEFAULT_STORAGE_BYTES_PER_S = 2e12
# DGX H100 user guide: two dual-port ConnectX-7 for storage and in-band traffic, up to
# 400 Gb/s per node; we count on half of it (25 GB/s) for checkpoint writes and reads.
DEFAULT_STORAGE_BYTES_PER_S_PER_NODE = 25e9
# What an asynchronous save costs training, as a share of its write time: the time it
# blocks training plus how much slower the steps beside it run (worker/checkpoint_cost.py).
# Measured on one H200 (issue 32, torch 2.11, the worker before that issue: 8 layers of
# hidden 2,048, 6.1 GB of state): written in 26.49 s, 0.136 s blocked and the steps beside
# it 5.3 s slower, (0.136 + 5.3) / 26.49 = 0.205. The worker's own saves now hide more of
# their write; bench/gpu_checks.sh measures how much (docs/design.md, "What a checkpoint
# costs training"), and each cluster's runs report their own (Checkpoint.stall_s). 1.0
# would be a synchronous save, which this model assumed before.
MEASURED_STALL_SHARE = 0.205


# The fast path's two costs. The failed group's time out, from the Xid line to its
# replacement's first step (agent, drain, scancel, sbatch onto the reserved spare, Python
# and torch start-up, model build, heal): 11.1 s measured by `bench/recovery.py --compare`
# on the dev cluster (4 groups of 1 node, tiny model, 2026-12-03 11:57 UTC); at scale the
# heal transfer is added by assess(). The survivors' stall: detection and drain (0.5 s,
# bench/recovery.py), the scancel that ends the failed group's ranks (they exit on
# SIGTERM), and the lighthouse's 2 s heartbeat timeout before the quorum drops the group,
# rounded up to 4 s; none of it grows with the run.
FAST_STALL_S = 4.0
FAST_REJOIN_S = 11.1
# The longest a replica-group run goes without a durable (disk) checkpoint: the design's
# "file system as the durable tier written every hour or so".
DURABLE_CHECKPOINT_MAX_S = 3600.0


@dataclass(frozen=True, slots=True)
class ReliabilityAssumptions:
    """Inputs an operator may override; defaults are the published or stated figures."""

    failures_per_gpu_hour: float = DEFAULT_FAILURES_PER_GPU_HOUR
    storage_bytes_per_s: float = DEFAULT_STORAGE_BYTES_PER_S
    storage_bytes_per_s_per_node: float = DEFAULT_STORAGE_BYTES_PER_S_PER_NODE
    # Per checkpoint whatever its size: DCP's save planning (an all-gather of plans), the
    # barrier before the commit marker, metadata and marker writes on a shared filesystem.
    checkpoint_fixed_s: float = 10.0
    # The share of a save's write time that it costs training (see MEASURED_STALL_SHARE);
    # a cluster's runs measure their own (Checkpoint.stall_s).
    checkpoint_stall_share: float = MEASURED_STALL_SHARE
    # Detect (heartbeat / NCCL watchdog), drain, swap in a spare, relaunch and re-form
    # NCCL groups: minutes at scale. An assumption to be replaced by measured restarts.
    restart_s: float = 600.0
    # The fast path (replica groups, docs/design.md "Fast recovery"): the groups a run is
    # split into for it (0: no fast path), how long the surviving groups stall before the
    # quorum drops the failed one, and how long the failed group's share of the GPUs is
    # out before its replacement trains again, besides copying the state from a peer.
    # Both measured on the dev cluster by `bench/recovery.py --compare` (see the design).
    replica_groups: int = 2
    fast_stall_s: float = FAST_STALL_S
    fast_rejoin_s: float = FAST_REJOIN_S
    # Time a failed node stays out of the pool before it is repaired or replaced.
    repair_window_h: float = 24.0
    spare_risk: float = 0.01  # allowed chance of running out of spares in a window


@dataclass(frozen=True, slots=True)
class Reliability:
    """The failure-side answer for one plan."""

    mtbi_s: float  # mean time between interruptions of the whole run
    checkpoint_bytes: float
    checkpoint_write_s: float
    checkpoint_interval_s: float  # compute time between checkpoints, whole steps
    checkpoint_interval_steps: int
    goodput: float  # expected productive share of allocated time (classic path)
    spare_nodes: int
    # The fast path with `replica_groups` groups (None: the layout cannot be split so).
    goodput_fast: float | None = None
    replica_groups: int = 0
    classic_lost_s: float = 0.0  # whole-run seconds lost per interruption, classic path
    fast_lost_s: float | None = None  # the same on the fast path
    # The fast path's checkpoint interval (None where `goodput_fast` is): disk checkpoints
    # serve only the failures it hands to the classic path, so Daly's interval for their
    # rate, capped at DURABLE_CHECKPOINT_MAX_S; whole steps, like the classic one.
    fast_checkpoint_interval_s: float | None = None
    fast_checkpoint_interval_steps: int | None = None
    # What each save costs training (the write's share that does not overlap training):
    # the cost Young/Daly trades against lost work.
    checkpoint_stall_s: float = 0.0

    def interval_s_for(self, fast_path: bool) -> float:
        """Training time between checkpoints of a run that recovers on the fast path (when
        the layout allows it) or on the classic one."""
        if fast_path and self.fast_checkpoint_interval_s is not None:
            return self.fast_checkpoint_interval_s
        return self.checkpoint_interval_s


def checkpoint_bytes(model: ModelShape) -> float:
    """Size of one full training checkpoint."""
    return model.num_params * CHECKPOINT_BYTES_PER_PARAM


def checkpoint_interval_s(write_s: float, mtbi_s: float) -> float:
    """Daly's (2006) higher-order optimum of the compute time between checkpoints.

    sqrt(2 d M) [1 + sqrt(d / 2M) / 3 + d / 18M] - d for checkpoint cost d < 2M, else M;
    its first term is Young's (1974) sqrt(2 d M).
    """
    if write_s <= 0:
        return 0.0
    if write_s >= 2 * mtbi_s:
        return mtbi_s
    ratio = write_s / (2 * mtbi_s)
    young = math.sqrt(2 * write_s * mtbi_s)
    return young * (1 + math.sqrt(ratio) / 3 + ratio / 9) - write_s


def expected_goodput(
    interval_s: float, write_s: float, restart_s: float, mtbi_s: float, latency_s: float = 0.0
) -> float:
    """Share of allocated time that trains the model, in steady state.

    Each cycle computes for `interval_s` and stalls for its save's `write_s` (the part of
    the write that costs training); each interruption costs the restart and, on average,
    half a cycle of work since the last checkpoint, plus `latency_s`: an asynchronous save
    is durable only when written, so work goes back that much further than its start.
    """
    cycle = interval_s + write_s
    if cycle <= 0:
        return 0.0
    lost_per_interruption = restart_s + cycle / 2 + latency_s
    return max(0.0, interval_s / cycle * (1 - lost_per_interruption / mtbi_s))


def fast_path_lost_s(
    groups: int,
    step_s: float,
    stall_s: float,
    rejoin_s: float,
    heal_s: float,
    classic_lost_s: float,
    mtbi_s: float,
) -> float:
    """Whole-run seconds lost per interruption on the fast path.

    Every GPU stalls for `stall_s` and redoes the step in flight; the failed group's share
    (1 / groups of the GPUs) is out until its replacement has started and healed. A second
    failure in another group before the replacement healed leaves no live copy for some
    state with two groups (recovery/paths.py): such interruptions, a share of about
    rejoin / MTBI of them, take the classic path.
    """
    out_s = rejoin_s + heal_s
    fast = stall_s + step_s + out_s / groups
    classic_share = min(1.0, out_s / mtbi_s) if groups == 2 else 0.0
    return (1 - classic_share) * fast + classic_share * classic_lost_s


def spares_needed(expected_failures: float, risk: float) -> int:
    """Smallest pool s with P(Poisson(expected_failures) > s) < risk."""
    term = cumulative = math.exp(-expected_failures)
    spares = 0
    while 1 - cumulative >= risk:
        spares += 1
        term *= expected_failures / spares
        cumulative += term
    return spares


def assess(
    model: ModelShape,
    num_gpus: int,
    gpus_per_node: int,
    step_s: float,
    assumptions: ReliabilityAssumptions | None = None,
) -> Reliability:
    """MTBI, checkpoint size and write time, the checkpoint interval and goodput on each
    recovery path (classic; fast, with `assumptions.replica_groups` groups, where the nodes
    split into them), and spare nodes for a planned run."""
    a = assumptions or ReliabilityAssumptions()
    num_nodes = max(1, -(-num_gpus // gpus_per_node))
    mtbi_s = 3600 / (a.failures_per_gpu_hour * num_gpus)
    size = checkpoint_bytes(model)
    storage = min(a.storage_bytes_per_s, num_nodes * a.storage_bytes_per_s_per_node)
    write_s = a.checkpoint_fixed_s + size / storage
    # Training pays only the save's stall; the rest of the write runs beside the steps
    # and only delays when the checkpoint is durable (`latency`). One save at a time: the
    # next starts no sooner than this one is written.
    stall_s = a.checkpoint_stall_share * write_s
    latency = write_s - stall_s
    ideal = max(checkpoint_interval_s(stall_s, mtbi_s), latency)
    steps = max(1, round(ideal / step_s), math.ceil(latency / step_s)) if step_s > 0 else 1
    interval = steps * step_s
    # Restarting also reads the checkpoint back, at the same storage rate.
    goodput = expected_goodput(interval, stall_s, a.restart_s + write_s, mtbi_s, latency)
    cycle = interval + stall_s
    classic_lost = a.restart_s + write_s + cycle / 2 + latency
    goodput_fast, fast_lost = None, None
    steps_fast: int | None = None
    interval_fast: float | None = None
    groups = a.replica_groups
    if groups >= 2 and num_nodes % groups == 0 and cycle > 0:
        # A replacement heals from a peer: each of its nodes receives the group's share of
        # the checkpoint over the network, at the rate assumed for storage per node.
        heal_s = size / (num_nodes // groups * a.storage_bytes_per_s_per_node)
        # Disk checkpoints now serve only the failures the fast path hands to the classic
        # one (rare): Daly's interval for their rate, capped so that a durable copy is
        # never older than DURABLE_CHECKPOINT_MAX_S (bugs, loss spikes, whole-site events).
        out_s = a.fast_rejoin_s + heal_s
        classic_share = min(1.0, out_s / mtbi_s) if groups == 2 else 0.0
        classic_mtbi_s = mtbi_s / classic_share if classic_share else math.inf
        ideal_fast = min(DURABLE_CHECKPOINT_MAX_S, checkpoint_interval_s(stall_s, classic_mtbi_s))
        # Never more often than the same run on the classic path: the cap bounds how old
        # the durable copy gets, and the classic interval is already trusted for that (a
        # small run's Daly interval is hours: an hourly cap would only add stalls).
        ideal_fast = max(ideal_fast, ideal)
        steps_fast = max(1, round(ideal_fast / step_s)) if step_s > 0 else steps
        interval_fast = steps_fast * step_s if step_s > 0 else interval
        cycle_fast = interval_fast + stall_s
        fast_lost = fast_path_lost_s(
            groups,
            step_s,
            a.fast_stall_s,
            a.fast_rejoin_s,
            heal_s,
            a.restart_s + write_s + cycle_fast / 2 + latency,
            mtbi_s,
        )
        goodput_fast = max(0.0, interval_fast / cycle_fast * (1 - fast_lost / mtbi_s))
    failures_per_node_hour = a.failures_per_gpu_hour * gpus_per_node
    expected = failures_per_node_hour * num_nodes * a.repair_window_h
    return Reliability(
        mtbi_s=mtbi_s,
        checkpoint_bytes=size,
        checkpoint_write_s=write_s,
        checkpoint_stall_s=stall_s,
        checkpoint_interval_s=interval,
        checkpoint_interval_steps=steps,
        goodput=goodput,
        spare_nodes=spares_needed(expected, a.spare_risk),
        goodput_fast=goodput_fast,
        replica_groups=groups if goodput_fast is not None else 0,
        classic_lost_s=classic_lost,
        fast_lost_s=fast_lost,
        fast_checkpoint_interval_s=interval_fast,
        fast_checkpoint_interval_steps=steps_fast,
    )
