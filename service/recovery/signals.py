"""Ingest failure signals (agents' node events, workers' collective errors) and classify them.

Storing the event and opening the incident happen in the request's transaction: once the
agent gets its 200, the recovery is durable and the reconciler will carry it out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import (
    Incident,
    IncidentState,
    Node,
    RecoveryAction,
)
from service.models.base import utcnow
from service.nodes.repository import insert_node_events
from service.notifications import outbox
from service.observability import metrics
from service.recovery.classification import Classifier, Rule, signal_name

OPEN_STATES = (IncidentState.OPEN, IncidentState.WAITING)


def open_incident(
    session: Session,
    *,
    kind: str,
    signal: str,
    action: RecoveryAction,
    message: str,
    cluster: str,
    node: str | None = None,
    run_id: int | None = None,
    attempt_id: int | None = None,
    signal_at: datetime | None = None,
) -> Incident | None:
    """Open an incident unless one for the same node (or run) and action is still open.
    `cluster` is the node's, or the run's where the incident names no node."""
    stmt = select(Incident).where(Incident.state.in_(OPEN_STATES), Incident.action == action)
    if node:
        stmt = stmt.where(Incident.cluster == cluster, Incident.node_name == node)
    else:
        stmt = stmt.where(Incident.run_id == run_id)
    if session.scalars(stmt.limit(1)).first() is not None:
        return None  # a dying GPU repeats itself; one recovery is enough
    incident = Incident(
        kind=kind,
        signal=signal,
        action=action,
        state=IncidentState.OPEN,
        message=message,
        cluster=cluster,
        node_name=node,
        run_id=run_id,
        attempt_id=attempt_id,
        signal_at=signal_at or utcnow(),
        detected_at=utcnow(),
        details={},
    )
    session.add(incident)
    session.flush()
    outbox.on_incident_opened(session, incident)  # the touched runs' teams are told
    metrics.count_incident(cluster, signal, action.value)
    metrics.observe_incident(incident, "detect")
    return incident


@dataclass(frozen=True)
class SignalIn:
    """One event as an agent sent it (validated by the API schema)."""

    idempotency_key: str
    kind: str
    code: int | None
    message: str
    observed_at: datetime | None
    data: dict[str, object]


def ingest_node_events(
    session: Session,
    cluster: str,
    node_name: str,
    events: list[SignalIn],
    settings: Settings,
    classifier: Classifier,
) -> int:
    """Store a batch of `cluster`'s node's events exactly once and act on their classes.

    One INSERT ... ON CONFLICT DO NOTHING per batch: a whole leaf switch failing at once
    must not queue behind thousands of single-row round trips. Returns how many events were
    new.
    """
    now = utcnow()
    rules = {e.idempotency_key: classifier.classify(signal_name(e.kind, e.code)) for e in events}
    rows = [
        {
            "kind": e.kind,
            "code": e.code,
            "message": e.message[:4000],
            "data": e.data,
            "idempotency_key": e.idempotency_key,
            "action": rules[e.idempotency_key].action.value,
            "observed_at": e.observed_at,
        }
        for e in events
    ]
    inserted = insert_node_events(session, cluster, node_name, now, rows)
    counts: Counter[tuple[str, int | None, RecoveryAction]] = Counter()
    for event in events:
        if event.idempotency_key not in inserted:
            continue
        rule = rules[event.idempotency_key]
        counts[event.kind, event.code, rule.action] += 1
        if rule.action != RecoveryAction.OBSERVE:
            _act(session, cluster, node_name, event, rule, settings)
    for (kind, code, action), count in counts.items():  # one metric update per label set
        metrics.count_node_event(cluster, kind, code, action, count)
    return len(inserted)


def escalated_action(
    action: RecoveryAction, app_errors: int, app_errors_before_drain: int
) -> RecoveryAction:
    """What a classified signal asks for once the node's count of application-class errors
    (this one included) is known: a COUNT_AND_ESCALATE row drains the node at the threshold
    and is only counted below it; every other action stands. Pure, so the failure
    simulation (sim/) decides whether to drain exactly as the service does."""
    if action == RecoveryAction.COUNT_AND_ESCALATE and app_errors >= app_errors_before_drain:
        return RecoveryAction.DRAIN_AND_MOVE
    return action


def _act(
    session: Session, cluster: str, node_name: str, event: SignalIn, rule: Rule, settings: Settings
) -> None:
    action, message = rule.action, event.message
    signal = signal_name(event.kind, event.code)
    if action == RecoveryAction.COUNT_AND_ESCALATE:
        node = session.get(Node, (cluster, node_name), with_for_update=True)
        assert node is not None
        node.num_app_errors += 1
        action = escalated_action(action, node.num_app_errors, settings.app_errors_before_drain)
        if action == RecoveryAction.COUNT_AND_ESCALATE:
            return
        message = (
            f"{message} ({node.num_app_errors} application-class errors on this node: "
            "escalated to drain)"
        )
    if action in (RecoveryAction.DRAIN_AND_MOVE, RecoveryAction.RESTART_SAME_NODES):
        open_incident(
            session,
            kind=event.kind,
            signal=signal,
            action=action,
            cluster=cluster,
            node=node_name,
            message=f"{node_name}: {signal} ({rule.why}): {message}"[:2000],
            signal_at=event.observed_at,
        )
