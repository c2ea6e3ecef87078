"""Slurm's JSON output (`--json`, the data_parser plugins of 24.05+), read into the same
plain data as the text parsers in commands.py and accounting.py.

Where the text forms print one word, the JSON forms print lists of flags (a job's
`job_state: ["RUNNING", "COMPLETING"]`, a node's `state: ["IDLE", "DRAIN"]`) and numbers
that may be unset (`{"set": false, "infinite": false, "number": 0}`). The readers fold them
into the strings the text forms print, so the rest of runyard reads one vocabulary: a job's
state as squeue's %T prints it, a node's as `IDLE+DRAIN`, an exit code as a shell reports it.
Fields are read with defaults: a field one version lacks reads as absent, never as an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from service.slurm.commands import JobStatus, SlurmError, SlurmNode, parse_gpus
from service.slurm.hostlist import expand_hostlist

# The flags that name a job's state in place of its base state when set, in the order
# Slurm's own text does (job_state_string, src/common/slurm_protocol_defs.c, 24.11.5).
STATE_FLAGS_FIRST = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)


def load(text: str, what: str) -> dict[str, Any]:
    """The command's JSON document; a SlurmError naming the command if it is not one."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmError(f"{what}: not JSON ({exc}): {text[:200]!r}") from exc
    if not isinstance(doc, dict):
        raise SlurmError(f"{what}: expected a JSON object, got {type(doc).__name__}")
    return doc


def number(value: Any) -> int | None:
    """An integer Slurm may leave unset: 7, or {"set": true, "number": 7}; None if unset
    or infinite."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, dict) and value.get("set") and not value.get("infinite"):
        found = value.get("number")
        return found if isinstance(found, int) else None
    return None


def flags(value: Any) -> list[str]:
    """A flag list (24.05+) or a single word (older formats), as a list of words."""
    if isinstance(value, list):
        return [str(v) for v in value]
    return [str(value)] if value else []


def job_state_text(state: Any) -> str:
    """`["PENDING", "REQUEUED"]` -> "REQUEUED": the word squeue's %T prints."""
    words = flags(state)
    for flag in STATE_FLAGS_FIRST:
        if flag in words:
            return flag
    return words[0] if words else "UNKNOWN"


def exit_code(value: Any) -> int | None:
    """{"status": [...], "return_code": {...}, "signal": {"id": {...}}} -> a shell's exit
    status (128 + signal for a killed job, as commands.parse_exit_code reads "0:9")."""
    if not isinstance(value, dict):
        return number(value)
    if "INVALID" in flags(value.get("status")):
        return None
    code = number(value.get("return_code"))
    signal = value.get("signal")
    signal_id = number(signal.get("id")) if isinstance(signal, dict) else None
    if not code and signal_id:
        return 128 + signal_id
    return code


def array_tasks(text: str) -> list[int]:
    """An array's pending task ids as Slurm prints them, "1-2", "0,4-8:2" or "1-9%2" (the
    part after % is the running limit), expanded."""
    tasks: list[int] = []
    for part in text.split("%")[0].split(","):
        span, _, step = part.partition(":")
        first, _, last = span.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            tasks += range(int(first), int(last or first) + 1, int(step) if step.isdigit() else 1)
    return tasks


def job_ids_of(job: dict[str, Any]) -> list[str]:
    """The ids a job record answers to: its own, and `<array>_<task>` for an array task
    (squeue's %i prints the second). An array's pending tasks share one record (24.11's
    squeue --json ignores -r), which answers for each of them, as squeue -r's lines do."""
    own = str(job.get("job_id", ""))
    array_id, task = number(job.get("array_job_id")), number(job.get("array_task_id"))
    if array_id and task is not None:
        return [f"{array_id}_{task}", own]
    pending = str(job.get("array_task_string") or "")
    if array_id and pending:
        return [f"{array_id}_{t}" for t in array_tasks(pending)] + [own]
    return [own]


def job_status(job_id: str, job: dict[str, Any]) -> JobStatus:
    reason = str(job.get("state_reason") or "")
    return JobStatus(
        job_id=job_id,
        state=job_state_text(job.get("job_state")),
        node_list=str(job.get("nodes") or ""),
        reason=reason,
        exit_code=exit_code(job.get("exit_code")),
        user=str(job.get("user_name") or ""),
        name=str(job.get("name") or ""),
    )


def parse_jobs(text: str, job_ids: Iterable[str], what: str) -> dict[str, JobStatus]:
    """`squeue --json` or `scontrol --json show job`: the records among `job_ids`."""
    wanted = set(job_ids)
    found: dict[str, JobStatus] = {}
    for job in load(text, what).get("jobs") or []:
        for job_id in job_ids_of(job):
            if job_id in wanted:
                found[job_id] = job_status(job_id, job)
    return found


def parse_job_names(text: str) -> list[tuple[str, str, str]]:
    """`squeue --json`: (name, id as %i prints it, array job id as %F prints it) of every
    record."""
    rows = []
    for job in load(text, "squeue --json").get("jobs") or []:
        ids = job_ids_of(job)
        array_id = number(job.get("array_job_id")) or job.get("job_id")
        rows.append((str(job.get("name", "")), ids[0], str(array_id)))
    return rows


def parse_nodes(text: str) -> list[SlurmNode]:
    """`scontrol --json show node`: each node, its state folded to `IDLE+DRAIN` form."""
    nodes = []
    for node in load(text, "scontrol --json show node").get("nodes") or []:
        nodes.append(
            SlurmNode(
                name=str(node["name"]),
                state="+".join(flags(node.get("state"))),
                reason=str(node.get("reason") or ""),
                addr=str(node.get("address") or ""),
                num_gpus=parse_gpus(str(node.get("gres") or "")),
            )
        )
    return nodes


def parse_reservations(text: str) -> dict[str, list[str]]:
    """`scontrol --json show reservation`: name -> its nodes, expanded."""
    found: dict[str, list[str]] = {}
    for resv in load(text, "scontrol --json show reservation").get("reservations") or []:
        nodes = str(resv.get("node_list") or "")
        found[str(resv["name"])] = expand_hostlist(nodes) if nodes else []
    return found


def parse_sacct(text: str, job_ids: Sequence[str]) -> dict[str, JobStatus]:
    """`sacct --json -X`: the ended jobs among `job_ids` (a requeued job's last record is
    its current one; live ones are left to squeue, as the text reader does)."""
    wanted, found = set(job_ids), dict[str, JobStatus]()
    for job in load(text, "sacct --json").get("jobs") or []:
        array = job.get("array") if isinstance(job.get("array"), dict) else {}
        array_id, task = number(array.get("job_id")), number(array.get("task_id"))
        own = str(job.get("job_id", ""))
        ids = [f"{array_id}_{task}", own] if array_id and task is not None else [own]
        state = job.get("state") if isinstance(job.get("state"), dict) else {}
        for job_id in ids:
            if job_id not in wanted:
                continue
            status = JobStatus(
                job_id=job_id,
                state=job_state_text(state.get("current")),
                node_list="" if job.get("nodes") in (None, "None assigned") else job["nodes"],
                reason="" if state.get("reason") in (None, "None") else str(state["reason"]),
                exit_code=exit_code(job.get("exit_code")),
            )
            if status.is_live:
                found.pop(job_id, None)
            else:
                found[job_id] = status
    return found
