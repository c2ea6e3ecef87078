"""Carry out open incidents, one phase at a time, each phase's outcome committed before the
next Slurm call. Safe to kill anywhere: every phase checks what is already done."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from contract import StopReason
from service.config import Settings
from service.db import session_scope
from service.models import Incident, IncidentState, NodeState, RecoveryAction, Run, RunState
from service.models.base import utcnow
from service.nodes import repository as nodes_repo
from service.nodes.lifecycle import node_event, set_node_state
from service.observability import metrics
from service.observability.logging import log_context
from service.recovery import hangs
from service.recovery.restart import end_attempt_and_restart
from service.recovery.signals import OPEN_STATES
from service.recovery.spares import spare_nodes
from service.runs import repository as runs_repo
from service.runs.lifecycle import record_event
from service.slurm import commands
from service.slurm.placement import choose_replacement

log = logging.getLogger(__name__)
ACTIVE = (RunState.PENDING, RunState.RUNNING)


@dataclass(frozen=True)
class _Todo:
    id: int
    action: RecoveryAction
    node: str | None
    run_id: int | None
    drained: bool
    message: str


def process_incidents(settings: Settings) -> None:
    with session_scope() as session:
        todo = [
            _Todo(i.id, i.action, i.node_name, i.run_id, i.drained_at is not None, i.message)
            for i in session.scalars(
                select(Incident)
                .where(Incident.state.in_(OPEN_STATES))
                .where(Incident.attempt_ended_at.is_(None))
                .order_by(Incident.id)
            ).all()
        ]
    for item in todo:
        with log_context(incident_id=item.id, node=item.node, run_id=item.run_id):
            try:
                if item.action == RecoveryAction.DRAIN_AND_MOVE:
                    _drain_and_move(item)
                elif item.action in (RecoveryAction.RESTART, RecoveryAction.RESTART_SAME_NODES):
                    _restart(item)
            except commands.SlurmError:
                log.exception("incident %s: Slurm call failed; retrying next tick", item.id)


def _drain_and_move(item: _Todo) -> None:
    assert item.node is not None
    if not item.drained:
        commands.drain_node(item.node, item.message)
        with session_scope() as session:
            incident = session.get(Incident, item.id, with_for_update=True)
            node = nodes_repo.get_node(session, item.node, for_update=True)
            assert incident is not None
            incident.drained_at = utcnow()
            metrics.observe_incident(incident, "drain")
            if node is not None and node.state != NodeState.DRAINED:
                if node.state != NodeState.DRAINING:
                    set_node_state(session, node, NodeState.DRAINING, item.message)
                set_node_state(session, node, NodeState.DRAINED, item.message)
    jobs = []
    with session_scope() as session:
        # Runs first, then the incident: the lock order of every other writer (the workers'
        # reports lock a run, then its attempt, then the incidents that moved it).
        runs = session.scalars(
            select(Run)
            .where(Run.state.in_(ACTIVE))
            .where(Run.nodes.contains([item.node]))
            .order_by(Run.id)
            .with_for_update()
        ).all()
        incident = session.get(Incident, item.id, with_for_update=True)
        assert incident is not None
        for run in runs:
            jobs += _move_run(session, run, incident, item.node)
        incident.attempt_ended_at = utcnow()
        metrics.observe_incident(incident, "stop")
        if not runs:
            incident.state, incident.resolved_at = IncidentState.RESOLVED, utcnow()
    for job in jobs:
        commands.scancel(job)


def _move_run(session: Session, run: Run, incident: Incident, bad: str) -> list[str]:
    """End the run's attempt and swap the bad node for a spare (same leaf switch first)."""
    run = runs_repo.get_run(session, run.id) or run
    incident.run_id = incident.run_id or run.id
    attempt = runs_repo.live_attempt(run)
    jobs = [attempt.slurm_job_id] if attempt and attempt.slurm_job_id else []
    if attempt is not None:
        incident.attempt_id = attempt.id
        end_attempt_and_restart(
            session,
            run,
            attempt,
            f"node {bad} failed: {incident.signal}",
            cause=StopReason.NODE_FAILURE,
        )
    remaining = [n for n in run.nodes if n != bad]
    nodes = {n.name: n for n in (nodes_repo.get_node(session, x) for x in remaining) if n}
    switches = {n.switch for n in nodes.values()}
    spares = spare_nodes(session, for_update=True)
    pick = choose_replacement([(s.name, s.switch) for s in spares], switches)
    if pick is not None:
        spare = next(s for s in spares if s.name == pick)
        set_node_state(session, spare, NodeState.HEALTHY, f"spare taken by run {run.id}")
        node_event(session, spare, "spare.assigned", f"replaces {bad} in run {run.id}")
        run.nodes = [pick if n == bad else n for n in run.nodes]
        incident.spare_node = pick
        record_event(
            session,
            run,
            "recovery.spare_assigned",
            f"{bad} drained ({incident.signal}); spare {pick} takes its place",
            data={"incident": incident.id, "failed": bad, "spare": pick},
        )
    else:
        run.nodes = remaining
        incident.state = IncidentState.WAITING
        record_event(
            session,
            run,
            "recovery.no_spare",
            f"{bad} drained ({incident.signal}); no spare left: waiting for a free "
            "healthy node" + (f" or shrinking to {run.min_nodes}" if run.min_nodes else ""),
            data={"incident": incident.id, "failed": bad},
        )
    return jobs


def _restart(item: _Todo) -> None:
    """A hang or a transient error: restart where the run was (stacks collected for hangs)."""
    stacks = None
    with session_scope() as session:
        incident = session.get(Incident, item.id)
        assert incident is not None
        run = runs_repo.get_run(session, item.run_id) if item.run_id else None
        if run is None and item.node:
            run = session.scalars(
                select(Run).where(Run.state.in_(ACTIVE)).where(Run.nodes.contains([item.node]))
            ).first()
        attempt = runs_repo.live_attempt(run) if run else None
        target = (
            (run.id, attempt.id, attempt.slurm_job_id, len(attempt.nodes))
            if (run and attempt)
            else None
        )
    if target and incident.kind == "hang" and target[2]:
        stacks = hangs.collect_stacks(target[2], target[1], target[3])
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
    if target[2]:
        commands.scancel(target[2])
