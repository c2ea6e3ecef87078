"""The node state machine: every transition is a node event with its reason."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from service.models import Node, NodeEvent, NodeState
from service.observability.metrics import count_node_transition
from service.slurm.commands import DRAIN_PREFIX

S = NodeState
NODE_TRANSITIONS: dict[NodeState, set[NodeState]] = {
    S.HEALTHY: {S.SUSPECT, S.DRAINING, S.DRAINED, S.SPARE},
    S.SUSPECT: {S.HEALTHY, S.DRAINING, S.DRAINED},
    S.SPARE: {S.HEALTHY, S.SUSPECT, S.DRAINING, S.DRAINED},
    S.DRAINING: {S.DRAINED, S.HEALTHY},
    S.DRAINED: {S.IN_REPAIR, S.HEALTHY},
    S.IN_REPAIR: {S.HEALTHY, S.DRAINED},
}


# The node event an admin's drain leaves, whether or not the node was out already: it holds
# the node out until an admin resumes it (a drain for lost heartbeats alone would otherwise
# return by itself: service/recovery/heartbeat_return.py).
ADMIN_DRAIN_EVENT = "admin.drain"


class IllegalNodeTransition(RuntimeError):
    pass


def drained_by_runyard(slurm_reason: str) -> bool:
    """Whether runyard may resume a node Slurm holds with this reason: only what runyard
    drained (its reasons carry DRAIN_PREFIX), or one without a reason. A drain by the site's
    health check or by hand is someone else's to lift."""
    return not slurm_reason or slurm_reason.startswith(DRAIN_PREFIX)


def node_event(
    session: Session, node: Node, kind: str, message: str, data: dict[str, Any] | None = None
) -> None:
    event = NodeEvent(cluster=node.cluster, node_name=node.name, kind=kind, message=message)
    event.data = data or {}
    session.add(event)


def set_node_state(session: Session, node: Node, new: NodeState, reason: str) -> None:
    if node.state == new:
        return
    if new not in NODE_TRANSITIONS[node.state]:
        raise IllegalNodeTransition(f"node {node.name}: {node.state} -> {new}")
    old, node.state, node.state_reason = node.state, new, reason
    if new == S.HEALTHY and old in (S.DRAINED, S.IN_REPAIR):
        # Back from repair: a SLOW flag from before the drain no longer says anything.
        node.num_slow_reports, node.slow_since, node.slow_ratio = 0, None, None
    count_node_transition(node.cluster, node.name, new.value)
    node_event(session, node, f"node.{new.lower()}", reason, {"from": old.value, "to": new.value})
