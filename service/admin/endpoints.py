"""/v1/admin: what on-call uses to drain, resume, size the spare pool and read incidents."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status
from sqlalchemy import select

from service.admin.schemas import IncidentOut, SparePool, SparePoolUpdate
from service.db import SessionDep
from service.models import Incident
from service.nodes import service as nodes
from service.nodes.schemas import DrainRequest, NodeOut, ResumeRequest
from service.recovery import spares
from service.slurm import commands

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.post("/nodes/{name}/drain", status_code=status.HTTP_202_ACCEPTED)
def drain(name: str, body: DrainRequest, session: SessionDep) -> IncidentOut | None:
    """Drain a node; a run on it moves to a spare like after a hardware failure."""
    incident = nodes.request_drain(session, name, body.reason)
    return incident_out(incident) if incident else None


@router.post("/nodes/{name}/resume")
def resume(name: str, body: ResumeRequest, session: SessionDep) -> NodeOut:
    """Return a drained node to service (only runyard's own drains unless forced)."""
    nodes.require_node(session, name)
    session.rollback()  # no transaction stays open across the Slurm calls below
    slurm = next((n for n in commands.show_nodes() if n.name == name), None)
    reason = slurm.reason if slurm else ""
    node = nodes.require_node(session, name, for_update=True)
    nodes.check_resumable(node, reason, body.force)
    session.rollback()
    commands.resume_node(name)
    node = nodes.require_node(session, name, for_update=True)
    nodes.mark_resumed(session, node, body.force)
    return NodeOut.model_validate(node)


@router.get("/spares")
def get_spares(session: SessionDep) -> SparePool:
    """The spare pool's target size and current members."""
    return SparePool(
        target=spares.get_target(session), members=[n.name for n in spares.spare_nodes(session)]
    )


@router.put("/spares")
def set_spares(body: SparePoolUpdate, session: SessionDep) -> SparePool:
    """Set the spare pool's target; the reconciler fills or shrinks it within a tick."""
    spares.set_target(session, body.target)
    return SparePool(target=body.target, members=[n.name for n in spares.spare_nodes(session)])


@router.get("/incidents")
def list_incidents(
    session: SessionDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[IncidentOut]:
    """Failures, what each touched, and how long recovery took, newest first."""
    rows = session.scalars(select(Incident).order_by(Incident.id.desc()).limit(limit)).all()
    return [incident_out(i) for i in rows]


def incident_out(incident: Incident) -> IncidentOut:
    out = IncidentOut.model_validate(incident)
    if incident.first_step_at is not None:
        out.recovery_s = (incident.first_step_at - incident.signal_at).total_seconds()
    return out
