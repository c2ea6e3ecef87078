"""All SQL about nodes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    DateTime,
    Integer,
    String,
    Table,
    Text,
    bindparam,
    case,
    column,
    func,
    or_,
    select,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert
from sqlalchemy.orm import Session
from sqlalchemy.types import TypeEngine

from service.models import Node, NodeEvent


def list_nodes(session: Session, cluster: str | None = None) -> Sequence[Node]:
    """Every node, or every node of `cluster`, by cluster then name."""
    stmt = select(Node).order_by(Node.cluster, Node.name)
    if cluster is not None:
        stmt = stmt.where(Node.cluster == cluster)
    return session.scalars(stmt).all()


# What Slurm says of a node: (slurm_state, slurm_reason, addr, num_gpus, switch).
SlurmView = tuple[str, str, str, int, str | None]


def slurm_views(session: Session, cluster: str, names: Sequence[str]) -> dict[str, SlurmView]:
    """Slurm's side of `cluster`'s named nodes, as plain tuples (no ORM objects to build)."""
    stmt = select(
        Node.name, Node.slurm_state, Node.slurm_reason, Node.addr, Node.num_gpus, Node.switch
    ).where(Node.cluster == cluster, Node.name.in_(names))
    return {
        row.name: (row.slurm_state, row.slurm_reason, row.addr, row.num_gpus, row.switch)
        for row in session.execute(stmt)
    }


def get_nodes(session: Session, cluster: str, names: Sequence[str]) -> Sequence[Node]:
    """`cluster`'s nodes of these names, by name."""
    if not names:
        return []
    stmt = select(Node).where(Node.cluster == cluster, Node.name.in_(names))
    return session.scalars(stmt.order_by(Node.name)).all()


def get_node(session: Session, cluster: str, name: str, *, for_update: bool = False) -> Node | None:
    stmt = select(Node).where(Node.cluster == cluster, Node.name == name)
    if for_update:
        stmt = stmt.with_for_update()
    return session.scalars(stmt).one_or_none()


# Built once: the hot paths below run hundreds of times a second, and building a statement
# (and its cache key) on every call cost as much CPU as the round trip to Postgres. Core
# tables, not ORM entities: there are no loaded objects to synchronize.
_nodes = cast(Table, Node.__table__)
_node_events = cast(Table, NodeEvent.__table__)

_now = bindparam("now", type_=DateTime(timezone=True))
# A beat more than the gap after the one before it starts a new streak (Node.heartbeats_since):
# Postgres evaluates every SET expression on the row as it was, so this reads the previous
# beat. A beat refused while Postgres was down is a gap too: the safe side, since the streak
# decides when a drained node comes back (service/recovery/heartbeat_return.py).
_STREAK_SINCE = case(
    (
        or_(
            _nodes.c.heartbeats_since.is_(None),
            _nodes.c.last_heartbeat_at.is_(None),
            _nodes.c.last_heartbeat_at < bindparam("gap_before", type_=DateTime(timezone=True)),
        ),
        _now,
    ),
    else_=_nodes.c.heartbeats_since,
)

_TOUCH_HEARTBEAT = (
    update(_nodes)
    .where(_nodes.c.cluster == bindparam("on_cluster"), _nodes.c.name == bindparam("node_name"))
    .values(last_heartbeat_at=_now, heartbeats_since=_STREAK_SINCE)
    .returning(_nodes.c.name)
)


def touch_heartbeat(
    session: Session, cluster: str, name: str, now: datetime, max_gap: timedelta
) -> bool:
    """One UPDATE; False when `cluster` has no such node. A beat more than `max_gap` after
    the previous one starts a new streak."""
    params = {"on_cluster": cluster, "node_name": name, "now": now, "gap_before": now - max_gap}
    return session.execute(_TOUCH_HEARTBEAT, params).first() is not None


# The rows are locked in name order first, the order of every other multi-row locker
# (the reconciler's FOR UPDATE ... ORDER BY name), so two of them cannot deadlock.
_TOUCH_HEARTBEATS = (
    update(_nodes)
    .where(
        _nodes.c.name.in_(
            select(_nodes.c.name)
            .where(
                _nodes.c.cluster == bindparam("on_cluster"),
                _nodes.c.name == func.any(bindparam("node_names", type_=ARRAY(String))),
            )
            .order_by(_nodes.c.name)
            .with_for_update()
        ),
        _nodes.c.cluster == bindparam("on_cluster"),
    )
    .values(last_heartbeat_at=_now, heartbeats_since=_STREAK_SINCE)
    .returning(_nodes.c.name)
)


def touch_heartbeats(
    session: Session, cluster: str, names: Sequence[str], now: datetime, max_gap: timedelta
) -> set[str]:
    """One UPDATE for many nodes of `cluster`; returns the names that exist (streaks as
    touch_heartbeat)."""
    params = {
        "on_cluster": cluster,
        "node_names": list(names),
        "now": now,
        "gap_before": now - max_gap,
    }
    return set(session.scalars(_TOUCH_HEARTBEATS, params))


# INSERT ... SELECT FROM jsonb_to_recordset(one JSON document) ON CONFLICT DO NOTHING: one
# statement whatever the batch size, so SQLAlchemy compiles it once (a multi-row VALUES
# list was compiled afresh for every batch, about 25 ms of CPU per 100 events), and one
# parameter that json.dumps writes in C (seven array parameters cost psycopg a millisecond
# of Python per batch to adapt).
_EVENT_COLUMNS: dict[str, TypeEngine[Any]] = {
    "kind": Text(),
    "code": Integer(),
    "message": Text(),
    "data": JSONB(),
    "idempotency_key": Text(),
    "action": Text(),
    "observed_at": DateTime(timezone=True),
}
_event_rows = (
    func.jsonb_to_recordset(sql_cast(bindparam("events", type_=Text), JSONB))
    .table_valued(*(column(name, type_) for name, type_ in _EVENT_COLUMNS.items()))
    .render_derived(with_types=True)
)
_INSERT_NODE_EVENTS = (
    insert(_node_events)
    .from_select(
        [
            _node_events.c.cluster,
            _node_events.c.node_name,
            *(_node_events.c[name] for name in _EVENT_COLUMNS),
            _node_events.c.created_at,
        ],
        select(
            bindparam("on_cluster", type_=String),
            bindparam("node_name", type_=String),
            *(_event_rows.c[name] for name in _EVENT_COLUMNS),
            bindparam("created_at", type_=DateTime(timezone=True)),
        ),
    )
    .on_conflict_do_nothing(index_elements=["idempotency_key"])
    .returning(_node_events.c.idempotency_key)
)


def insert_node_events(
    session: Session,
    cluster: str,
    node_name: str,
    created_at: datetime,
    rows: Sequence[dict[str, Any]],
) -> set[str]:
    """Store a batch of one node's events; returns the idempotency keys that were new.

    `rows` hold the columns of _EVENT_COLUMNS (observed_at a datetime or None).
    """
    events = json.dumps(rows, default=datetime.isoformat)
    params: dict[str, Any] = {"events": events, "on_cluster": cluster, "node_name": node_name}
    params["created_at"] = created_at
    return set(session.scalars(_INSERT_NODE_EVENTS, params).all())
