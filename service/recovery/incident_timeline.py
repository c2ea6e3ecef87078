"""Stamp the recovery timeline of the incidents that moved a run, as its next attempt
progresses: submitted, running, first step trained."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Incident, IncidentState
from service.models.base import utcnow
from service.observability import metrics
from service.recovery.signals import OPEN_STATES


def _open_for_run(session: Session, run_id: int) -> list[Incident]:
    return list(
        session.scalars(
            select(Incident)
            .where(
                Incident.run_id == run_id,
                Incident.state.in_(OPEN_STATES),
                Incident.attempt_ended_at.is_not(None),
            )
            .with_for_update()
        ).all()
    )


def attempt_submitted(session: Session, run_id: int) -> None:
    for incident in _open_for_run(session, run_id):
        if incident.submitted_at is None:
            incident.submitted_at = utcnow()
            metrics.observe_incident(incident, "resubmit")
        if incident.state == IncidentState.WAITING:
            incident.state = IncidentState.OPEN


def attempt_running(session: Session, run_id: int) -> None:
    for incident in _open_for_run(session, run_id):
        if incident.submitted_at is not None and incident.running_at is None:
            incident.running_at = utcnow()
            metrics.observe_incident(incident, "start")


def first_step(session: Session, run_id: int, step: int) -> None:
    """The run trains again: the recovery is over."""
    for incident in _open_for_run(session, run_id):
        if incident.submitted_at is None:
            continue
        now = utcnow()
        if incident.running_at is None:
            incident.running_at = now
            metrics.observe_incident(incident, "start")
        incident.first_step_at, incident.resume_step = now, step - 1
        incident.state, incident.resolved_at = IncidentState.RESOLVED, now
        metrics.observe_incident(incident, "first_step", "total")
