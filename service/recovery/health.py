"""Node liveness from two independent sources: Slurm's view and the agents' heartbeats."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import session_scope
from service.models import Node, NodeState, RecoveryAction
from service.models.base import utcnow
from service.nodes.node_state_machine import set_node_state
from service.recovery.signals import open_incident
from service.recovery.spares import nodes_held_by_runs
from service.slurm.snapshot import ClusterSnapshot, is_down

WATCHED_STATES = (NodeState.HEALTHY, NodeState.SUSPECT, NodeState.SPARE)
# The incident a silent node's drain opens; a drain with no other cause returns by itself
# once the agent is back (service/recovery/heartbeat_return.py).
HEARTBEAT_LOST = "heartbeat:lost"


class Verdict(StrEnum):
    """What one pass decides about one watched node."""

    SLURM_DOWN = "slurm_down"  # ours, and Slurm lost it: drain and move
    HEARTBEAT_LOST = "heartbeat_lost"  # ours, and silent past heartbeat_dead_s: same
    SUSPECT = "suspect"  # silent past heartbeat_suspect_s
    HEALTHY_AGAIN = "healthy_again"  # a suspect node that speaks again


def verdict(
    state: NodeState,
    last_heartbeat_at: datetime | None,
    *,
    ours: bool,
    slurm_state: str | None,
    now: datetime,
    watching_since: datetime,
    settings: Settings,
) -> Verdict | None:
    """The action one node needs now, or None (the common case)."""
    if ours and slurm_state is not None and is_down(slurm_state):
        return Verdict.SLURM_DOWN
    if last_heartbeat_at is None:
        return None  # no agent ever spoke for it: silence proves nothing
    silence = now - max(last_heartbeat_at, watching_since)
    if silence > timedelta(seconds=settings.heartbeat_dead_s) and ours:
        return Verdict.HEARTBEAT_LOST
    suspect_after = timedelta(seconds=settings.heartbeat_suspect_s)
    if silence > suspect_after and state == NodeState.HEALTHY:
        return Verdict.SUSPECT
    if silence <= suspect_after and state == NodeState.SUSPECT:
        return Verdict.HEALTHY_AGAIN
    return None


def check_nodes(settings: Settings, snapshot: ClusterSnapshot, watching_since: datetime) -> None:
    """Suspect silent nodes; drain-and-move the dead ones that hold our runs or spares.

    An idle node that dies is only recorded: Slurm already keeps jobs off a DOWN node, and
    draining it would fight whoever else runs on this cluster. Silence is measured from no
    earlier than `watching_since` (this service's start, or its return after losing
    Postgres: service/reconcile/loop.py): a service that was down, or whose database was,
    missed heartbeats that were sent.

    Every watched node is read without a lock, and only the few that need an action are
    locked (and judged again on the locked row): heartbeats update these rows hundreds of
    times a second, and locking all of them for the length of a pass stalled every
    heartbeat of the fleet behind it.
    """
    now = utcnow()
    with session_scope() as session:
        cluster = snapshot.cluster  # its nodes only: another cluster's are not in it
        held = nodes_held_by_runs(session, cluster)

        def judge(
            name: str, state: NodeState, last_heartbeat_at: datetime | None
        ) -> Verdict | None:
            slurm = snapshot.nodes.get(name)
            return verdict(
                state,
                last_heartbeat_at,
                ours=name in held or state == NodeState.SPARE,
                slurm_state=slurm.state if slurm else None,
                now=now,
                watching_since=watching_since,
                settings=settings,
            )

        watched = session.execute(
            select(Node.name, Node.state, Node.last_heartbeat_at).where(
                Node.cluster == cluster, Node.state.in_(WATCHED_STATES)
            )
        ).all()
        candidates = [row.name for row in watched if judge(*row) is not None]
        if not candidates:
            return
        nodes = session.scalars(
            select(Node)
            .where(Node.cluster == cluster, Node.name.in_(candidates))
            .where(Node.state.in_(WATCHED_STATES))
            .order_by(Node.name)  # a stable lock order
            .with_for_update()
        ).all()
        for node in nodes:
            _act_on(
                session,
                node,
                judge(node.name, node.state, node.last_heartbeat_at),
                now,
                watching_since,
                snapshot,
            )


def _act_on(
    session: Session,
    node: Node,
    decided: Verdict | None,
    now: datetime,
    watching_since: datetime,
    snapshot: ClusterSnapshot,
) -> None:
    if decided is None:
        return  # it spoke (or changed state) between the two reads
    silence = now - max(node.last_heartbeat_at or now, watching_since)
    if decided == Verdict.SLURM_DOWN:
        slurm = snapshot.nodes[node.name]
        open_incident(
            session,
            kind="slurm",
            signal="slurm:node_down",
            action=RecoveryAction.DRAIN_AND_MOVE,
            cluster=node.cluster,
            node=node.name,
            message=f"{node.name}: Slurm reports {slurm.state}"
            + (f" ({slurm.reason})" if slurm.reason else ""),
        )
    elif decided == Verdict.HEARTBEAT_LOST:
        open_incident(
            session,
            kind="heartbeat",
            signal=HEARTBEAT_LOST,
            action=RecoveryAction.DRAIN_AND_MOVE,
            cluster=node.cluster,
            node=node.name,
            signal_at=node.last_heartbeat_at,
            message=f"{node.name}: no heartbeat for {silence.total_seconds():.0f} s",
        )
    elif decided == Verdict.SUSPECT:
        set_node_state(
            session, node, NodeState.SUSPECT, f"no heartbeat for {silence.total_seconds():.0f} s"
        )
    else:
        set_node_state(session, node, NodeState.HEALTHY, "heartbeats resumed")
