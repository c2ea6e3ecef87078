"""A failed node: drain it, and move each run on it to a hot spare.

The spare comes from the pool (recovery/spares.py), on a leaf switch the run already uses
first (slurm/node_choice.choose_replacement), so the replacement keeps the run's network
locality. With no spare left, the run keeps its healthy nodes and waits: placement
(reconcile/placement.py) then gives it a free node, or shrinks it to min_nodes.
A node failure never counts against the run's max_restarts (recovery/restart.py).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from contract import StopReason
from service.db import session_scope
from service.models import Incident, IncidentState, Node, NodeState, Run, RunState
from service.models.base import utcnow
from service.nodes import repository as nodes_repo
from service.nodes.cluster_topology import cluster_topology, group_nodes
from service.nodes.node_state_machine import node_event, set_node_state
from service.observability import metrics
from service.recovery.fast_path import move_group_to_spare, replica_groups
from service.recovery.restart import end_attempt_and_restart
from service.recovery.spares import spare_nodes
from service.runs import repository as runs_repo
from service.runs.run_state_machine import record_event
from service.slurm.client import SlurmClient
from service.slurm.node_choice import choose_replacement, replica_of

RUNS_TO_MOVE = (RunState.PENDING, RunState.RUNNING)


def drain_and_move(
    slurm: SlurmClient, incident_id: int, node: str, *, drained: bool, message: str
) -> None:
    """Drain the failed node in Slurm, then end the attempts of the runs on it and give
    each a spare; their old jobs are scancelled last. Each phase is committed before the
    next Slurm call and skipped when a previous pass already did it."""
    cluster = slurm.cluster_name  # the incident's: process_incidents takes only its own
    if not drained:
        slurm.drain(node, message)
        with session_scope() as session:
            incident = session.get(Incident, incident_id, with_for_update=True)
            bad = nodes_repo.get_node(session, cluster, node, for_update=True)
            assert incident is not None
            incident.drained_at = utcnow()
            metrics.observe_incident(incident, "drain")
            if bad is not None and bad.state != NodeState.DRAINED:
                if bad.state != NodeState.DRAINING:
                    set_node_state(session, bad, NodeState.DRAINING, message)
                set_node_state(session, bad, NodeState.DRAINED, message)
    jobs: dict[str, str] = {}  # job id -> its run owner's Unix user
    with session_scope() as session:
        # Runs first, then the incident: the lock order of every other writer (the workers'
        # reports lock a run, then its attempt, then the incidents that moved it).
        runs = session.scalars(
            select(Run)
            .where(Run.cluster == cluster, Run.state.in_(RUNS_TO_MOVE))
            .where(Run.nodes.contains([node]))
            .order_by(Run.id)
            .with_for_update()
        ).all()
        incident = session.get(Incident, incident_id, with_for_update=True)
        assert incident is not None
        for run in runs:
            jobs |= dict.fromkeys(move_run_to_spare(session, run, incident, node), run.unix_user)
        incident.attempt_ended_at = utcnow()
        metrics.observe_incident(incident, "stop")
        if not runs:
            incident.state, incident.resolved_at = IncidentState.RESOLVED, utcnow()
    if jobs:
        slurm.cancel(jobs)


def move_run_to_spare(session: Session, run: Run, incident: Incident, bad: str) -> list[str]:
    """End the run's attempt and swap the bad node for a spare (same leaf switch first)."""
    run = runs_repo.get_run(session, run.id) or run
    if replica_groups(run) > 1:  # replica groups: the fast path when it can
        return move_group_to_spare(session, run, incident, bad)
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
    nodes = {n.name: n for n in nodes_repo.get_nodes(session, run.cluster, remaining)}
    switches = {n.switch for n in nodes.values()}
    spares = spare_nodes(session, run.cluster, for_update=True)
    topology = cluster_topology(session, run.cluster)
    group = group_nodes(topology, run.config["layout"], run.num_nodes, run.gpus_per_node)
    if group > 1:
        return _move_replica_on_blocks(session, run, incident, bad, group, spares, jobs)
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


def _move_replica_on_blocks(
    session: Session,
    run: Run,
    incident: Incident,
    bad: str,
    group: int,
    spares: list[Node],
    jobs: list[str],
) -> list[str]:
    """topology/block: the failed node's model replica must stay inside one block. A spare
    in that block takes the failed node's place; without one, the replica's healthy nodes
    are let go with it and the run waits for placement to give it `group` nodes in one
    block with room (free nodes first, then spares: reconcile/placement.nodes_for_run)."""
    replica = replica_of(run.nodes, bad, group)
    failed = nodes_repo.get_node(session, run.cluster, bad)
    block = failed.switch if failed is not None else None  # placement kept the replica in it
    in_block = [s for s in spares if block is not None and s.switch == block]
    if in_block:
        spare = in_block[0]
        set_node_state(session, spare, NodeState.HEALTHY, f"spare taken by run {run.id}")
        node_event(session, spare, "spare.assigned", f"replaces {bad} in run {run.id}")
        run.nodes = [spare.name if n == bad else n for n in run.nodes]
        incident.spare_node = spare.name
        record_event(
            session,
            run,
            "recovery.spare_assigned",
            f"{bad} drained ({incident.signal}); spare {spare.name} in its block {block} "
            "takes its place",
            data={"incident": incident.id, "failed": bad, "spare": spare.name, "block": block},
        )
        return jobs
    run.nodes = [n for n in run.nodes if n not in replica]
    incident.state = IncidentState.WAITING
    record_event(
        session,
        run,
        "recovery.replica_moves",
        f"{bad} drained ({incident.signal}); no spare in its block {block or '-'}: its "
        f"model replica ({', '.join(replica)}) moves whole to a block with room for "
        f"{group} node(s)",
        data={"incident": incident.id, "failed": bad, "released": replica, "block": block},
    )
    return jobs
