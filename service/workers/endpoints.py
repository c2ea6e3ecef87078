"""/v1/worker: what training ranks call. Not for people."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from contract import WorkerRunConfig
from service.auth.deps import WORKER_OF_ATTEMPT
from service.config import get_settings
from service.db import SessionDep
from service.errors import DbId, ErrorBody
from service.runs import live_interval
from service.runs.schemas import CheckpointOut
from service.runs.service import worker_config
from service.worker_protocol.handshake import SPOKEN, SPOKEN_PROTOCOL
from service.worker_protocol.schemas import (
    CheckpointReport,
    ErrorReport,
    FinishReport,
    ProgressAck,
    ProgressReport,
    ProtocolRange,
)
from service.workers import service

router = APIRouter(prefix="/v1/worker", tags=["worker"])
# One attempt's endpoints: the protocol is checked first, so that a client this service does
# not speak to hears why (and what to upgrade) rather than a token or body error; then the
# attempt's own token. (Per endpoint, not a nested router: FastAPI would label the access
# log and latency metric with the nested router's relative path.)
OF_ATTEMPT = [SPOKEN_PROTOCOL, WORKER_OF_ATTEMPT]
REFUSED_PROTOCOL: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "A worker protocol this service does not speak"}
}


@router.get("/protocol")
async def get_protocol() -> ProtocolRange:
    """The worker protocol versions this service speaks (no token needed)."""
    return SPOKEN


@router.get("/attempts/{attempt_id}/config", dependencies=OF_ATTEMPT, responses=REFUSED_PROTOCOL)
def get_config(attempt_id: DbId, session: SessionDep) -> WorkerRunConfig:
    """The resolved config this attempt's ranks train with (includes where to resume)."""
    attempt, run = service.live_attempt_and_run(session, attempt_id)
    return worker_config(session, run, attempt, get_settings())


@router.post("/attempts/{attempt_id}/progress", dependencies=OF_ATTEMPT, responses=REFUSED_PROTOCOL)
def report_progress(attempt_id: DbId, report: ProgressReport, session: SessionDep) -> ProgressAck:
    """Heartbeat plus the losses of the steps since the last report."""
    run, attempt = service.record_progress(session, attempt_id, report)
    return ProgressAck(
        run_state=run.state,
        attempt_state=attempt.state,
        stop_requested=attempt.stop_requested_at is not None,
        stop_reason=attempt.stop_reason if attempt.stop_requested_at else None,
        checkpoint_every=live_interval.announced_every(run.config),
    )


@router.post(
    "/attempts/{attempt_id}/checkpoints", dependencies=OF_ATTEMPT, responses=REFUSED_PROTOCOL
)
def report_checkpoint(
    attempt_id: DbId, report: CheckpointReport, session: SessionDep
) -> CheckpointOut:
    """Register a checkpoint as WRITING, then as COMMITTED once every rank finished it."""
    return CheckpointOut.model_validate(service.record_checkpoint(session, attempt_id, report))


@router.post("/attempts/{attempt_id}/finish", dependencies=OF_ATTEMPT, responses=REFUSED_PROTOCOL)
def report_finish(attempt_id: DbId, report: FinishReport, session: SessionDep) -> dict[str, int]:
    """The last step and its checkpoint are done: the run may succeed when the job ends."""
    run = service.record_finish(session, attempt_id, report)
    return {"run_id": run.id, "final_step": report.final_step}


@router.post(
    "/attempts/{attempt_id}/errors",
    status_code=204,
    dependencies=OF_ATTEMPT,
    responses=REFUSED_PROTOCOL,
)
def report_error(attempt_id: DbId, report: ErrorReport, session: SessionDep) -> None:
    """A rank caught a collective failure; recorded before the rank exits."""
    service.record_error(session, attempt_id, report)
