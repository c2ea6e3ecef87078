"""Final job states from Slurm accounting (`sacct`), for jobs slurmctld has forgotten.

slurmctld keeps an ended job for MinJobAge and loses it sooner if its state is lost; after
that only accounting knows how the job ended. Where a site has accounting, the reconciler
asks sacct for those jobs (one batched call); where it has none, sacct answers nothing and
the reconciler behaves as before. Only ended states are taken from accounting: a job sacct
calls live but squeue does not list is left for the next tick, never guessed.
"""

from __future__ import annotations

from collections.abc import Sequence

from service.slurm.commands import JobStatus, SlurmError, parse_exit_code, run_slurm
from service.slurm.target import SlurmTarget

FIELDS = "JobID,State,NodeList,ExitCode,Reason"


def parse_sacct(out: str, job_ids: Sequence[str]) -> dict[str, JobStatus]:
    """`sacct -n -X -P -o JobID,State,NodeList,ExitCode,Reason` lines for `job_ids`, ended
    ones only. A requeued job has several records; the last is its current one."""
    wanted, found = set(job_ids), dict[str, JobStatus]()
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5 or parts[0] not in wanted:
            continue
        job_id, state, nodes, exit_code, reason = parts
        status = JobStatus(
            job_id=job_id,
            state=state.split()[0] if state else "UNKNOWN",  # "CANCELLED by 0" -> CANCELLED
            node_list="" if nodes in ("None assigned", "(null)") else nodes,
            reason=reason if reason != "None" else "",
            exit_code=parse_exit_code(exit_code),
        )
        if status.is_live:
            found.pop(job_id, None)
        else:
            found[job_id] = status
    return found


def run_sacct(target: SlurmTarget, argv: list[str]) -> str:
    """sacct's output, or "" when it cannot answer: without accounting it prints an error
    and nothing else, and a sacct that is missing or hangs is no answer either."""
    try:
        return run_slurm(target, argv, check=False)
    except SlurmError:
        return ""


def ended_jobs(target: SlurmTarget, job_ids: Sequence[str]) -> dict[str, JobStatus]:
    """How the jobs among `job_ids` ended, from accounting; {} where there is none."""
    if not job_ids:
        return {}
    out = run_sacct(target, ["sacct", "-n", "-X", "-P", "-j", ",".join(job_ids), "-o", FIELDS])
    return parse_sacct(out, job_ids)
