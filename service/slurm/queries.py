"""The reconciler's read queries, in the form runyard takes on the Slurm at hand: JSON where
the release's `--json` is complete (24.05.1+: it honours the filters and carries every field
runyard reads) and runyard takes it, text elsewhere (22.05: scontrol has no --json, and
squeue's ignores -j and -r and prints raw wait statuses). Which is which comes from
contract/slurm_features.py for the version read once (version.py): today text everywhere,
since 24.11's JSON forms measured 1.4x to 10x slower (NOT_TAKEN there). Both forms answer
with the same plain data, and both are tested on each release's real output.

The text forms live in commands.py (and accounting.py for sacct), the JSON readers in
json_output.py; this module only chooses.
"""

from __future__ import annotations

from collections.abc import Sequence

from contract.slurm_features import SlurmFeature
from service.slurm import accounting, commands, json_output, version
from service.slurm.commands import JobStatus, SlurmNode, query_jobs, run_slurm, slurm_env
from service.slurm.target import SlurmTarget


def release() -> version.SlurmRelease:
    """The Slurm the service's environment reaches (read once)."""
    return version.current(slurm_env())


def _json(feature: SlurmFeature) -> bool:
    return release().has(feature)


def squeue(target: SlurmTarget, job_ids: list[str]) -> dict[str, JobStatus]:
    """Live jobs among `job_ids`, in one call; SlurmError when slurmctld does not answer."""
    take = job_ids and _json(SlurmFeature.SQUEUE_JSON)
    return squeue_json(target, job_ids) if take else commands.squeue(target, job_ids)


def squeue_json(target: SlurmTarget, job_ids: list[str]) -> dict[str, JobStatus]:
    out = query_jobs(target, ["squeue", "--json", "-r", "-j", ",".join(job_ids)])
    return json_output.parse_jobs(out, job_ids, "squeue --json") if out.strip() else {}


def jobs_by_name(target: SlurmTarget, prefix: str) -> dict[str, str]:
    """Name -> id of every job slurmctld knows whose name starts with `prefix`."""
    if _json(SlurmFeature.SQUEUE_JSON):
        return jobs_by_name_json(target, prefix)
    return commands.jobs_by_name(target, prefix)


def jobs_by_name_json(target: SlurmTarget, prefix: str) -> dict[str, str]:
    rows = json_output.parse_job_names(run_slurm(target, ["squeue", "--json", "-t", "all"]))
    return {name: job_id for name, job_id, _ in rows if name.startswith(prefix)}


def array_job_by_name(target: SlurmTarget, name: str) -> str | None:
    """The id of the job array named `name` slurmctld knows, or None."""
    if _json(SlurmFeature.SQUEUE_JSON):
        return array_job_by_name_json(target, name)
    return commands.array_job_by_name(target, name)


def array_job_by_name_json(target: SlurmTarget, name: str) -> str | None:
    out = run_slurm(target, ["squeue", "--json", "-r", "-t", "all", "-n", name])
    ids = {array_id for job, _, array_id in json_output.parse_job_names(out) if job == name}
    return min(ids, key=int) if ids else None


def show_jobs(target: SlurmTarget, job_ids: Sequence[str]) -> dict[str, JobStatus]:
    """The jobs among `job_ids` slurmctld still remembers (live or ended), in one call."""
    take = job_ids and _json(SlurmFeature.SCONTROL_JSON)
    return show_jobs_json(target, job_ids) if take else commands.show_jobs(target, job_ids)


def show_jobs_json(target: SlurmTarget, job_ids: Sequence[str]) -> dict[str, JobStatus]:
    argv = ["scontrol", "--json", "show", "job"]
    if len(job_ids) == 1:
        argv.append(job_ids[0])
    out = query_jobs(target, argv)
    return json_output.parse_jobs(out, job_ids, "scontrol --json show job") if out.strip() else {}


def show_nodes(target: SlurmTarget) -> list[SlurmNode]:
    return (
        show_nodes_json(target)
        if _json(SlurmFeature.SCONTROL_JSON)
        else commands.show_nodes(target)
    )


def show_nodes_json(target: SlurmTarget) -> list[SlurmNode]:
    return json_output.parse_nodes(run_slurm(target, ["scontrol", "--json", "show", "node"]))


def show_reservations(target: SlurmTarget) -> dict[str, list[str]]:
    """Reservation name -> its nodes (expanded)."""
    if _json(SlurmFeature.SCONTROL_JSON):
        return show_reservations_json(target)
    return commands.show_reservations(target)


def show_reservations_json(target: SlurmTarget) -> dict[str, list[str]]:
    out = run_slurm(target, ["scontrol", "--json", "show", "reservation"], check=False)
    return json_output.parse_reservations(out) if out.strip() else {}


def ended_jobs(target: SlurmTarget, job_ids: Sequence[str]) -> dict[str, JobStatus]:
    """How the jobs among `job_ids` ended, from accounting; {} where there is none."""
    take = job_ids and _json(SlurmFeature.SACCT_JSON)
    return ended_jobs_json(target, job_ids) if take else accounting.ended_jobs(target, job_ids)


def ended_jobs_json(target: SlurmTarget, job_ids: Sequence[str]) -> dict[str, JobStatus]:
    out = accounting.run_sacct(target, ["sacct", "--json", "-X", "-j", ",".join(job_ids)])
    return json_output.parse_sacct(out, job_ids) if out.strip() else {}
