"""Keep the nodes table in step with Slurm and the health agents; admin resume."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings, get_settings
from service.errors import Conflict, NotFound
from service.models import Node, NodeEvent, NodeState
from service.models.base import utcnow
from service.nodes import repository
from service.nodes.node_state_machine import (
    drained_by_runyard,
    node_event,
    set_node_state,
)
from service.slurm.commands import SlurmNode


def sync_from_slurm(
    session: Session, cluster: str, nodes: list[SlurmNode], switches: dict[str, str]
) -> None:
    """Upsert what `cluster`'s `scontrol show node` says; runyard's own state is left to
    its owners.

    Compares plain columns first and loads (and writes) only the nodes whose Slurm view
    changed: this runs every tick, and loading 1,280 ORM objects each second to find a
    handful of changes was most of the reconciler's CPU on a large cluster.
    """
    by_name = {sn.name: sn for sn in nodes}
    known = repository.slurm_views(session, cluster, list(by_name))

    def view(sn: SlurmNode, switch: str | None) -> repository.SlurmView:
        return (sn.state, sn.reason, sn.addr, sn.num_gpus, switches.get(sn.name, switch))

    changed = [
        name
        for name, sn in by_name.items()
        if name in known and view(sn, known[name][4]) != known[name]
    ]
    for node in repository.get_nodes(session, cluster, changed):
        sn = by_name[node.name]
        node.slurm_state, node.slurm_reason = sn.state, sn.reason
        node.addr, node.num_gpus = sn.addr, sn.num_gpus
        node.switch = switches.get(sn.name, node.switch)
    for name in sorted(by_name.keys() - known.keys()):
        sn = by_name[name]
        session.add(
            Node(
                cluster=cluster,
                name=name,
                state=NodeState.HEALTHY,
                state_reason="registered by Slurm",
                num_app_errors=0,
                slurm_state=sn.state,
                slurm_reason=sn.reason,
                addr=sn.addr,
                num_gpus=sn.num_gpus,
                switch=switches.get(name),
            )
        )


def require_node(session: Session, cluster: str, name: str, *, for_update: bool = False) -> Node:
    """`cluster`'s node `name`; NotFound naming both."""
    node = repository.get_node(session, cluster, name, for_update=for_update)
    if node is None:
        raise NotFound(
            f"no node named '{name}' on cluster {cluster}; "
            "`runyard node list --cluster NAME` shows a cluster's nodes"
        )
    return node


def streak_gap(settings: Settings) -> timedelta:
    """The silence between two beats that ends an agent's streak of heartbeats
    (Node.heartbeats_since): the one that makes a serving node SUSPECT."""
    return timedelta(seconds=settings.heartbeat_suspect_s)


def touch_heartbeat(session: Session, cluster: str, name: str, settings: Settings) -> bool:
    """One UPDATE, no ORM load; False when `cluster` has no such node."""
    return repository.touch_heartbeat(session, cluster, name, utcnow(), streak_gap(settings))


def touch_heartbeats(
    session: Session,
    cluster: str,
    names: list[str],
    settings: Settings | None = None,
    now: datetime | None = None,
) -> dict[str, bool]:
    """Many nodes' heartbeats in one UPDATE: for each name, whether `cluster` has such a node.
    `settings` default to the service's (the group commit passes the names only); `now`,
    to the clock (tests give agents' beats their times)."""
    gap = streak_gap(settings or get_settings())
    found = repository.touch_heartbeats(session, cluster, names, now or utcnow(), gap)
    return {name: name in found for name in names}


def touch_heartbeats_of(
    session: Session, keys: list[tuple[str, str]]
) -> dict[tuple[str, str], bool]:
    """The group commit's heartbeats, each (cluster, name): one UPDATE per cluster among
    them (one, on a site of one cluster)."""
    by_cluster: dict[str, list[str]] = {}
    for cluster, name in keys:
        by_cluster.setdefault(cluster, []).append(name)
    found: dict[tuple[str, str], bool] = {}
    for cluster, names in sorted(by_cluster.items()):
        for name, there in touch_heartbeats(session, cluster, names).items():
            found[(cluster, name)] = there
    return found


def recent_events(session: Session, cluster: str, name: str, limit: int = 100) -> list[NodeEvent]:
    stmt = (
        select(NodeEvent)
        .where(NodeEvent.cluster == cluster, NodeEvent.node_name == name)
        .order_by(NodeEvent.id.desc())
        .limit(limit)
    )
    return list(session.scalars(stmt).all())


def check_resumable(node: Node, slurm_reason: str, force: bool) -> None:
    """runyard resumes only what runyard drained, unless an admin forces it (as NHC does)."""
    if not drained_by_runyard(slurm_reason) and not force:
        raise Conflict(
            f"node {node.name} was drained by someone else ({slurm_reason!r}); "
            f"use `runyard node resume {node.name} --force` to override"
        )


def mark_resumed(session: Session, node: Node, forced: bool) -> None:
    node.num_app_errors = 0
    if node.state in (
        NodeState.DRAINING,
        NodeState.DRAINED,
        NodeState.IN_REPAIR,
        NodeState.SUSPECT,
    ):
        set_node_state(
            session,
            node,
            NodeState.HEALTHY,
            "resumed by an admin" + (" (forced)" if forced else ""),
        )
    else:
        node_event(session, node, "node.resumed", "resumed in Slurm by an admin")
