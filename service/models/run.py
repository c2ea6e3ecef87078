"""Runs, their attempts (one per Slurm allocation), checkpoints, metrics and timeline."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Enum,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import Mapped, mapped_column, relationship

from contract import StopReason
from service.models.base import Base, Timestamped, utcnow


class RunState(StrEnum):
    PENDING = "PENDING"  # accepted; waiting for an attempt to be submitted or to start
    RUNNING = "RUNNING"
    CANCELLING = "CANCELLING"  # cancel asked; the Slurm job is being stopped
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED)


class AttemptState(StrEnum):
    SUBMITTING = "SUBMITTING"  # recorded before sbatch, so a crash mid-submit is recoverable
    PENDING = "PENDING"  # in the Slurm queue
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    # Stopped on purpose at a committed checkpoint: preempted, or its segment's time limit.
    STOPPED = "STOPPED"

    @property
    def is_terminal(self) -> bool:
        return self in (
            AttemptState.SUCCEEDED,
            AttemptState.FAILED,
            AttemptState.CANCELLED,
            AttemptState.STOPPED,
        )


class CheckpointState(StrEnum):
    WRITING = "WRITING"
    COMMITTED = "COMMITTED"  # every rank finished and the marker is on disk: safe to load
    DELETED = "DELETED"  # pruned after newer ones were committed
    # Its files failed their checksums (at commit or at load): never loaded again, never
    # the newest, and it does not count among the kept ones (service/recovery/checkpoints.py).
    CORRUPT = "CORRUPT"


def _enum(cls: type[StrEnum], name: str) -> Enum:
    return Enum(cls, name=name, native_enum=False, length=16, validate_strings=True)


# Stored by value ("preempted"), the form the API shows, and checked by the database.
STOP_REASON_TYPE = Enum(
    StopReason,
    name="stop_reason",
    native_enum=False,
    length=24,
    create_constraint=True,
    validate_strings=True,
    values_callable=lambda cls: [member.value for member in cls],
)


class Run(Timestamped, Base):
    __tablename__ = "runs"
    __table_args__ = (UniqueConstraint("sweep_id", "sweep_index"),)  # one run per grid point

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    owner: Mapped[str] = mapped_column(String(64), default="", server_default="")
    team: Mapped[str] = mapped_column(String(64), default="", server_default="", index=True)
    # Who its jobs run as and are charged to, fixed at submission (service/identity/): a
    # later re-link applies to new runs, never to the attempts of one already accepted.
    unix_user: Mapped[str] = mapped_column(String(64), default="", server_default="")
    slurm_account: Mapped[str] = mapped_column(String(64), default="", server_default="")
    priority: Mapped[str] = mapped_column(String(16), default="research", server_default="research")
    state: Mapped[RunState] = mapped_column(_enum(RunState, "run_state"), index=True)
    state_reason: Mapped[str] = mapped_column(Text, default="")
    spec: Mapped[dict[str, Any]] = mapped_column(JSONB)  # as the user submitted it
    config: Mapped[dict[str, Any]] = mapped_column(JSONB)  # resolved (planner output)
    num_nodes: Mapped[int] = mapped_column(Integer)
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    max_restarts: Mapped[int] = mapped_column(Integer)
    num_restarts: Mapped[int] = mapped_column(Integer, default=0)  # all automatic restarts
    # Restarts caused by hardware (a drained node): they do not use up max_restarts.
    num_hardware_restarts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    total_steps: Mapped[int] = mapped_column(Integer)
    last_step: Mapped[int | None] = mapped_column(Integer)
    last_loss: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    final_step: Mapped[int | None] = mapped_column(Integer)  # reported by the worker at the end
    min_nodes: Mapped[int | None] = mapped_column(Integer)  # may shrink to this without spares
    # The cluster the run is on (Slurm's ClusterName): its reservation and the nodes it
    # holds are that cluster's; each attempt records where it was submitted.
    cluster: Mapped[str] = mapped_column(String(64), index=True)
    # The nodes the run holds across attempts (through its own Slurm reservation).
    nodes: Mapped[list[str]] = mapped_column(ARRAY(String(64)), default=list, server_default="{}")
    reservation: Mapped[str | None] = mapped_column(String(128))
    last_progress_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A sweep member's first attempt is one task of the sweep's job array (reconcile/sweeps.py).
    sweep_id: Mapped[int | None] = mapped_column(
        ForeignKey("sweeps.id", ondelete="CASCADE"), index=True
    )
    sweep_index: Mapped[int | None] = mapped_column(Integer)
    sweep_params: Mapped[dict[str, Any] | None] = mapped_column(JSONB)  # its grid point
    # Replica-group runs (spec.fault_tolerance): the torchft lighthouse the service started
    # for the run, and its process id on the service host (recovery/lighthouse.py).
    lighthouse_addr: Mapped[str | None] = mapped_column(String(128))
    lighthouse_pid: Mapped[int | None] = mapped_column(Integer)

    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="run",
        lazy="raise",
        order_by="Attempt.number",
        foreign_keys="Attempt.run_id",
    )


class Attempt(Timestamped, Base):
    __tablename__ = "attempts"
    __table_args__ = (
        UniqueConstraint("run_id", "number"),
        CheckConstraint(
            "stopped_for_run_id IS NULL OR stop_reason = 'preempted'",
            name="stopped_for_run_only_when_preempted",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    state: Mapped[AttemptState] = mapped_column(_enum(AttemptState, "attempt_state"), index=True)
    slurm_job_id: Mapped[str | None] = mapped_column(String(32), index=True)
    job_name: Mapped[str] = mapped_column(String(128))
    job_folder: Mapped[str] = mapped_column(Text)
    # Where its job was submitted: job ids and node names are per cluster in Slurm.
    cluster: Mapped[str] = mapped_column(String(64), index=True)
    node_list: Mapped[str | None] = mapped_column(Text)  # Slurm's compressed form
    nodes: Mapped[list[str]] = mapped_column(ARRAY(String(64)), default=list)
    resume_step: Mapped[int | None] = mapped_column(Integer)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    end_reason: Mapped[str | None] = mapped_column(Text)
    submitted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    first_step: Mapped[int | None] = mapped_column(Integer)  # first step this attempt trained
    # Why it stopped. Set with stop_requested_at before the service asks the ranks to stop
    # (PREEMPTED, TIME_LIMIT), so the clean exit that follows is read as a yield; set to the
    # cause when the attempt ends otherwise. end_reason is the same for people, in words.
    stop_reason: Mapped[StopReason | None] = mapped_column(STOP_REASON_TYPE)
    # The run a preemption made room for (only with stop_reason PREEMPTED).
    stopped_for_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("runs.id", ondelete="SET NULL")
    )
    stop_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A rank reported ExitCode.DO_NOT_RETRY: when the job ends the run fails instead of
    # retrying. Not an exit code: the job may still be running when it is set.
    do_not_retry: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    first_step_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Progress summary, updated with every progress report in the same transaction
    # (workers/service.py), so goodput reads attempts instead of every metric row.
    last_step: Mapped[int | None] = mapped_column(Integer)  # highest step reported
    last_progress_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Replica-group runs: the group this attempt's job trains (None: the whole run).
    replica_group: Mapped[int | None] = mapped_column(Integer)
    # A replacement for one failed group: it heals from a live group and never trains alone
    # from scratch. False for every group of a start or a restart from disk, which start
    # together from the same step (the newest trusted checkpoint, or 0) with no peer ahead.
    heals_from_peer: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    run: Mapped[Run] = relationship(back_populates="attempts", lazy="raise", foreign_keys=[run_id])


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("run_id", "step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    state: Mapped[CheckpointState] = mapped_column(_enum(CheckpointState, "checkpoint_state"))
    num_bytes: Mapped[int | None] = mapped_column(BigInteger)
    write_s: Mapped[float | None] = mapped_column(Float)
    # What the save cost training: its blocking time plus how much slower the steps beside
    # it ran (worker/checkpoint_cost.py); the run's checkpoint badput. None: an older worker.
    stall_s: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    committed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Set when it was found CORRUPT: which file failed and how, when, and by which attempt
    # (at commit: the attempt that wrote it; at load: the one that tried to resume from it).
    corrupt_reason: Mapped[str | None] = mapped_column(Text)
    corrupt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    corrupt_attempt_id: Mapped[int | None] = mapped_column(
        ForeignKey("attempts.id", ondelete="SET NULL")
    )


class Metric(Base):
    """One optimizer step as rank 0 reported it."""

    __tablename__ = "metrics"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    attempt_id: Mapped[int] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    step: Mapped[int] = mapped_column(Integer)
    loss: Mapped[float] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    step_time_s: Mapped[float | None] = mapped_column(Float)
    lr: Mapped[float | None] = mapped_column(Float)  # the learning rate the step used
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RunEvent(Base):
    """The run's timeline: every state change and what caused it."""

    __tablename__ = "run_events"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
