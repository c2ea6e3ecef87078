"""Compute nodes as runyard sees them, and everything that happened to them."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Enum,
    Float,
    ForeignKeyConstraint,
    Integer,
    String,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, Timestamped, utcnow


class NodeState(StrEnum):
    HEALTHY = "HEALTHY"
    SUSPECT = "SUSPECT"
    DRAINING = "DRAINING"
    DRAINED = "DRAINED"
    SPARE = "SPARE"
    IN_REPAIR = "IN_REPAIR"


class Node(Timestamped, Base):
    """A node is (cluster, name), as Slurm keeps it: two clusters may both have a gpu001
    (each slurmctld names its own nodes), so a name alone never identifies one."""

    __tablename__ = "nodes"

    cluster: Mapped[str] = mapped_column(String(64), primary_key=True)  # Slurm's ClusterName
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    state: Mapped[NodeState] = mapped_column(
        Enum(NodeState, name="node_state", native_enum=False, length=16, validate_strings=True)
    )
    state_reason: Mapped[str] = mapped_column(Text, default="")
    slurm_state: Mapped[str] = mapped_column(String(64), default="")
    slurm_reason: Mapped[str] = mapped_column(Text, default="")
    addr: Mapped[str] = mapped_column(String(255), default="")
    switch: Mapped[str | None] = mapped_column(String(64))
    num_gpus: Mapped[int] = mapped_column(Integer, default=0)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The first heartbeat of the agent's current unbroken run of them (no gap longer than
    # heartbeat_suspect_s), kept by the heartbeat's own UPDATE (nodes/repository.py): how
    # long an agent that came back has been healthy, for service/recovery/heartbeat_return.py.
    heartbeats_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    num_app_errors: Mapped[int] = mapped_column(
        Integer, default=0, server_default="0"
    )  # Xid 13/31/43 seen
    # Stragglers (service/nodes/stragglers.py): consecutive progress reports in which the
    # node's slowest rank was slower than its peers' median by the margin; the last such
    # ratio; and since when it is flagged SLOW (None: not flagged).
    num_slow_reports: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    slow_ratio: Mapped[float | None] = mapped_column(Float)
    slow_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class NodeEvent(Base):
    __tablename__ = "node_events"
    __table_args__ = (
        ForeignKeyConstraint(
            ["cluster", "node_name"], ["nodes.cluster", "nodes.name"], ondelete="CASCADE"
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(64))
    node_name: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    # Set by agents so a re-delivered event is stored once.
    idempotency_key: Mapped[str | None] = mapped_column(String(128), unique=True)
    code: Mapped[int | None] = mapped_column(Integer)  # Xid / SXid number
    action: Mapped[str | None] = mapped_column(String(24))  # what classification decided
    observed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
