"""An in-memory Slurm behind the SlurmClient seam: nodes, jobs, drains and reservations.

For unit tests of the reconciler's decisions (in milliseconds, against the real database)
and for simulations of a large cluster. It is deterministic: job ids count up from 1000,
nodes are scheduled in name order, and nothing happens unless a caller asks for it
(`schedule`, `finish`, `fail_node`, `forget`). It models what the decisions depend on:
- exclusive nodes: a running job owns its nodes; a drained, down or foreign-reserved node
  takes no new job, and a drained node keeps running the job it has;
- reservations (flags=maint,ignore_jobs): a job inside one runs only on its nodes, a job
  outside one never on them; sbatch refuses a reservation that does not exist;
- job arrays with `%max_parallel`; jobs remembered after they end until `forget`;
- the strings Slurm prints (`IDLE+DRAIN`, `DOWN*`, `gpu[001-004]`, exit codes).
`calls` counts every SlurmClient call, so a test can bound Slurm traffic per tick;
`break_call` makes one kind of call fail as a Slurm outage would, and
`refuse_reservation_delete` makes slurmctld refuse a reservation's delete as it does while
a job that ran in it is still ending. Jobs run as a user: `cancel` leaves alone a job that
runs as someone else than the user it is asked for with (scancel --user), and
`forge_submit_answer` makes the owner's program answer another job's id, as one the owner
tampered with could.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from service.slurm.commands import (
    DRAIN_PREFIX,
    RESERVATION_BUSY,
    JobStatus,
    SlurmError,
    SlurmNode,
    SlurmUnreachable,
    slurm_error,
)
from service.slurm.hostlist import compress_hostlist
from service.slurm.owner import RunOwner
from service.slurm.submit import ArrayRequest, AttemptRequest
from service.slurm.topology import Topology, TopologyKind

CANCELLED_EXIT = 128 + 15  # scancel sends SIGTERM: Slurm records ExitCode=0:15


# The unit tier's cluster (tests/unit/conftest.py sets RUNYARD_CLUSTER_NAME to it too).
DEFAULT_FAKE_CLUSTER = "default"


@dataclass
class FakeNode:
    name: str
    switch: str | None
    num_gpus: int
    down: bool = False
    drained: bool = False
    reason: str = ""
    job: str | None = None  # the job running on it: nodes are exclusive

    @property
    def state(self) -> str:
        """As `scontrol show node` prints it: a base state, then flags after '+'."""
        base = "DOWN*" if self.down else ("ALLOCATED" if self.job else "IDLE")
        return f"{base}+DRAIN" if self.drained else base


@dataclass
class FakeJob:
    job_id: str
    name: str
    num_nodes: int
    nodelist: tuple[str, ...]  # required nodes; empty: Slurm chooses
    reservation: str | None
    nice: int
    attempt_id: int
    user: str = ""  # the Unix user it runs as (squeue's %u)
    account: str = ""  # the Slurm account it is charged to (squeue's %a)
    worker_token: str = field(default="", repr=False)  # what its job folder's token file holds
    array_id: str | None = None  # for a task of a job array
    max_parallel: int = 0  # of its array; 0: no limit
    state: str = "PENDING"
    reason: str = "Priority"
    nodes: tuple[str, ...] = ()
    exit_code: int | None = None
    forgotten: bool = False
    # sbatch queued it but the submitting process died before submitit's last step (see
    # CliSlurmClient.finish_submission): started so, it fails, as a real one does after
    # waiting 60 s for its pickle.
    awaits_submission: bool = False

    @property
    def is_live(self) -> bool:
        return self.state in ("PENDING", "RUNNING")

    def status(self) -> JobStatus:
        return JobStatus(
            job_id=self.job_id,
            state=self.state,
            node_list=compress_hostlist(self.nodes),
            reason=self.reason,
            exit_code=self.exit_code,
            user=self.user,
            name=self.name,
        )


@dataclass
class FakeSlurm:
    """A SlurmClient in memory. Build one with `FakeSlurm.cluster(...)`."""

    nodes: dict[str, FakeNode]
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    reservation_nodes: dict[str, list[str]] = field(default_factory=dict)
    reservation_users: dict[str, list[str]] = field(default_factory=dict)  # besides ours
    stacks: dict[str, str] = field(default_factory=dict)  # job id -> what run_in_job prints
    calls: Counter[str] = field(default_factory=Counter)
    broken: dict[str, str] = field(default_factory=dict)  # call -> the error it raises
    # reservation -> how many more of its deletes slurmctld refuses (RESERVATION_BUSY)
    delete_refusals: Counter[str] = field(default_factory=Counter)
    # sbatch queues its job, then times out before its answer comes back
    submit_answer_lost: bool = False
    # sbatch queues its job, and the owner's program answers with this id instead
    forged_answer: str | None = None
    next_id: int = 1000
    # Set: the switches are topology/block's blocks of this many nodes (Slurm 24.05+).
    block_size: int | None = None
    # Slurm's ClusterName: what the reconciler driving this fake records on its rows.
    cluster_name: str = DEFAULT_FAKE_CLUSTER

    @classmethod
    def cluster(
        cls,
        *,
        num_switches: int,
        nodes_per_switch: int,
        num_gpus: int = 8,
        prefix: str = "gpu",
        cluster_name: str = DEFAULT_FAKE_CLUSTER,
    ) -> FakeSlurm:
        """Nodes gpu001, gpu002, ... filled switch by switch (leaf1, leaf2, ...), on the
        cluster `cluster_name` (two fakes may both have a gpu001, as two clusters may)."""
        width = max(3, len(str(num_switches * nodes_per_switch)))
        nodes = {}
        for i in range(num_switches * nodes_per_switch):
            name = f"{prefix}{i + 1:0{width}d}"
            nodes[name] = FakeNode(name, f"leaf{i // nodes_per_switch + 1}", num_gpus)
        return cls(nodes=nodes, cluster_name=cluster_name)

    # --- driving the fake (what the cluster and the workers do) -------------------------

    def break_call(self, call: str, error: str = "slurmctld not responding") -> None:
        """From now on `call` (a SlurmClient method name) raises SlurmError(error), as the
        CLI client does when slurmctld does not answer."""
        self.broken[call] = error

    def heal_call(self, call: str) -> None:
        self.broken.pop(call, None)
        if call == "submit":
            self.submit_answer_lost = False

    def refuse_reservation_delete(self, name: str, times: int = 1) -> None:
        """The next `times` deletes of reservation `name` are refused as slurmctld refuses
        them while a job that ran in it is still ending; later ones succeed."""
        self.delete_refusals[name] = times

    def forge_submit_answer(self, job_id: str | None) -> None:
        """From now on `submit` and `submit_array` queue their job as asked and answer
        `job_id` (None: the truth again): the owner's program prints the job id on its last
        line of stdout, and the owner may write to that process."""
        self.forged_answer = job_id

    def lose_submit_answer(self) -> None:
        """From now on `submit` queues its job and then raises SlurmUnreachable, as sbatch
        does when slurmctld answers after its timeout. heal_call("submit") ends it."""
        self.submit_answer_lost = True

    def schedule(self) -> list[str]:
        """Start every pending job that fits, in Slurm's order (nice, then submission); the
        ids started. One pass over the queue and the nodes, whatever their number."""
        reserved_by = {n: name for name, ns in self.reservation_nodes.items() for n in ns}
        # Free nodes by the reservation that holds them (None: none), in name order.
        free: dict[str | None, dict[str, None]] = {}
        for n in sorted(self.nodes):
            if self._takes_jobs(self.nodes[n]):
                free.setdefault(reserved_by.get(n), {})[n] = None
        running = Counter(j.array_id for j in self.jobs.values() if j.state == "RUNNING")
        started = []
        pending = [j for j in self.jobs.values() if j.state == "PENDING"]
        for job in sorted(pending, key=lambda j: (j.nice, int(j.job_id.partition("_")[0]))):
            if not any(free.values()):
                break
            if job.array_id and job.max_parallel and running[job.array_id] >= job.max_parallel:
                job.reason = "JobArrayTaskLimit"
                continue
            allowed = free.get(job.reservation, {})
            if job.nodelist:
                fits = all(n in allowed for n in job.nodelist)
                chosen = list(job.nodelist)
            else:
                fits = len(allowed) >= job.num_nodes
                chosen = list(allowed)[: job.num_nodes]
            if not fits:
                job.reason = "Resources"
                continue
            self.start(job.job_id, chosen)
            for n in chosen:
                del allowed[n]
            running[job.array_id] += 1
            started.append(job.job_id)
        for job_id in started:
            if self.jobs[job_id].awaits_submission:
                self.finish(job_id, exit_code=1)
        return started

    def cut_submission_short(self, job_ids: Iterable[str]) -> None:
        """The process that submitted these jobs died right after sbatch returned."""
        for job_id in job_ids:
            self.jobs[job_id].awaits_submission = True

    def run_foreign_job(self, name: str, nodes: Sequence[str], user: str = "") -> str:
        """Someone else's job, running on `nodes` now (their sbatch, not the reconciler's),
        as `user`."""
        job_id = self._new_id()
        self.jobs[job_id] = FakeJob(job_id, name, len(nodes), tuple(nodes), None, 0, 0, user)
        self.start(job_id, nodes)
        return job_id

    def scancel_by_hand(self, job_ids: Sequence[str]) -> None:
        """Someone allowed to (root, the job's owner) scancels these jobs, whoever's."""
        self._scancel(job_ids, user=None)

    def start(self, job_id: str, nodes: Sequence[str]) -> None:
        """Run a pending job on `nodes` (what the scheduler decided)."""
        job = self.jobs[job_id]
        job.state, job.reason, job.nodes = "RUNNING", "None", tuple(nodes)
        for n in nodes:
            self.nodes[n].job = job_id

    def finish(self, job_id: str, exit_code: int = 0) -> None:
        """The batch script exited: COMPLETED on 0, else FAILED."""
        self.end(job_id, "COMPLETED" if exit_code == 0 else "FAILED", exit_code)

    def end(self, job_id: str, state: str, exit_code: int | None) -> None:
        """The job left the queue in `state` (TIMEOUT, NODE_FAIL, ...); its nodes are free."""
        job = self.jobs[job_id]
        job.state, job.exit_code = state, exit_code
        job.reason = "None" if state == "COMPLETED" else state
        for n in job.nodes:
            if self.nodes[n].job == job_id:
                self.nodes[n].job = None

    def fail_node(self, name: str, reason: str = "Not responding") -> None:
        """The node dies: Slurm marks it DOWN* and its job ends NODE_FAIL."""
        node = self.nodes[name]
        node.down, node.reason = True, node.reason or reason
        if node.job is not None:
            self.end(node.job, "NODE_FAIL", 0)

    def forget(self, job_id: str) -> None:
        """MinJobAge passed: slurmctld no longer knows the job at all."""
        self.jobs[job_id].forgotten = True

    def jobs_named(self, name: str) -> list[FakeJob]:
        return [j for j in self.jobs.values() if j.name == name]

    # --- the SlurmClient protocol ---------------------------------------------------------

    def _call(self, name: str) -> None:
        self.calls[name] += 1
        if name in self.broken:
            raise slurm_error(f"{name}: {self.broken[name]}")

    def _node(self, name: str) -> FakeNode:
        if name not in self.nodes:
            raise SlurmError(f"Invalid node name specified: {name}")
        return self.nodes[name]

    def _takes_jobs(self, node: FakeNode) -> bool:
        return not (node.down or node.drained or node.job)

    def _known(self) -> Iterable[FakeJob]:
        return (j for j in self.jobs.values() if not j.forgotten)

    def show_nodes(self) -> list[SlurmNode]:
        self._call("show_nodes")
        return [
            SlurmNode(n.name, n.state, n.reason, n.name, n.num_gpus)
            for n in sorted(self.nodes.values(), key=lambda n: n.name)
        ]

    def node_switches(self) -> dict[str, str]:
        self._call("node_switches")
        return {n.name: n.switch for n in self.nodes.values() if n.switch}

    def topology(self) -> Topology:
        """The nodes' switches as leaves, or as blocks of `block_size` when it is set."""
        self._call("topology")
        group_of = {n.name: n.switch for n in self.nodes.values() if n.switch}
        kind = TopologyKind.BLOCK if self.block_size else TopologyKind.TREE
        return Topology(kind, group_of, self.block_size)

    def drain(self, node: str, reason: str) -> None:
        self._call("drain")
        target = self._node(node)
        target.drained = True
        target.reason = reason if reason.startswith(DRAIN_PREFIX) else f"{DRAIN_PREFIX} {reason}"

    def resume(self, node: str) -> None:
        self._call("resume")
        target = self._node(node)
        target.drained = target.down = False
        target.reason = ""

    def reservations(self) -> dict[str, list[str]]:
        self._call("reservations")
        return {name: list(nodes) for name, nodes in self.reservation_nodes.items()}

    def create_reservation(
        self, name: str, nodes: Sequence[str], users: Sequence[str] = ()
    ) -> None:
        self._call("create_reservation")
        for n in nodes:
            self._node(n)
        self.reservation_nodes[name] = sorted(nodes)
        self.reservation_users[name] = list(users)

    def update_reservation(self, name: str, nodes: Sequence[str]) -> None:
        self._call("update_reservation")
        if name not in self.reservation_nodes:
            raise SlurmError(f"Reservation {name} not found")
        for n in nodes:
            self._node(n)
        self.reservation_nodes[name] = sorted(nodes)

    def delete_reservation(self, name: str) -> None:
        self._call("delete_reservation")
        if name in self.reservation_nodes and self.delete_refusals[name] > 0:
            self.delete_refusals[name] -= 1
            raise SlurmError(f"delete_reservation reservation={name}: {RESERVATION_BUSY}")
        self.reservation_nodes.pop(name, None)  # one already gone counts as deleted

    def _check_request(self, nodelist: list[str], num_nodes: int, reservation: str | None) -> None:
        """What sbatch refuses outright."""
        for n in nodelist:
            self._node(n)
        if reservation is not None and reservation not in self.reservation_nodes:
            raise SlurmError(f"Requested reservation is invalid: {reservation}")
        held = set(self.reservation_nodes[reservation] if reservation else self.nodes)
        if len(nodelist) > num_nodes or num_nodes > len(held) or not set(nodelist) <= held:
            raise SlurmError("Requested node configuration is not available")

    def _new_id(self) -> str:
        self.next_id += 1
        return str(self.next_id - 1)

    def submit(self, req: AttemptRequest, worker_token: str) -> str:
        self._call("submit")
        nodelist = [n for n in req.nodelist.split(",") if n]
        self._check_request(nodelist, req.num_nodes, req.reservation)
        job_id = self._new_id()
        self.jobs[job_id] = FakeJob(
            job_id=job_id,
            name=req.job_name,
            num_nodes=req.num_nodes,
            nodelist=tuple(nodelist),
            reservation=req.reservation,
            nice=req.nice,
            attempt_id=req.attempt_id,
            user=req.owner.unix_user,
            account=req.owner.slurm_account,
            worker_token=worker_token,
        )
        if self.submit_answer_lost:
            raise SlurmUnreachable("submit: Socket timed out on send/recv operation")
        return self.forged_answer or job_id

    def submit_array(self, req: ArrayRequest, worker_tokens: Sequence[str]) -> str:
        self._call("submit_array")
        nodelist = [n for n in req.nodelist.split(",") if n]
        self._check_request(nodelist, req.num_nodes, req.reservation)
        array_id = self._new_id()
        for attempt_id, job_id in req.task_job_ids(array_id).items():
            self.jobs[job_id] = FakeJob(
                job_id=job_id,
                name=req.job_name,
                num_nodes=req.num_nodes,
                nodelist=tuple(nodelist),
                reservation=req.reservation,
                nice=req.nice,
                attempt_id=attempt_id,
                user=req.owner.unix_user,
                account=req.owner.slurm_account,
                array_id=array_id,
                max_parallel=req.max_parallel,
            )
        return self.forged_answer or array_id

    def queue(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        self._call("queue")
        found = (self.jobs.get(j) for j in job_ids)
        return {j.job_id: j.status() for j in found if j and j.is_live and not j.forgotten}

    def job_details(self, job_ids: Sequence[str]) -> dict[str, JobStatus]:
        self._call("job_details")
        found = (self.jobs.get(j) for j in job_ids)
        return {j.job_id: j.status() for j in found if j and not j.forgotten}

    def jobs_by_name(self, prefix: str) -> dict[str, str]:
        self._call("jobs_by_name")
        return {j.name: j.job_id for j in self._known() if j.name.startswith(prefix)}

    def array_job_by_name(self, name: str) -> str | None:
        self._call("array_job_by_name")
        ids = {j.array_id or j.job_id for j in self._known() if j.name == name}
        return min(ids, key=int) if ids else None

    def finish_submission(
        self, owner: RunOwner, job_folder: Path, job_ids: Mapping[int, str]
    ) -> None:
        self._call("finish_submission")
        for job_id in job_ids.values():
            if job_id in self.jobs:
                self.jobs[job_id].awaits_submission = False

    def cancel(self, jobs: Mapping[str, str]) -> None:
        self._call("cancel")
        by_user: dict[str, list[str]] = {}
        for job_id, user in jobs.items():
            by_user.setdefault(user, []).append(job_id)
        for user, job_ids in by_user.items():
            self._scancel(job_ids, user)

    def _scancel(self, job_ids: Sequence[str], user: str | None) -> None:
        """scancel [--user=<user>] -- <job_ids>: a job (or an array's tasks) that runs as
        another user than `user` is left alone, as scancel filters it out."""
        targets = set(job_ids)
        for job in list(self.jobs.values()):
            if (job.job_id in targets or job.array_id in targets) and job.is_live:
                if user is not None and job.user != user:
                    continue
                running = job.state == "RUNNING"
                self.end(job.job_id, "CANCELLED", CANCELLED_EXIT if running else 0)

    def run_in_job(
        self, owner: RunOwner, job_id: str, num_nodes: int, script: str, timeout_s: float
    ) -> str:
        self._call("run_in_job")
        job = self.jobs.get(job_id)
        if job is None or job.state != "RUNNING":
            raise SlurmError(f"srun --jobid={job_id}: job is not running")
        return self.stacks.get(job_id, "")
