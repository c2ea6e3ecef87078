"""Who this process is in the job, from the environment alone: torchrun's variables, or a
Slurm task's (SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, the store on the allocation's
first node), or neither (a one-process world).

No torch here: the launcher of a user's own script (worker/entrypoint.py) reads its place
to hand it on as torchrun's variables and never trains itself, so it does not pay torch's
import (4 CPU-seconds a rank on the dev cluster's cores, per attempt). worker/distributed.py
builds the process group from what this module reads.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from worker.errors import DoNotRetryError

# Rendezvous ports live in [20000, 32000): above the dev cluster's slurmd ports
# (17001-17008) and below Linux's ephemeral range (32768-60999), so an outgoing connection
# can never already hold the port we want to listen on.
PORT_BASE, PORT_SPAN = 20000, 12000


@dataclass(frozen=True)
class LaunchEnv:
    """Who this process is in the world, and where the rendezvous store listens."""

    launcher: str  # "torchrun" | "slurm" | "single"
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    node: str  # Slurm node name (or hostname), for reports and logs


def port_from_job_id(job_id: int) -> int:
    """A rendezvous port unique among concurrently running jobs.

    Two runs can share their first node (on the dev cluster every node is 127.0.0.1), so a
    fixed port would collide. Job ids are unique and increase by one per submission, so
    two jobs only map to the same port when their ids are PORT_SPAN apart: by then the
    older one has long finished.
    """
    return PORT_BASE + job_id % PORT_SPAN


def first_hostname(nodelist: str) -> str:
    """First host of a Slurm hostlist: "gpu[003-004,009],cpu1" -> "gpu003" (pure)."""
    depth = 0
    for i, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            nodelist = nodelist[:i]
            break
    # Within each bracket the first item is the first host; zero padding is kept as written.
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split(r"[,-]", m.group(1))[0], nodelist.strip())


def parse_node_addr(scontrol_node_line: str) -> str:
    """NodeAddr from `scontrol show node NAME -o` output (pure)."""
    match = re.search(r"(?:^|\s)NodeAddr=(\S+)", scontrol_node_line)
    if not match:
        raise ValueError(f"no NodeAddr= in scontrol output: {scontrol_node_line[:200]!r}")
    return match.group(1)


def slurm_node_addr(node: str) -> str:
    """Ask Slurm how to reach `node`; node names need not resolve in DNS (dev cluster)."""
    result = subprocess.run(
        ["scontrol", "show", "node", node, "-o"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return parse_node_addr(result.stdout)


def cpu_threads(environ: Mapping[str, str] = os.environ) -> int:
    """How many threads a rank's CPU work may use: the cores Slurm gave its task
    (SLURM_CPUS_PER_TASK), one if it did not say, as torchrun sets OMP_NUM_THREADS=1 for
    several processes a node. Not every core of the machine: every rank of a node would
    spin that many OpenMP threads (on the dev cluster, two ranks at two threads each made a
    Lightning step three times slower than at one: 36 s against 12 s for 60 steps)."""
    return int(environ.get("SLURM_CPUS_PER_TASK", "1"))


def node_name(environ: Mapping[str, str] = os.environ) -> str:
    """This process's node, as Slurm names it (the host name outside Slurm)."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


def read_launch_env(environ: Mapping[str, str] = os.environ) -> LaunchEnv:
    """Work out the launcher and this process's place from the environment.

    RUNYARD_MASTER_ADDR / RUNYARD_MASTER_PORT, when set, override the Slurm-derived
    rendezvous: a batch script can resolve it once per job instead of every task asking
    slurmctld (thousands of `scontrol show node` calls at scale).
    """
    node = node_name(environ)
    if all(
        k in environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    ):
        return LaunchEnv(
            launcher="torchrun",
            rank=int(environ["RANK"]),
            world_size=int(environ["WORLD_SIZE"]),
            local_rank=int(environ["LOCAL_RANK"]),
            master_addr=environ["MASTER_ADDR"],
            master_port=int(environ["MASTER_PORT"]),
            node=node,
        )
    if "SLURM_PROCID" in environ and "SLURM_JOB_ID" in environ:
        rank = int(environ["SLURM_PROCID"])
        first = first_hostname(environ["SLURM_JOB_NODELIST"])
        # Rank 0 hosts the store, and clients dial the first node: they must coincide
        # (true for Slurm's default block distribution). Fail now rather than hang.
        if rank == 0 and "SLURMD_NODENAME" in environ and environ["SLURMD_NODENAME"] != first:
            raise DoNotRetryError(
                f"rank 0 runs on {environ['SLURMD_NODENAME']}, not on the allocation's first "
                f"node {first}: launch tasks with block distribution"
            )
        addr = environ.get("RUNYARD_MASTER_ADDR") or slurm_node_addr(first)
        port = int(
            environ.get("RUNYARD_MASTER_PORT") or port_from_job_id(int(environ["SLURM_JOB_ID"]))
        )
        return LaunchEnv(
            launcher="slurm",
            rank=rank,
            world_size=int(environ["SLURM_NTASKS"]),
            local_rank=int(environ.get("SLURM_LOCALID", "0")),
            master_addr=addr,
            master_port=port,
            node=node,
        )
    return LaunchEnv("single", 0, 1, 0, "127.0.0.1", 0, node)
