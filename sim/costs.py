"""What each recovery phase costs: a stated model, every input with its source.

Measured on this machine (bench/recovery.py on the dev cluster: a real agent reading a real
Xid 79, the real service, real Slurm) where the phase does not depend on the cluster's size:
detection of an agent's report plus the drain, ending the attempt plus the sbatch, and
Slurm starting the job. Published where it does (process start and NCCL initialisation at
10,240 ranks, the checkpoint read at 2 TB/s). Where neither exists the figure is an
assumption and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract import ModelShape
from planner import reliability
from service.clusters import failover
from service.config import Settings
from service.recovery import hangs
from sim import policy
from sim.failures import Report

# bench/recovery.py, median of 3 rounds on this machine's dev cluster (8 nodes, CPU), run
# at 11:24 UTC on 2026-12-03 (docs/design.md, "Failure at 10,240 GPUs"):
# Xid written to the kernel log -> node drained in Slurm (agent poll, POST, incident, tick).
MEASURED_DETECT_AND_DRAIN_S = 0.5
# drained -> next attempt submitted (end the attempt, move the spare, sbatch).
MEASURED_RESUBMIT_S = 0.6
# submitted -> RUNNING in Slurm (the scheduler's pass and the job's launch).
MEASURED_QUEUE_START_S = 0.8
# Its fourth phase, RUNNING -> first step (19.8 s: Python and torch imports, gloo on CPU, a
# tiny model's load on a busy 2-core machine), says nothing of 10,240 ranks: published below.

# MegaScale (Jiang et al., NSDI 2024), section 3.5 "Fast initialization": job start-up with
# communication-group set-up took 5 s at 2,048 GPUs and under 30 s beyond 10,000 GPUs after
# their fixes (1,047 s at 2,048 GPUs before). We take the fixed figures: PyTorch's
# TCPStore-based NCCL init at 10k ranks is far slower without them.
START_AND_INIT_10K_S = 30.0
START_AND_INIT_2K_S = 5.0

# NCCL's InfiniBand transport timeout: NCCL_IB_TIMEOUT=20 (4.096 us x 2^20 = 4.3 s) times
# NCCL_IB_RETRY_CNT=7 (NCCL's defaults, NCCL environment variables documentation): how long
# a peer's collective takes to fail when the other side vanished without closing.
NCCL_TRANSPORT_TIMEOUT_S = 4.3 * 7

# Healing a replica group from a live peer: DGX H100 has one 400 Gb/s ConnectX-7 per GPU
# (DGX H100 user guide), 50 GB/s; every GPU of the group receives its share of the state.
PEER_BYTES_PER_S_PER_GPU = 50e9

# An asynchronous checkpoint blocks training for the copy of the GPU's shard to host memory
# (PCIe Gen5 x16: 64 GB/s, half of it counted) plus DCP's save planning, a collective over
# every rank, taken as 1 s at 10,240 ranks (an assumption).
HOST_COPY_BYTES_PER_S = 32e9
ASYNC_SAVE_PLANNING_S = 1.0

# A checkpoint copied between two clusters that mount no common filesystem crosses a data
# centre interconnect: one 400 Gb/s coherent wavelength (OIF's 400ZR implementation
# agreement, links up to 120 km), 50 GB/s, slower than either cluster's storage.
DCI_BYTES_PER_S = 50e9


@dataclass(frozen=True)
class PhaseCosts:
    """Seconds per phase for one run; built once per simulation by `phase_costs`."""

    detect_s: dict[Report, float]  # failure -> the service acts
    drain_s: float  # the drain itself, beyond detection (already inside the measured figure)
    resubmit_s: float  # end the attempt, take the spare, sbatch
    queue_start_s: float  # Slurm starts the job
    start_and_init_s: float  # processes start and NCCL forms its communicators (whole run)
    group_start_and_init_s: float  # the same for one replica group (fast path)
    checkpoint_read_s: float  # restore from the last committed disk checkpoint
    heal_s: float  # a resubmitted replica group receives the state from a live peer
    survivor_stall_s: dict[Report, float]  # the other groups, until the quorum drops one
    checkpoint_stall_s: float  # training blocked per asynchronous checkpoint
    checkpoint_copy_s: float  # to another cluster that does not mount the checkpoint

    @property
    def classic_restart_s(self) -> float:
        """From the decision to restart to the first step again, classic path."""
        return (
            self.drain_s
            + self.resubmit_s
            + self.queue_start_s
            + self.start_and_init_s
            + self.checkpoint_read_s
        )

    @property
    def group_restart_s(self) -> float:
        """From the decision to the failed group stepping again, fast path."""
        return (
            self.drain_s
            + self.resubmit_s
            + self.queue_start_s
            + self.group_start_and_init_s
            + self.heal_s
        )


def phase_costs(
    model: ModelShape,
    *,
    num_gpus: int,
    group_gpus: int,
    step_s: float,
    settings: Settings,
    assumptions: reliability.ReliabilityAssumptions,
) -> PhaseCosts:
    """The cost model for one run; detection comes from the service's own thresholds."""
    tick_s = settings.reconcile_interval_s
    # The heartbeat check: the service's own verdict decides (sim.policy.heartbeat_detect_s);
    # the hang check: the service's own threshold over the run's step times.
    detect = {
        Report.AGENT_XID: MEASURED_DETECT_AND_DRAIN_S,
        Report.RANK_NCCL: NCCL_TRANSPORT_TIMEOUT_S + tick_s,
        Report.HEARTBEAT: policy.heartbeat_detect_s(settings),
        Report.HANG: hangs.hang_threshold_s([step_s], settings) + tick_s,
    }
    size = reliability.checkpoint_bytes(model)
    storage = min(
        assumptions.storage_bytes_per_s,
        num_gpus / 8 * assumptions.storage_bytes_per_s_per_node,
    )
    return PhaseCosts(
        detect_s=detect,
        drain_s=0.0,
        resubmit_s=MEASURED_RESUBMIT_S,
        queue_start_s=MEASURED_QUEUE_START_S,
        start_and_init_s=START_AND_INIT_10K_S if num_gpus > 2048 else START_AND_INIT_2K_S,
        group_start_and_init_s=START_AND_INIT_2K_S,
        # DCP's load plans like its save: the planner's write time, fixed part included.
        checkpoint_read_s=assumptions.checkpoint_fixed_s + size / storage,
        heal_s=size / group_gpus / PEER_BYTES_PER_S_PER_GPU,
        survivor_stall_s={
            r: (d if r == Report.HANG else min(d, NCCL_TRANSPORT_TIMEOUT_S))
            for r, d in detect.items()
        },
        checkpoint_stall_s=size / num_gpus / HOST_COPY_BYTES_PER_S + ASYNC_SAVE_PLANNING_S,
        checkpoint_copy_s=failover.checkpoint_copy_s(
            size, min(DCI_BYTES_PER_S, storage), mounts_checkpoint=False
        ),
    )
