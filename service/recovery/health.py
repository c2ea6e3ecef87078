"""Node liveness from two independent sources: Slurm's view and the agents' heartbeats."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select

from service.config import Settings
from service.db import session_scope
from service.models import Node, NodeState, RecoveryAction
from service.models.base import utcnow
from service.nodes.lifecycle import set_node_state
from service.recovery.signals import open_incident
from service.recovery.spares import nodes_held_by_runs
from service.slurm.snapshot import ClusterSnapshot, is_down

WATCHED_STATES = (NodeState.HEALTHY, NodeState.SUSPECT, NodeState.SPARE)


def check_nodes(settings: Settings, snapshot: ClusterSnapshot, watching_since: datetime) -> None:
    """Suspect silent nodes; drain-and-move the dead ones that hold our runs or spares.

    An idle node that dies is only recorded: Slurm already keeps jobs off a DOWN node, and
    draining it would fight whoever else runs on this cluster. Silence is measured from no
    earlier than `watching_since` (this service's start): a service that was down missed
    heartbeats that were sent.
    """
    now = utcnow()
    suspect_after = timedelta(seconds=settings.heartbeat_suspect_s)
    dead_after = timedelta(seconds=settings.heartbeat_dead_s)
    with session_scope() as session:
        held = nodes_held_by_runs(session)
        nodes = session.scalars(
            select(Node).where(Node.state.in_(WATCHED_STATES)).with_for_update()
        ).all()
        for node in nodes:
            ours = node.name in held or node.state == NodeState.SPARE
            slurm = snapshot.nodes.get(node.name)
            if ours and slurm is not None and is_down(slurm.state):
                open_incident(
                    session,
                    kind="slurm",
                    signal="slurm:node_down",
                    action=RecoveryAction.DRAIN_AND_MOVE,
                    node=node.name,
                    message=f"{node.name}: Slurm reports {slurm.state}"
                    + (f" ({slurm.reason})" if slurm.reason else ""),
                )
                continue
            if node.last_heartbeat_at is None:
                continue  # no agent ever spoke for it: silence proves nothing
            silence = now - max(node.last_heartbeat_at, watching_since)
            if silence > dead_after and ours:
                open_incident(
                    session,
                    kind="heartbeat",
                    signal="heartbeat:lost",
                    action=RecoveryAction.DRAIN_AND_MOVE,
                    node=node.name,
                    signal_at=node.last_heartbeat_at,
                    message=f"{node.name}: no heartbeat for {silence.total_seconds():.0f} s",
                )
            elif silence > suspect_after and node.state == NodeState.HEALTHY:
                set_node_state(
                    session,
                    node,
                    NodeState.SUSPECT,
                    f"no heartbeat for {silence.total_seconds():.0f} s",
                )
            elif silence <= suspect_after and node.state == NodeState.SUSPECT:
                set_node_state(session, node, NodeState.HEALTHY, "heartbeats resumed")
