"""GET /v1/runs/{id}/tracking: where a run's trackers are and how far their export got."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from service.auth.deps import USERS, PrincipalDep
from service.db import SessionDep
from service.errors import DbId
from service.models import ExportState, TrackerExport, TrackerKind
from service.runs.service import require_run

router = APIRouter(prefix="/v1/runs", tags=["runs"], dependencies=[USERS])


class TrackerExportOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    tracker: TrackerKind
    state: ExportState
    tracker_run_id: str | None = Field(
        description="MLflow's run id, W&B's run id, or the TensorBoard log folder."
    )
    exported_step: int = Field(description="Every step up to this one is in the tracker, once.")
    num_failures: int = Field(description="Failed tries in a row (0: healthy).")
    last_error: str | None
    next_try_at: datetime | None
    last_exported_at: datetime | None
    finished_at: datetime | None


@router.get("/{run_id}/tracking")
def run_tracking(
    run_id: DbId, session: SessionDep, principal: PrincipalDep
) -> list[TrackerExportOut]:
    """The run's experiment trackers and their export cursors (steps settle at commits)."""
    require_run(session, run_id, principal)
    rows = session.scalars(
        select(TrackerExport).where(TrackerExport.run_id == run_id).order_by(TrackerExport.id)
    ).all()
    return [TrackerExportOut.model_validate(r) for r in rows]
