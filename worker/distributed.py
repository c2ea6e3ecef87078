"""Process-group setup for the two ways a worker is launched: torchrun, or Slurm tasks.

Under torchrun the agent has already done the rendezvous and exported RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT. Under Slurm (srun, or a submitit task) every
task knows only its SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID; rank 0 hosts a TCPStore on
the first node of the allocation and the others connect to it. With neither, the worker is
a one-process world (a local debugging run) and still gets a process group, so the rest of
the code never branches on "distributed or not". Which of the three applies, and this
task's place, is read from the environment by worker/launch.py (no torch there).
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from worker.launch import LaunchEnv, cpu_threads

RENDEZVOUS_TIMEOUT_S = 120.0  # how long rank 0 waits for every task to reach the store
# Collectives (a checkpoint barrier, a slow rank) get longer: NCCL's own default is 10 min.
COLLECTIVE_TIMEOUT_S = 600.0


def pick_device(local_rank: int) -> torch.device:
    """cuda:<local rank> when GPUs are visible (modulo: Slurm may expose one GPU per task)."""
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    # On CPU under Slurm, use the cores Slurm gave this task (launch.cpu_threads), not
    # every core of the machine: the dev cluster runs several slurmd "nodes" on one box, and
    # oversubscribed OpenMP threads spin (a 4x slower step was seen on two cores).
    if "SLURM_JOB_ID" in os.environ:
        torch.set_num_threads(cpu_threads())
    return torch.device("cpu")


def init_distributed(
    env: LaunchEnv, device: torch.device, rendezvous_timeout_s: float = RENDEZVOUS_TIMEOUT_S
) -> None:
    """Create the default process group: NCCL for GPU tensors, gloo for CPU ones."""
    # "cuda:nccl,cpu:gloo" keeps CPU collectives (checkpoint metadata, objects) off NCCL.
    backend = "cuda:nccl,cpu:gloo" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    if env.launcher == "torchrun":
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
        return
    if env.launcher == "single":
        store: dist.Store = dist.HashStore()
    else:
        # Rank 0 listens; with wait_for_workers it returns only once every task connected,
        # and clients retry their connection, both for at most the rendezvous timeout.
        store = dist.TCPStore(
            env.master_addr,
            env.master_port,
            env.world_size,
            is_master=env.rank == 0,
            timeout=timedelta(seconds=rendezvous_timeout_s),
            wait_for_workers=True,
        )
    dist.init_process_group(
        backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout
    )


def shutdown_distributed() -> None:
    """Tear down the process group so the next attempt in this process starts clean."""
    if dist.is_initialized():
        dist.destroy_process_group()
