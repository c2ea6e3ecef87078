"""A node drained only because its agent fell silent returns to service by itself.

Silence cannot tell a dead node from a dead agent (a restart, an OOM kill, a cut management
link), so health.py drains a silent node that holds a run and moves the run. Once the agent
is back and has heartbeated with no gap over heartbeat_suspect_s for heartbeat_return_s
(Node.heartbeats_since, kept by the heartbeats themselves), the silence was the agent's:
the node is resumed in Slurm and set HEALTHY, unless something else holds it out (Held).

The drain's cause is read from the incidents and the node's events, not from
Node.state_reason or Slurm's drain reason: both are free text that the next transition or
drain overwrites. Nor from the incidents alone: open_incident opens none for a node whose
drain is still in progress, so an Xid during a heartbeat drain leaves no incident of its
own. But every report of the node's agent is a node event with the action its
classification gave it, and every admin drain leaves one (admin/service.py request_drain).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from sqlalchemy import and_, exists, or_, select
from sqlalchemy.dialects.postgresql import distinct_on
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import session_scope
from service.models import Incident, Node, NodeEvent, NodeState, RecoveryAction
from service.models.base import utcnow
from service.nodes import repository as nodes_repo
from service.nodes.node_state_machine import ADMIN_DRAIN_EVENT, drained_by_runyard, set_node_state
from service.observability.logging import log_context
from service.recovery.health import HEARTBEAT_LOST
from service.slurm.client import SlurmClient
from service.slurm.commands import SlurmNode
from service.slurm.snapshot import ClusterSnapshot, is_down

log = logging.getLogger(__name__)


class Held(StrEnum):
    """Why a DRAINED node whose agent is back stays out (the first that applies)."""

    OTHER_DRAIN = "other_drain"  # its newest incident is not a heartbeat loss that drained it
    RECOVERING = "recovering"  # that incident has not moved the node's runs off it yet
    OTHER_CAUSE = "other_cause"  # since the silence: another incident, a fault, an admin drain
    SLURM_DOWN = "slurm_down"  # Slurm has lost the node, whatever its agent says
    FOREIGN_DRAIN = "foreign_drain"  # drained in Slurm by someone else: theirs to lift


@dataclass(frozen=True)
class Return:
    """A node to give back: how long its agent has been heartbeating, whether Slurm still
    drains it (an admin may have resumed it by hand), and the drain's reason (to drain it
    again with, should a cause arrive while Slurm is resuming it)."""

    name: str
    back_s: float
    in_slurm: bool
    drain_reason: str


def return_heartbeat_drains(
    settings: Settings,
    snapshot: ClusterSnapshot,
    slurm: SlurmClient,
    now: datetime | None = None,
) -> None:
    """Resume every node due back (see returns_due), each in its own steps: decided, resumed
    in Slurm, then recorded HEALTHY after a second look under the node's lock."""
    if settings.heartbeat_return_s <= 0:
        return  # the site returns every drained node by hand
    now = now or utcnow()
    with session_scope() as session:
        due = returns_due(session, settings, snapshot, now)
    for node in due:
        with log_context(node=node.name):
            try:
                give_back(settings, snapshot, slurm, node, now)
            except Exception:  # a Slurm call that failed: retried next tick, the others go on
                log.exception("returning %s failed; retrying next tick", node.name)


def give_back(
    settings: Settings, snapshot: ClusterSnapshot, slurm: SlurmClient, node: Return, now: datetime
) -> None:
    """Resume `node` in Slurm, then record it HEALTHY after a second look under its lock. A
    cause that arrived between the two looks (an admin's drain, say) keeps it out, and Slurm
    drains it again."""
    if node.in_slurm:
        slurm.resume(node.name)
    with session_scope() as session:
        locked = nodes_repo.get_node(session, snapshot.cluster, node.name, for_update=True)
        if locked is None or locked.state != NodeState.DRAINED:
            return  # an admin resumed it meanwhile
        still_due = bool(returns_due(session, settings, snapshot, now, [node.name]))
        if still_due:
            set_node_state(
                session,
                locked,
                NodeState.HEALTHY,
                f"heartbeats back for {node.back_s:.0f} s: heartbeat-only drain returned",
            )
    if still_due:
        log.info("%s: heartbeat-only drain returned after %.0f s", node.name, node.back_s)
    elif node.in_slurm:
        log.warning("%s: a cause to keep it drained came while resuming it", node.name)
        slurm.drain(node.name, node.drain_reason)


def returns_due(
    session: Session,
    settings: Settings,
    snapshot: ClusterSnapshot,
    now: datetime,
    names: Sequence[str] | None = None,
) -> list[Return]:
    """DRAINED nodes (among `names`, if given) whose agent has heartbeated without a gap for
    heartbeat_return_s up to now, and that nothing but the silence holds out.

    Only those are judged further: a node drained for a dead GPU whose agent is healthy
    matches the first query every tick, and is settled by one more (its newest incident).
    """
    return_after = now - timedelta(seconds=settings.heartbeat_return_s)
    cluster = snapshot.cluster
    stmt = select(Node.name, Node.heartbeats_since).where(
        Node.cluster == cluster,
        Node.state == NodeState.DRAINED,
        Node.heartbeats_since <= return_after,
        # Still beating: a streak restarts only at the next beat after a gap.
        Node.last_heartbeat_at >= now - timedelta(seconds=settings.heartbeat_suspect_s),
    )
    if names is not None:
        stmt = stmt.where(Node.name.in_(names))
    rows = session.execute(stmt.order_by(Node.name))
    back = {name: since for name, since in rows if since is not None}  # never None here
    if not back:
        return []
    newest = {
        incident.node_name: incident
        for incident in session.scalars(
            select(Incident)
            .where(Incident.cluster == cluster, Incident.node_name.in_(back))
            .order_by(Incident.node_name, Incident.id.desc())
            .ext(distinct_on(Incident.node_name))
        )
    }
    due = []
    for name, since in back.items():
        incident, seen = newest.get(name), snapshot.nodes.get(name)
        held = why_held(session, cluster, name, incident, seen)
        if held is not None:
            log.debug("%s: heartbeats back, held drained: %s", name, held)
            continue
        assert incident is not None and seen is not None  # why_held says so
        due.append(
            Return(name, (now - since).total_seconds(), "DRAIN" in seen.state, incident.message)
        )
    return due


def why_held(
    session: Session, cluster: str, name: str, incident: Incident | None, seen: SlurmNode | None
) -> Held | None:
    """What keeps `cluster`'s DRAINED node `name` out although its agent is back, or None:
    `incident` is the node's newest, `seen` what Slurm says of it this tick."""
    if incident is None or incident.signal != HEARTBEAT_LOST or incident.drained_at is None:
        return Held.OTHER_DRAIN
    if incident.attempt_ended_at is None:
        return Held.RECOVERING
    if other_cause_since(session, cluster, name, incident.signal_at):
        return Held.OTHER_CAUSE
    if seen is None or is_down(seen.state):
        return Held.SLURM_DOWN
    if not drained_by_runyard(seen.reason):
        return Held.FOREIGN_DRAIN
    return None


def other_cause_since(session: Session, cluster: str, node: str, since: datetime) -> bool:
    """Whether anything but the silence was recorded against `cluster`'s `node` from
    `since` (its last heartbeat before the silence) on: another incident, a fault its agent
    reported (an event it sent late from its outbox included), or an admin's drain."""
    incident = select(Incident.id).where(
        Incident.cluster == cluster,
        Incident.node_name == node,
        Incident.signal != HEARTBEAT_LOST,
        Incident.detected_at >= since,
    )
    event = select(NodeEvent.id).where(
        NodeEvent.cluster == cluster,
        NodeEvent.node_name == node,
        NodeEvent.created_at >= since,
        or_(
            and_(NodeEvent.action.is_not(None), NodeEvent.action != RecoveryAction.OBSERVE.value),
            NodeEvent.kind == ADMIN_DRAIN_EVENT,
        ),
    )
    return bool(session.scalar(select(or_(exists(incident), exists(event)))))
