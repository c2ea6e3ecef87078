"""What on-call's requests do beyond reading and writing a row: an admin drain."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.models import Incident, NodeState, RecoveryAction
from service.nodes.node_state_machine import ADMIN_DRAIN_EVENT, node_event
from service.nodes.service import require_node
from service.recovery.signals import open_incident


def request_drain(session: Session, cluster: str, name: str, reason: str) -> Incident | None:
    """An admin drain is an incident like any other: its runs move to spares too.

    It is also a node event, recorded even where the node is out already or another
    drain's incident is still open (open_incident then opens none): that event holds the
    node out until `runyard node resume`, where a drain for lost heartbeats alone would
    return by itself (service/recovery/heartbeat_return.py).
    """
    node = require_node(session, cluster, name, for_update=True)
    node_event(session, node, ADMIN_DRAIN_EVENT, f"drained by an admin: {reason}")
    if node.state in (NodeState.DRAINING, NodeState.DRAINED, NodeState.IN_REPAIR):
        return None  # out already, and now held out
    return open_incident(
        session,
        kind="admin",
        signal="admin:drain",
        action=RecoveryAction.DRAIN_AND_MOVE,
        cluster=cluster,
        node=name,
        message=f"{name}: drained by an admin: {reason}",
    )
