"""squeue / scontrol / scancel / srun adapters: one batched call each, parsed into plain data.

The CLI half of the SlurmClient seam (service/slurm/client.py; cli.py wraps these for the
reconciler). The dev cluster has no accounting database, so nothing here uses sacct: live
jobs come from squeue, finished ones from `scontrol show job` (slurmctld keeps them for
MinJobAge). Hostlists are expanded in-process (hostlist.py), never by a subprocess.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from service.config import get_settings
from service.slurm.hostlist import expand_hostlist
from service.slurm.target import SlurmTarget
from service.slurm.topology import Topology, parse_topology

TIMEOUT_S = 20


class SlurmError(RuntimeError):
    """A Slurm command failed; the message carries its stderr."""


class SlurmUnreachable(SlurmError):
    """slurmctld did not answer, or not in time: the request may or may not have taken
    effect (an sbatch that timed out may have queued its job). Not a refusal: ask again,
    after finding out what happened (a job is looked up by its unique name)."""


# What Slurm's commands print when slurmctld cannot be reached or does not answer in time
# (slurm/src/common/slurm_errno.c: SLURM_COMMUNICATIONS_*, ESLURM_*_TIMEOUT and friends),
# and what the fake says for a call it was told to break.
NO_ANSWER = (
    "Unable to contact slurm controller",
    "Socket timed out on send/recv operation",
    "Zero Bytes were transmitted or received",
    "Slurm temporarily unable to accept job",
    "Communication connection failure",
    "slurmctld not responding",
)


def slurm_error(message: str) -> SlurmError:
    """The error for a Slurm command that failed with `message`: SlurmUnreachable when it
    says slurmctld did not answer, a SlurmError (a refusal) otherwise."""
    if any(text in message for text in NO_ANSWER):
        return SlurmUnreachable(message)
    return SlurmError(message)


def slurm_env() -> dict[str, str]:
    """The process's environment with the site's SLURM_CONF: what a command that names no
    cluster (sacctmgr, `scontrol --version`) runs with; a target adds its cluster's."""
    env = dict(os.environ)
    conf = get_settings().slurm_conf
    if conf is not None:
        env["SLURM_CONF"] = str(conf)
    return env


def site_target() -> SlurmTarget:
    """The Slurm the service's environment reaches, named by no cluster: for what is the
    same on every cluster of a site (sacctmgr asks the shared slurmdbd)."""
    return SlurmTarget("", get_settings().slurm_conf)


# What squeue and scontrol say when asked for jobs slurmctld has forgotten: an answer
# ("none of those"), not an outage.
UNKNOWN_JOB = "Invalid job id"


def _run(target: SlurmTarget, argv: list[str]) -> subprocess.CompletedProcess[str]:
    argv = target.argv(argv)
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, env=target.env(slurm_env()), timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmUnreachable(f"{shlex.join(argv)}: {exc}") from exc
    except OSError as exc:
        raise SlurmError(f"{shlex.join(argv)}: {exc}") from exc
    return subprocess.CompletedProcess(argv, out.returncode, target.answer(out.stdout), out.stderr)


def _failed(argv: list[str], out: subprocess.CompletedProcess[str]) -> SlurmError:
    return slurm_error(f"{shlex.join(argv)} exited {out.returncode}: {out.stderr.strip()}")


def run_slurm(target: SlurmTarget, argv: list[str], *, check: bool = True) -> str:
    """`argv` on `target`'s cluster; its stdout. Raises SlurmError when it fails (`check`)."""
    out = _run(target, argv)
    if check and out.returncode != 0:
        raise _failed(argv, out)
    return out.stdout


def query_jobs(target: SlurmTarget, argv: list[str]) -> str:
    """Run a job query that may name forgotten jobs. Slurm exits non-zero both for those
    and when slurmctld does not answer; only the first is an answer. Raising on the second
    matters: read as "no such jobs", an outage would fail every running attempt."""
    out = _run(target, argv)
    if out.returncode != 0 and UNKNOWN_JOB not in out.stderr:
        raise _failed(argv, out)
    return out.stdout


@dataclass(frozen=True)
class JobStatus:
    job_id: str
    state: str  # Slurm's JobState: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...
    node_list: str
    reason: str
    exit_code: int | None = None  # of the batch script, once it ended
    user: str = ""  # whom it runs as (scontrol's UserId): adoption checks it is the owner
    name: str = ""  # its JobName: a submission checks it is the attempt's (submission.py)

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_JOB_STATES


LIVE_JOB_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RESV_DEL_HOLD",
    "SPECIAL_EXIT",
}


def parse_key_values(line: str) -> dict[str, str]:
    """`scontrol show ... -o` prints one record per line as Key=Value pairs."""
    fields: dict[str, str] = {}
    for token in line.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    return fields


def parse_exit_code(text: str) -> int | None:
    """ExitCode=1:0 -> 1 (the second number is the signal)."""
    code, _, signal = text.partition(":")
    if not code.isdigit():
        return None
    return 128 + int(signal) if code == "0" and signal.isdigit() and int(signal) else int(code)


def squeue(target: SlurmTarget, job_ids: list[str]) -> dict[str, JobStatus]:
    """Live jobs among `job_ids`, in one call; SlurmError when slurmctld does not answer."""
    if not job_ids:
        return {}
    # -r: one line per array task (`123_4`), pending ones too, not one `123_[4-9%2]` line.
    argv = ["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%i|%T|%N|%r"]
    out = query_jobs(target, argv)
    jobs = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4:
            jobs[parts[0]] = JobStatus(parts[0], parts[1], parts[2], parts[3])
    return jobs


def jobs_by_name(target: SlurmTarget, prefix: str) -> dict[str, str]:
    """Jobs slurmctld knows whose name starts with `prefix`: name -> id (adopts orphans). Raises
    SlurmError when squeue fails: "cannot tell" must not read as "none queued"."""
    # -t all: a job that already ended (slurmctld keeps it for MinJobAge) was still ours.
    out = run_slurm(target, ["squeue", "-h", "-t", "all", "-o", "%j|%i"])
    found = {}
    for line in out.splitlines():
        name, _, job_id = line.strip().partition("|")
        if name.startswith(prefix):
            found[name] = job_id
    return found


def array_job_by_name(target: SlurmTarget, name: str) -> str | None:
    """The id of the job array named `name` slurmctld knows (adopts one sbatched before a crash).
    Raises SlurmError when squeue fails: "cannot tell" must not read as "not queued"."""
    out = run_slurm(target, ["squeue", "-h", "-r", "-t", "all", "-n", name, "-o", "%F"])
    ids = {line.strip() for line in out.splitlines() if line.strip()}
    return min(ids, key=int) if ids else None


def _job_status(job_id: str, fields: dict[str, str]) -> JobStatus:
    node_list = fields.get("NodeList", "")
    return JobStatus(
        job_id=job_id,
        state=fields.get("JobState", "UNKNOWN"),
        node_list="" if node_list == "(null)" else node_list,
        reason=fields.get("Reason", ""),
        exit_code=parse_exit_code(fields.get("ExitCode", "")),
        user=fields.get("UserId", "").partition("(")[0],  # alice(1001)
        name=fields.get("JobName", ""),
    )


def _job_ids_of(fields: dict[str, str]) -> list[str]:
    """The ids a record answers to: its JobId, and `<array>_<task>` for an array task."""
    ids = [fields["JobId"]] if "JobId" in fields else []
    task = fields.get("ArrayTaskId", "")
    if "ArrayJobId" in fields and task.isdigit():
        ids.append(f"{fields['ArrayJobId']}_{task}")
    return ids


def parse_jobs(out: str, job_ids: Sequence[str]) -> dict[str, JobStatus]:
    """The records of `scontrol show job -o` that answer to one of `job_ids`."""
    wanted = set(job_ids)
    found: dict[str, JobStatus] = {}
    for line in out.splitlines():
        fields = parse_key_values(line)
        for job_id in _job_ids_of(fields):
            if job_id in wanted:
                found[job_id] = _job_status(job_id, fields)
    return found


def show_jobs(target: SlurmTarget, job_ids: Sequence[str]) -> dict[str, JobStatus]:
    """The jobs among `job_ids` slurmctld still remembers (live or ended), in one call: one
    job is asked for by id, several by listing every job slurmctld remembers."""
    if not job_ids:
        return {}
    argv = ["scontrol", "show", "job", "-o"]
    if len(job_ids) == 1:
        argv.append(job_ids[0])
    out = query_jobs(target, argv)
    found = parse_jobs(out, job_ids)
    if len(job_ids) == 1 and not found and out.strip():
        # Asked by id, the one record is that job whatever id it lists first.
        found[job_ids[0]] = _job_status(job_ids[0], parse_key_values(out.strip()))
    return found


def scancel(target: SlurmTarget, user: str, job_ids: Sequence[str]) -> None:
    """One scancel for these jobs of `user`'s; ones that already ended are not an error.

    `--user` makes scancel leave alone any of them that runs as someone else (22.05 filters
    the jobs it loaded, later releases send the filter to slurmctld; seen on 22.05.8: a
    `--user=alice` scancel of bob's job printed nothing and left it queued). The service
    scancels with a Slurm administrator's rights, and a recorded job id came from a process
    the run's owner could tamper with: without the filter a forged id would cancel anyone's
    job."""
    if isinstance(job_ids, str):  # one id is a Sequence[str] too: never scancel its digits
        raise TypeError(f"scancel takes a list of job ids, not {job_ids!r}")
    if not user or user.startswith("-"):
        raise ValueError(f"scancel needs the Unix user the jobs run as, not {user!r}")
    # Never without ids: `scancel --user=alice` alone cancels every job of alice's.
    if job_ids:
        run_slurm(
            target, ["scancel", f"--user={user}", "--", *job_ids], check=False
        )  # ids, no options


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str
    reason: str
    addr: str
    num_gpus: int


def parse_gpus(gres: str) -> int:
    """Gres=gpu:8 or gpu:h100:8(S:0-1) -> 8."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def show_nodes(target: SlurmTarget) -> list[SlurmNode]:
    out = run_slurm(target, ["scontrol", "show", "node", "-o"])
    nodes = []
    for line in out.splitlines():
        if not line.strip():
            continue
        f = parse_key_values(line)
        reason = line.split("Reason=", 1)[1].strip() if "Reason=" in line else ""
        nodes.append(
            SlurmNode(
                name=f["NodeName"],
                state=f.get("State", ""),
                reason=reason,
                addr=f.get("NodeAddr", ""),
                num_gpus=parse_gpus(f.get("Gres", "")),
            )
        )
    return nodes


def show_topology(target: SlurmTarget) -> Topology:
    """`scontrol show topology`: leaf switches (tree) or blocks (block); text in every
    version (service/slurm/topology.py)."""
    return parse_topology(run_slurm(target, ["scontrol", "show", "topology"], check=False))


def node_switches(target: SlurmTarget) -> dict[str, str]:
    """Node name -> its leaf switch (or base block), from `scontrol show topology`."""
    return show_topology(target).group_of


DRAIN_PREFIX = "runyard:"  # only nodes whose drain reason carries it are ours to resume


def drain_node(target: SlurmTarget, name: str, reason: str) -> None:
    """Drain `name` so Slurm schedules nothing new on it; the reason shows in `sinfo -R`."""
    text = reason if reason.startswith(DRAIN_PREFIX) else f"{DRAIN_PREFIX} {reason}"
    run_slurm(
        target, ["scontrol", "update", f"nodename={name}", "state=drain", f"reason={text[:200]}"]
    )


def resume_node(target: SlurmTarget, name: str) -> None:
    run_slurm(target, ["scontrol", "update", f"nodename={name}", "state=resume"])


def show_reservations(target: SlurmTarget) -> dict[str, list[str]]:
    """Reservation name -> its nodes (expanded)."""
    out = run_slurm(target, ["scontrol", "show", "reservation", "-o"], check=False)
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        fields = parse_key_values(line)
        if "ReservationName" in fields:
            nodes = fields.get("Nodes", "")
            found[fields["ReservationName"]] = [] if nodes == "(null)" else expand_hostlist(nodes)
    return found


def create_reservation(
    target: SlurmTarget, name: str, nodes: Sequence[str], users: Sequence[str]
) -> None:
    """A reservation for `users` holding `nodes` from now on; one of that name that already
    exists (a snapshot older than it) is updated to `nodes` instead."""
    node_arg = f"nodes={','.join(sorted(nodes))}"
    # IGNORE_JOBS: a node may still finish a job of ours; MAINT: reservations may overlap
    # while a spare moves from the pool into a run.
    try:
        run_slurm(
            target,
            [
                "scontrol",
                "create",
                f"reservation={name}",
                node_arg,
                "starttime=now",
                "duration=infinite",
                f"users={','.join(dict.fromkeys(users))}",
                "flags=ignore_jobs,maint",
            ],
        )
    except SlurmError as exc:
        if "Duplicate reservation name" not in str(exc):
            raise
        update_reservation(target, name, nodes)


def update_reservation(target: SlurmTarget, name: str, nodes: Sequence[str]) -> None:
    run_slurm(
        target, ["scontrol", "update", f"reservation={name}", f"nodes={','.join(sorted(nodes))}"]
    )


# What `scontrol delete reservation` prints when slurmctld says no (slurm_errno.c). It
# answers ESLURM_RESERVATION_INVALID for a name it does not know (reservation.c: delete_resv,
# "Reservation %s not found for deletion" in its own log), ESLURM_RESERVATION_BUSY while a
# job that ran in it has not finished, which is the case just after a run's jobs ended.
RESERVATION_GONE = "Requested reservation is invalid"
RESERVATION_BUSY = "Requested reservation is in use"


def reservation_gone(message: str) -> bool:
    """Whether a refused delete says the reservation does not exist: deleted already (an
    earlier try whose answer was lost, an operator), which is all the delete wanted."""
    return RESERVATION_GONE in message


def delete_reservation(target: SlurmTarget, name: str) -> None:
    """Delete reservation `name`; one that does not exist counts as deleted. Raises
    SlurmError when slurmctld refuses (RESERVATION_BUSY) or does not answer: until it
    is gone its nodes are not free, and the caller must ask again rather than say so."""
    argv = ["scontrol", "delete", f"reservation={name}"]
    out = _run(target, argv)
    if out.returncode != 0 and not reservation_gone(out.stderr):
        raise _failed(argv, out)


def srun_in_job(
    target: SlurmTarget, job_id: str, num_nodes: int, script: str, timeout_s: float
) -> str:
    """`script` once per node of a running job, through an overlapping step (the job's own
    tasks keep their CPUs); stdout and stderr together."""
    argv = target.argv(
        [
            "srun",
            f"--jobid={job_id}",
            "--overlap",
            f"-N{num_nodes}",
            "--ntasks-per-node=1",
            "bash",
            "-c",
            script,
        ]
    )
    try:
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, env=target.env(slurm_env())
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"srun --jobid={job_id}: {exc}") from exc
    return out.stdout + out.stderr
