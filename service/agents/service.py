"""What an agent's report does: it proves the node alive, and each signal in it is stored
once, classified and acted on (service/recovery/signals.py)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.config import Settings
from service.errors import NotFound
from service.nodes.schemas import EventBatch, EventBatchAck
from service.nodes.service import touch_heartbeat
from service.recovery.classification import Classifier
from service.recovery.signals import SignalIn, ingest_node_events


def ingest_events(
    session: Session,
    cluster: str,
    name: str,
    batch: EventBatch,
    settings: Settings,
    classifier: Classifier,
) -> EventBatchAck:
    if not touch_heartbeat(session, cluster, name, settings):  # an agent that reports is alive
        raise NotFound(f"no node named '{name}' on cluster {cluster}; `runyard node list`")
    events = [
        SignalIn(e.idempotency_key, e.kind, e.code, e.message, e.observed_at, dict(e.data))
        for e in batch.events
    ]
    accepted = ingest_node_events(session, cluster, name, events, settings, classifier)
    return EventBatchAck(accepted=accepted, duplicates=len(batch.events) - accepted)
