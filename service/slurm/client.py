"""The seam between runyard's decisions and Slurm: everything the reconciler asks of Slurm.

The reconcile loop owns one `SlurmClient` and hands it to every step; nothing in
service/reconcile or service/recovery starts a Slurm process itself. Two implementations:
- `service.slurm.cli.CliSlurmClient`: the real one, one batched CLI call per kind;
- `service.slurm.fake.FakeSlurm`: in memory (nodes, jobs, drains, reservations), for unit
  tests of the decisions and for simulations of a large cluster.

Node lists come back as Slurm prints them (`gpu[001-004]`); expand them in-process with
`service.slurm.hostlist.expand_hostlist`, never with `scontrol show hostnames`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from service.slurm.commands import JobStatus, SlurmError, SlurmNode, SlurmUnreachable
from service.slurm.owner import RunOwner
from service.slurm.submit import ArrayRequest, AttemptRequest
from service.slurm.topology import Topology

__all__ = ["JobStatus", "SlurmClient", "SlurmError", "SlurmNode", "SlurmUnreachable"]


class SlurmClient(Protocol):
    """What the reconciler may ask of Slurm. Methods raise SlurmError when Slurm answers
    with an error or not at all, unless their docstring says otherwise. Never call one while
    a database transaction is open. One client drives one cluster: every call goes to it."""

    # Slurm's ClusterName of the cluster this client drives (what rows record as `cluster`).
    cluster_name: str

    # The cluster: nodes and the network topology.
    def show_nodes(self) -> list[SlurmNode]:
        """Every node Slurm knows, with its state (`IDLE`, `ALLOCATED+DRAIN`, `DOWN*`, ...)."""
        ...

    def node_switches(self) -> dict[str, str]:
        """Node name -> its leaf switch (topology.conf); empty when there is no topology."""
        ...

    def topology(self) -> Topology:
        """The topology's kind (tree, block or flat), node name -> its leaf switch or base
        block, and the base block's size (topology/block)."""
        ...

    def drain(self, node: str, reason: str) -> None:
        """Schedule nothing new on `node`; its jobs keep running. The reason gets the
        `runyard:` prefix that marks a drain as ours to resume."""
        ...

    def resume(self, node: str) -> None:
        """Give a drained (or down) node back to the scheduler."""
        ...

    # Reservations: the spare pool and each run's nodes between attempts.
    def reservations(self) -> dict[str, list[str]]:
        """Reservation name -> its nodes, expanded."""
        ...

    def create_reservation(
        self, name: str, nodes: Sequence[str], users: Sequence[str] = ()
    ) -> None:
        """Hold `nodes` from now on, for our user and `users` only (a run's owner, whose jobs
        run inside it); overlapping reservations allowed. If one of that name exists already
        (the snapshot was stale), it is set to `nodes`."""
        ...

    def update_reservation(self, name: str, nodes: Sequence[str]) -> None:
        """Make the reservation hold exactly `nodes`."""
        ...

    def delete_reservation(self, name: str) -> None:
        """Delete it; deleting one that does not exist is not an error."""
        ...

    # Jobs.
    def submit(self, req: AttemptRequest, worker_token: str) -> str:
        """sbatch one attempt as its owner (`req.owner`), its worker token in its job folder;
        its job id."""
        ...

    def submit_array(self, req: ArrayRequest, worker_tokens: Sequence[str]) -> str:
        """sbatch a sweep's job array as its owner, task i with worker_tokens[i]; the array's
        job id (task i is `<id>_<i>`, or the id itself for an array of one, see
        ArrayRequest.task_job_id)."""
        ...

    def queue(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """The live jobs among `job_ids`, in one call. A job missing from the answer left
        the queue, or squeue failed: the CLI answers {} then rather than raising, so the
        verdict rests on job_details."""
        ...

    def job_details(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        """The jobs among `job_ids` slurmctld still remembers (live or ended, with exit
        codes), in one call. A job missing from the answer was forgotten (MinJobAge)."""
        ...

    def jobs_by_name(self, prefix: str) -> dict[str, str]:
        """Name -> id of every job (live or recently ended) whose name starts with `prefix`:
        how a service that crashed mid-submit finds what it already queued."""
        ...

    def array_job_by_name(self, name: str) -> str | None:
        """The id of the job array named `name`, live or recently ended, or None."""
        ...

    def finish_submission(
        self, owner: RunOwner, job_folder: Path, job_ids: Mapping[int, str]
    ) -> None:
        """Complete the submission of jobs found queued by name after a crash (`job_ids`:
        attempt id -> job or array task id), so that they can start: whatever the crashed
        submit call had left to do once sbatch had queued them."""
        ...

    def cancel(self, jobs: Mapping[str, str]) -> None:
        """scancel these jobs, each given as job id -> the Unix user of the run it was
        recorded for: one call per user, and Slurm cancels only those that run as that user
        (scancel --user). A job id names whatever job it names: one that turns out to be
        someone else's is left alone, however it got into Postgres. Ones that already ended
        are ignored. The one way the service cancels a job."""
        ...

    def run_in_job(
        self, owner: RunOwner, job_id: str, num_nodes: int, script: str, timeout_s: float
    ) -> str:
        """Run `script` (bash) once on each of the job's nodes, beside its tasks (srun
        --overlap), as the job's owner; stdout and stderr together. Raises SlurmError when
        it cannot run."""
        ...
