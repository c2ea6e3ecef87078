"""The real SlurmClient: Slurm's command-line tools (commands.py; the read queries in the
form the Slurm version reads best, queries.py) and submitit (submit.py).

One process per call, each call batched: a tick's squeue, `scontrol show job` and scancel
cover every watched job at once, and hostlists are expanded in-process.
"""

from __future__ import annotations

import getpass
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from service.config import Settings
from service.config_areas.clusters import ClusterConfig, TopologySource
from service.slurm import commands, queries
from service.slurm.commands import JobStatus, SlurmNode
from service.slurm.owner import RunOwner
from service.slurm.submit import ArrayRequest, AttemptRequest
from service.slurm.target import SlurmTarget
from service.slurm.topology import Topology, TopologyKind


class ActsAsOwner(Protocol):
    """What Slurm lets only a job's owner do, done as them: service/identity/gate.py's
    OwnerGate, handed in by whoever builds the client (the seam never imports identity,
    which decides who an owner is and builds on the seam's submit requests)."""

    def submit(self, req: AttemptRequest, worker_token: str) -> str: ...

    def submit_array(self, req: ArrayRequest, worker_tokens: Sequence[str]) -> str: ...

    def finish_submission(
        self, owner: RunOwner, job_folder: Path, job_ids: Mapping[int, str]
    ) -> None: ...

    def srun_in_job(
        self, owner: RunOwner, job_id: str, num_nodes: int, script: str, timeout_s: float
    ) -> str: ...


class CliSlurmClient:
    """SlurmClient over squeue, scontrol, scancel, srun and sbatch (through submitit). What
    Slurm lets an operator do (drain, reservations, scancel, queries) the service does as
    itself; a job's submission and steps inside a job, as the job's owner (`owner_gate`)."""

    def __init__(self, settings: Settings, owner_gate: ActsAsOwner, cluster: ClusterConfig) -> None:
        """The client of `cluster`: every command goes to it (service/slurm/target.py), and
        `owner_gate` must act on the same cluster."""
        self.settings = settings
        self.owner_gate = owner_gate
        self.config = cluster
        self.cluster_name = cluster.name
        self.target = SlurmTarget.of(cluster, settings.slurm_conf)
        # Reservations are made for the service's own user, and a run's for its owner too.
        self.user = getpass.getuser()

    def show_nodes(self) -> list[SlurmNode]:
        return queries.show_nodes(self.target)

    def node_switches(self) -> dict[str, str]:
        return self.topology().group_of

    def topology(self) -> Topology:
        if self.config.topology is TopologySource.FLAT:
            return Topology(TopologyKind.FLAT)
        return commands.show_topology(self.target)

    def drain(self, node: str, reason: str) -> None:
        commands.drain_node(self.target, node, reason)

    def resume(self, node: str) -> None:
        commands.resume_node(self.target, node)

    def reservations(self) -> dict[str, list[str]]:
        return queries.show_reservations(self.target)

    def create_reservation(
        self, name: str, nodes: Sequence[str], users: Sequence[str] = ()
    ) -> None:
        commands.create_reservation(self.target, name, nodes, [self.user, *users])

    def update_reservation(self, name: str, nodes: Sequence[str]) -> None:
        commands.update_reservation(self.target, name, nodes)

    def delete_reservation(self, name: str) -> None:
        commands.delete_reservation(self.target, name)

    def submit(self, req: AttemptRequest, worker_token: str) -> str:
        return self.owner_gate.submit(req, worker_token)

    def submit_array(self, req: ArrayRequest, worker_tokens: Sequence[str]) -> str:
        return self.owner_gate.submit_array(req, worker_tokens)

    def queue(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        return queries.squeue(self.target, list(job_ids))

    def job_details(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        found = queries.show_jobs(self.target, job_ids)
        forgotten = [job for job in job_ids if job not in found]
        # Jobs slurmctld no longer remembers: how they ended is in accounting, if any.
        return found | queries.ended_jobs(self.target, forgotten) if forgotten else found

    def jobs_by_name(self, prefix: str) -> dict[str, str]:
        return queries.jobs_by_name(self.target, prefix)

    def array_job_by_name(self, name: str) -> str | None:
        return queries.array_job_by_name(self.target, name)

    def finish_submission(
        self, owner: RunOwner, job_folder: Path, job_ids: Mapping[int, str]
    ) -> None:
        self.owner_gate.finish_submission(owner, job_folder, job_ids)

    def cancel(self, jobs: Mapping[str, str]) -> None:
        by_user: dict[str, list[str]] = {}
        for job_id, user in jobs.items():
            # A run accepted before runs had owners was submitted as the service itself.
            by_user.setdefault(user or self.user, []).append(job_id)
        for user, job_ids in by_user.items():
            commands.scancel(self.target, user, job_ids)

    def run_in_job(
        self, owner: RunOwner, job_id: str, num_nodes: int, script: str, timeout_s: float
    ) -> str:
        return self.owner_gate.srun_in_job(owner, job_id, num_nodes, script, timeout_s)
