"""Carry out open incidents, one phase at a time, each phase's outcome committed before the
next Slurm call. Safe to kill anywhere: every phase checks what is already done.

A node to drain goes to move_to_spare.py; a hang or a transient error restarts the run
where it was (restart_in_place)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import selectinload

from contract import StopReason
from service.config import Settings
from service.db import session_scope
from service.identity.service import owner_of
from service.models import Attempt, Incident, IncidentState, RecoveryAction, Run
from service.models.base import utcnow
from service.observability import metrics
from service.observability.logging import log_context
from service.recovery import hangs
from service.recovery.move_to_spare import RUNS_TO_MOVE, drain_and_move
from service.recovery.restart import end_attempt_and_restart
from service.recovery.signals import OPEN_STATES
from service.runs import repository as runs_repo
from service.slurm.client import SlurmClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Todo:
    id: int
    action: RecoveryAction
    node: str | None
    run_id: int | None
    drained: bool
    message: str


def process_incidents(settings: Settings, slurm: SlurmClient) -> None:
    """Carry out every open incident whose attempt has not been ended yet."""
    with session_scope() as session:
        todo = [
            _Todo(i.id, i.action, i.node_name, i.run_id, i.drained_at is not None, i.message)
            for i in session.scalars(
                select(Incident)
                .where(Incident.cluster == slurm.cluster_name)  # this client's cluster only
                .where(Incident.state.in_(OPEN_STATES))
                .where(Incident.attempt_ended_at.is_(None))
                .order_by(Incident.id)
            ).all()
        ]
    for item in todo:
        with log_context(incident_id=item.id, node=item.node, run_id=item.run_id):
            try:
                if item.action == RecoveryAction.DRAIN_AND_MOVE:
                    assert item.node is not None
                    drain_and_move(
                        slurm, item.id, item.node, drained=item.drained, message=item.message
                    )
                elif item.action in (RecoveryAction.RESTART, RecoveryAction.RESTART_SAME_NODES):
                    restart_in_place(item, slurm)
            except Exception:  # a Slurm call that failed, or anything else: retried next
                # tick, without holding up the incidents behind it (taken in id order)
                log.exception("incident %s failed; retrying next tick", item.id)


def _about_another_attempt(incident: Incident, attempt: Attempt) -> bool:
    """Whether the signal concerned an attempt before `attempt`, the run's live one: one
    the incident names, or a node's signal observed before `attempt` was submitted (an
    agent's outbox delivers late after an outage). Restarting would end a healthy attempt
    and charge it a restart."""
    if incident.attempt_id is not None:
        return incident.attempt_id != attempt.id
    return attempt.submitted_at is not None and incident.signal_at < attempt.submitted_at


def restart_in_place(item: _Todo, slurm: SlurmClient) -> None:
    """A hang or a transient error: restart where the run was (stacks collected for hangs)."""
    stacks = None
    with session_scope() as session:
        incident = session.get(Incident, item.id)
        assert incident is not None
        run = runs_repo.get_run(session, item.run_id) if item.run_id else None
        if run is None and item.node:
            run = session.scalars(
                select(Run)
                .where(Run.cluster == slurm.cluster_name, Run.state.in_(RUNS_TO_MOVE))
                .where(Run.nodes.contains([item.node]))
                .options(selectinload(Run.attempts))  # Run.attempts is lazy="raise"
            ).first()
        attempt = runs_repo.live_attempt(run) if run else None
        if attempt is not None and _about_another_attempt(incident, attempt):
            attempt = None  # nothing to restart: the run has moved on since
        target = (
            (run.id, attempt.id, attempt.slurm_job_id, len(attempt.nodes))
            if (run and attempt)
            else None
        )
        owner = owner_of(run) if run else None
    if target and incident.kind == "hang" and target[2] and owner:
        stacks = hangs.collect_stacks(slurm, owner, target[2], target[1], target[3])
    with session_scope() as session:
        locked = runs_repo.lock_run_and_attempt(session, target[1]) if target else None
        incident = session.get(Incident, item.id, with_for_update=True)  # after the run
        assert incident is not None
        if stacks:
            incident.details = {**incident.details, "stacks": stacks[-20000:]}
        incident.attempt_ended_at = utcnow()
        metrics.observe_incident(incident, "stop")
        if target is None or locked is None:
            incident.state, incident.resolved_at = IncidentState.RESOLVED, utcnow()
            return
        run, attempt = locked
        incident.run_id, incident.attempt_id = run.id, attempt.id
        if not end_attempt_and_restart(
            session, run, attempt, incident.message, cause=StopReason.RECOVERY_RESTART
        ):
            incident.state, incident.resolved_at = IncidentState.RESOLVED, utcnow()
    if target[2] and owner is not None:
        slurm.cancel({target[2]: owner.unix_user})
