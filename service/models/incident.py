"""Incidents: one per failure signal that runyard acted on, with the recovery's timestamps."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import DateTime, Enum, ForeignKey, Integer, String, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, Timestamped, utcnow


class RecoveryPath(StrEnum):
    """How the service recovers a run from a failure."""

    # Only the failed replica group's job is resubmitted; the others keep stepping.
    FAST = "fast"
    # The whole run stops and restarts from its last committed disk checkpoint.
    CLASSIC = "classic"


class ClassicBecause(StrEnum):
    """Why the fast path cannot handle a failure (stored on the incident)."""

    # The run has a single replica group: there is no peer to keep stepping or to heal from.
    NO_REPLICAS = "no_replicas"
    # Every replica group lost a node at once: no live copy of the state is left to heal
    # from, so the state must come from disk.
    ALL_COPIES_LOST = "all_copies_lost"
    # Some groups survive, but fewer than the run requires to keep stepping (the quorum's
    # minimum size, torchft's min_replica_size).
    TOO_FEW_HEALTHY_GROUPS = "too_few_healthy_groups"
    # The failure is not confined to replica groups: the lighthouse that holds the quorum
    # is gone, so no group can step until it is restarted with the run.
    LIGHTHOUSE_LOST = "lighthouse_lost"
    # The service found a fast recovery it had started but cannot finish it: the surviving
    # groups stopped while it was down (no live peer any more). A fast recovery whose
    # survivors still step is resumed, not demoted: see service/recovery/fast_path.py.
    SURVIVORS_STOPPED_DURING_SERVICE_RESTART = "survivors_stopped_during_service_restart"
    # The groups' copies disagreed (silent data corruption: every group compares with the
    # others and all stop): no copy is trusted to heal from, the run rolls back from disk.
    ROLLBACK = "rollback"


class RecoveryAction(StrEnum):
    """What a classified signal asks for (the classification table maps signals to these)."""

    DRAIN_AND_MOVE = "DRAIN_AND_MOVE"  # the node is bad: drain it, move its runs to spares
    RESTART_SAME_NODES = "RESTART_SAME_NODES"  # transient: restart the run where it was
    COUNT_AND_ESCALATE = "COUNT_AND_ESCALATE"  # likely the application: count, drain on repeats
    RESTART = "RESTART"  # a rank died or hung: restart, keep the node
    OBSERVE = "OBSERVE"  # record only
    # The run's cluster cannot run it: continue on another cluster (reconcile/failover.py).
    FAIL_OVER = "FAIL_OVER"


class IncidentState(StrEnum):
    OPEN = "OPEN"  # recovery not finished
    RESOLVED = "RESOLVED"  # the touched runs resumed (or there was nothing to move)
    WAITING = "WAITING"  # no spare: the run waits for capacity


def _enum(cls: type[StrEnum], name: str) -> Enum:
    return Enum(cls, name=name, native_enum=False, length=24, validate_strings=True)


class Incident(Timestamped, Base):
    __tablename__ = "incidents"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))  # xid, sxid, nccl, heartbeat, slurm, hang...
    signal: Mapped[str] = mapped_column(String(64))  # e.g. "xid:79"
    action: Mapped[RecoveryAction] = mapped_column(_enum(RecoveryAction, "recovery_action"))
    state: Mapped[IncidentState] = mapped_column(_enum(IncidentState, "incident_state"), index=True)
    message: Mapped[str] = mapped_column(Text)
    cluster: Mapped[str] = mapped_column(String(64))  # the node's (or the run's) cluster
    node_name: Mapped[str | None] = mapped_column(String(64), index=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id", ondelete="SET NULL"))
    spare_node: Mapped[str | None] = mapped_column(String(64))
    resume_step: Mapped[int | None] = mapped_column(Integer)
    details: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    # Which path recovered the run (recovery/paths.py), and why not the fast one.
    recovery_path: Mapped[RecoveryPath | None] = mapped_column(
        Enum(
            RecoveryPath,
            name="recovery_path",
            native_enum=False,
            length=16,
            values_callable=lambda c: [m.value for m in c],
        )
    )
    classic_because: Mapped[ClassicBecause | None] = mapped_column(
        Enum(
            ClassicBecause,
            name="classic_because",
            native_enum=False,
            length=48,
            values_callable=lambda c: [m.value for m in c],
        )
    )
    # The recovery's timeline: each stamp is written once, when that phase is done.
    signal_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    detected_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    drained_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    attempt_ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    submitted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    running_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    first_step_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    resolved_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ClusterSetting(Base):
    """Operator-tuned values that must survive restarts (e.g. the spare pool's target)."""

    __tablename__ = "cluster_settings"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[Any] = mapped_column(JSONB)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )
