"""GET /v1/runs/{id}/logs: the ranks' output, read from the attempt's job folder in chunks.

submitit writes each task's stdout and stderr to `<job folder>/<job id>_<task>_log.out`, and
one task is one rank. The job folder is on the file system the service shares with the
compute nodes and belongs to the run's owner, so the service reads it as the owner
(service/identity/gate.py), never with its own rights. A client follows a log by asking
again from `next_offset`; chunks end at a line break when they can, so nobody prints half a
line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from service.auth.deps import USERS, PrincipalDep
from service.config import get_settings
from service.db import SessionDep
from service.errors import DbId, InvalidSpec, NotFound
from service.identity.gate import OwnerGate
from service.identity.service import OwnerUnavailable, owner_of
from service.models import Attempt, AttemptState, Run, RunState
from service.runs.service import require_run
from service.slurm.commands import SlurmError

router = APIRouter(prefix="/v1/runs", tags=["runs"], dependencies=[USERS])
MAX_CHUNK_BYTES = 1 << 20


class LogChunk(BaseModel):
    """A piece of one rank's output of one attempt."""

    run_id: int
    run_state: RunState
    attempt: int | None = Field(description="Attempt number read (None: none submitted yet).")
    attempt_state: AttemptState | None
    latest_attempt: int | None = Field(description="The run's newest attempt, to follow it.")
    rank: int
    num_ranks: int = Field(description="Ranks of this attempt: valid values of `rank`.")
    exists: bool = Field(description="False until the rank has started writing.")
    offset: int = Field(description="Byte offset the text starts at.")
    next_offset: int = Field(description="Ask from here for what follows.")
    size_bytes: int = Field(description="The file's size when it was read.")
    text: str


def log_path(attempt: Attempt, rank: int) -> Path | None:
    """Where submitit puts one rank's output (None before Slurm gave the job an id)."""
    if not attempt.slurm_job_id or not attempt.job_folder:
        return None
    return Path(attempt.job_folder) / f"{attempt.slurm_job_id}_{rank}_log.out"


def _pick_attempt(run: Run, number: int | None) -> Attempt | None:
    if number is None:
        return run.attempts[-1] if run.attempts else None
    for attempt in run.attempts:
        if attempt.number == number:
            return attempt
    raise NotFound(
        f"run {run.id} has no attempt {number} (it has {len(run.attempts)}); "
        f"`runyard run show {run.id}` lists them"
    )


def run_log_chunk(run: Run, number: int | None, rank: int, offset: int, limit: int) -> LogChunk:
    attempt = _pick_attempt(run, number)
    num_ranks = (len(attempt.nodes) if attempt and attempt.nodes else run.num_nodes) * (
        run.gpus_per_node
    )
    if rank >= num_ranks:
        raise InvalidSpec(f"rank: {rank} is out of range; this attempt has ranks 0-{num_ranks - 1}")
    path = log_path(attempt, rank) if attempt else None
    data, size, exists = b"", 0, False
    if path is not None and attempt is not None:
        # The file is the owner's (written by their job): read with their rights, not ours.
        try:
            exists, data, size = OwnerGate(get_settings()).read_log(
                owner_of(run), path, offset, limit, complete=attempt.state.is_terminal
            )
        except SlurmError as exc:  # OwnerAccessError: sudo refused, or the file unreadable
            raise OwnerUnavailable(f"cannot read {path} as {run.unix_user}: {exc}") from exc
    return LogChunk(
        run_id=run.id,
        run_state=run.state,
        attempt=attempt.number if attempt else None,
        attempt_state=attempt.state if attempt else None,
        latest_attempt=run.attempts[-1].number if run.attempts else None,
        rank=rank,
        num_ranks=num_ranks,
        exists=exists,
        offset=offset,
        next_offset=min(offset, size) + len(data) if exists else offset,
        size_bytes=size,
        text=data.decode("utf-8", errors="replace"),
    )


@router.get("/{run_id}/logs")
def run_logs(
    run_id: DbId,
    session: SessionDep,
    principal: PrincipalDep,
    attempt: Annotated[int | None, Query(ge=1, description="Attempt number (newest)")] = None,
    rank: Annotated[int, Query(ge=0, le=1_000_000, description="Rank whose output to read")] = 0,
    offset: Annotated[int, Query(ge=0, le=2**62, description="Byte offset to read from")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_CHUNK_BYTES)] = 256 * 1024,
) -> LogChunk:
    """One rank's output of one attempt from a byte offset; poll `next_offset` to follow."""
    run = require_run(session, run_id, principal)
    return run_log_chunk(run, attempt, rank, offset, limit)
