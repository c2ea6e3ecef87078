"""Ingest failure signals (agents' node events, workers' collective errors) and classify them.

Storing the event and opening the incident happen in the request's transaction: once the
agent gets its 200, the recovery is durable and the reconciler will carry it out.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import (
    Incident,
    IncidentState,
    Node,
    NodeEvent,
    RecoveryAction,
)
from service.models.base import utcnow
from service.recovery.classification import Classifier, signal_name

OPEN_STATES = (IncidentState.OPEN, IncidentState.WAITING)


def open_incident(
    session: Session,
    *,
    kind: str,
    signal: str,
    action: RecoveryAction,
    message: str,
    node: str | None = None,
    run_id: int | None = None,
    attempt_id: int | None = None,
    signal_at: datetime | None = None,
) -> Incident | None:
    """Open an incident unless one for the same node (or run) and action is still open."""
    stmt = select(Incident).where(Incident.state.in_(OPEN_STATES), Incident.action == action)
    stmt = stmt.where(Incident.node_name == node) if node else stmt.where(Incident.run_id == run_id)
    if session.scalars(stmt.limit(1)).first() is not None:
        return None  # a dying GPU repeats itself; one recovery is enough
    incident = Incident(
        kind=kind,
        signal=signal,
        action=action,
        state=IncidentState.OPEN,
        message=message,
        node_name=node,
        run_id=run_id,
        attempt_id=attempt_id,
        signal_at=signal_at or utcnow(),
        detected_at=utcnow(),
        details={},
    )
    session.add(incident)
    session.flush()
    return incident


def ingest_node_event(
    session: Session,
    node: Node,
    settings: Settings,
    classifier: Classifier,
    *,
    idempotency_key: str,
    kind: str,
    code: int | None,
    message: str,
    observed_at: datetime | None,
    data: dict[str, object],
) -> bool:
    """Store one agent event exactly once and act on its class. False if it was a duplicate."""
    signal = signal_name(kind, code)
    rule = classifier.classify(signal)
    inserted = session.execute(
        insert(NodeEvent)
        .values(
            node_name=node.name,
            kind=kind,
            code=code,
            message=message[:4000],
            data=data,
            idempotency_key=idempotency_key,
            action=rule.action.value,
            observed_at=observed_at,
            created_at=utcnow(),
        )
        .on_conflict_do_nothing(index_elements=["idempotency_key"])
        .returning(NodeEvent.id)
    ).first()
    if inserted is None:
        return False
    action = rule.action
    if action == RecoveryAction.COUNT_AND_ESCALATE:
        node.num_app_errors += 1
        if node.num_app_errors < settings.app_errors_before_drain:
            return True
        action = RecoveryAction.DRAIN_AND_MOVE
        message = (
            f"{message} ({node.num_app_errors} application-class errors on this node: "
            "escalated to drain)"
        )
    if action in (RecoveryAction.DRAIN_AND_MOVE, RecoveryAction.RESTART_SAME_NODES):
        open_incident(
            session,
            kind=kind,
            signal=signal,
            action=action,
            node=node.name,
            message=f"{node.name}: {signal} ({rule.why}): {message}"[:2000],
            signal_at=observed_at,
        )
    return True
