"""Placement: which free, healthy nodes a PENDING run gets (fewest leaf switches, the
switches it already sits on first), what it does when there are none (shrink to min_nodes or
wait), and giving an ended run's nodes back: retried until Slurm has deleted the run's
reservation, and any run reservation of ours that no run holds swept away.

A placed run holds its nodes through its own Slurm reservation (slurm/reservations.py) from
here until it ends, across attempts, so a healthy node is not lost while a failed one is
replaced. Where a failed node's run gets a spare: recovery/move_to_spare.py.
"""

from __future__ import annotations

import logging

from sqlalchemy import ColumnElement, and_, case, func, not_, select
from sqlalchemy.orm import Session

from contract import ModelShape
from planner.resolve import LayoutError
from service.clusters.registry import find_cluster, planning_settings
from service.config import Settings
from service.db import session_scope
from service.models import Attempt, Node, NodeState, Run, RunState
from service.nodes import repository as nodes_repo
from service.nodes.cluster_topology import (
    TopologyShape,
    block_placement,
    cluster_topology,
    group_nodes,
)
from service.nodes.node_state_machine import node_event, set_node_state
from service.runs import repository
from service.runs.planning import plan_layout, stored_plan
from service.runs.run_state_machine import record_event
from service.runs.schemas import RunSpec
from service.slurm.client import SlurmClient, SlurmError, SlurmUnreachable
from service.slurm.node_choice import choose_nodes, placed_groups, placement_cost
from service.slurm.reservations import delete_reservation, run_of_reservation, run_reservation
from service.slurm.snapshot import ClusterSnapshot

log = logging.getLogger(__name__)


def place_pending(settings: Settings, snapshot: ClusterSnapshot) -> None:
    """Give the snapshot's cluster's PENDING runs the nodes they lack there: free, healthy,
    fewest leaf switches. A run is placed on its own cluster only (chosen at submission,
    service/runs/cluster_placement.py): it never spans clusters."""
    with session_scope() as session:
        rows = session.execute(
            select(Node.name, Node.state, Node.switch).where(Node.cluster == snapshot.cluster)
        ).all()
        in_slurm = snapshot.free_nodes()  # one pass: asking per node and run was quadratic
        healthy_free = [
            (name, switch)
            for name, state, switch in rows
            if state == NodeState.HEALTHY and name in in_slurm
        ]
        pool = [
            (name, switch)
            for name, state, switch in rows
            if state == NodeState.SPARE and _idle_in_slurm(snapshot, name)
        ]
        # A few columns of the queued runs that may need a decision: 10,000 queued runs,
        # loaded whole, took seconds; the ones that already say they wait are left out.
        queued = session.execute(
            select(
                Run.id, Run.priority, Run.num_nodes, Run.nodes, Run.min_nodes, Run.state_reason
            ).where(
                Run.cluster == snapshot.cluster,
                Run.state == RunState.PENDING,
                func.cardinality(Run.nodes) < Run.num_nodes,
                not_(_still_waiting_sql(len(healthy_free), len(pool))),
                # A sweep member is placed by Slurm as its array's task (queued or not yet
                # submitted); loading each of 1,000 such members a tick took seconds.
                not_(
                    Run.sweep_id.is_not(None)
                    & (
                        not_(Run.attempts.any())
                        | Run.attempts.any(Attempt.state.in_(repository.LIVE_ATTEMPT_STATES))
                    )
                ),
            )
        ).all()
        if not queued:
            return
        # Higher priority first; within a class, first come first served.
        queued = sorted(queued, key=lambda r: (-repository.PRIORITY_RANK.get(r.priority, 0), r.id))
        nodes = {n.name: n for n in nodes_repo.list_nodes(session, snapshot.cluster)}
        topology = cluster_topology(session, snapshot.cluster)
        taken: set[str] = set()
        for row in queued:
            free_now = len(healthy_free) - len(taken & in_slurm)
            if _still_waiting(
                row.num_nodes, row.nodes, row.min_nodes, row.state_reason, free_now, len(pool)
            ):
                continue  # the same wait as last tick: nothing to write, no lock to take
            run = repository.get_run(session, row.id, for_update=True)
            if run is None or run.state != RunState.PENDING or not repository.needs_placement(run):
                continue
            need = run.num_nodes - len(run.nodes)
            kept_switches = {nodes[n].switch for n in run.nodes if n in nodes}
            free = [f for f in healthy_free if f[0] not in taken and f[0] not in run.nodes]
            idle_spares = [f for f in pool if f[0] not in taken]
            group = group_nodes(topology, run.config["layout"], run.num_nodes, run.gpus_per_node)
            chosen = nodes_for_run(free, kept_switches, need, idle_spares, group)
            if chosen is None:
                shrink_or_wait(session, run, need, len(free), settings)
                continue
            taken.update(chosen)
            for name in set(chosen) & {s for s, _ in idle_spares}:
                spare = nodes[name]
                set_node_state(session, spare, NodeState.HEALTHY, f"spare taken by run {run.id}")
                node_event(session, spare, "spare.assigned", f"run {run.id} waited for a node")
            hold_nodes(
                session, run, [*run.nodes, *chosen], nodes, settings.slurm_job_prefix, topology
            )


def waiting_reason(need: int) -> str:
    """Why a run waits. Not the free-node count (its event says it): a reason that changed
    whenever a node freed up re-wrote every queued run, 10,000 locks and events a tick."""
    return f"waiting for {need} free healthy node(s)"


def _still_waiting(
    num_nodes: int, held: list[str], min_nodes: int | None, reason: str, free: int, spares: int
) -> bool:
    """True when a queued run cannot be placed, cannot shrink, and already says so: with
    10,000 runs queued, locking and re-judging each one every tick cost seconds."""
    need = num_nodes - len(held)
    usable = free + (spares if held else 0)
    return need > usable and not may_shrink(min_nodes, len(held)) and reason == waiting_reason(need)


def _still_waiting_sql(free: int, spares: int) -> ColumnElement[bool]:
    """`_still_waiting` in SQL, at the free counts the tick starts with. It may leave out
    only what the loop would skip anyway: placing runs only lowers those counts."""
    held = func.cardinality(Run.nodes)
    need = Run.num_nodes - held
    usable = case((held > 0, free + spares), else_=free)
    shrinkable = and_(
        Run.min_nodes.is_not(None), Run.min_nodes > 0, held > 0, Run.min_nodes <= held
    )
    reason = func.concat("waiting for ", need, " free healthy node(s)")
    return and_(need > usable, not_(shrinkable), Run.state_reason == reason)


def nodes_for_run(
    free: list[tuple[str, str | None]],
    kept_switches: set[str | None],
    need: int,
    spares: list[tuple[str, str | None]] | None = None,
    group_nodes: int = 1,
) -> list[str] | None:
    """The `need` free nodes a run gets: on the switches it already sits on when they have
    enough, else the fewest switches anywhere; None when there are not enough.

    A run that already holds nodes (it lost some) takes idle hot `spares` too when free
    nodes do not suffice. Without that, a run that found no spare when its node failed
    waited until the pool was full again: the pool refills before placement every tick,
    so every repaired node went to the pool first (the failure simulation, sim/, showed
    it: at Llama 3's rate the classic path waited a third of 30 days, goodput 66%).
    On topology/block, `group_nodes` (a model replica's nodes) come from one block each.
    Pure, so the failure simulation places as the service does."""
    g = group_nodes

    def pick(candidates: list[tuple[str, str | None]]) -> list[str] | None:
        near = [f for f in candidates if f[1] in kept_switches]
        return choose_nodes(near, need, g) or choose_nodes(candidates, need, g)

    chosen = pick(free)
    if chosen is None and kept_switches and spares:
        chosen = pick([*free, *spares])
    return chosen


def _idle_in_slurm(snapshot: ClusterSnapshot, name: str) -> bool:
    """Idle and not drained or down: a spare held in our pool's reservation qualifies."""
    node = snapshot.nodes.get(name)
    return node is not None and snapshot.is_usable(name) and node.state.split("+")[0] == "IDLE"


def hold_nodes(
    session: Session,
    run: Run,
    held: list[str],
    nodes: dict[str, Node],
    prefix: str,
    topology: TopologyShape | None = None,
) -> None:
    """The run holds `held` from now on (through its own reservation); record the cost and,
    on topology/block, the blocks it spans and the segment its attempts ask for."""
    topology = topology or cluster_topology(session, run.cluster)
    run.nodes = held
    run.reservation = run_reservation(prefix, run.id)
    layout = run.config["layout"]
    cost = placement_cost(
        run.nodes,
        {n: nodes[n].switch for n in run.nodes if n in nodes},
        ranks_per_node=run.gpus_per_node,
        tp=layout["tp"],
        cp=layout["cp"],
        pp=layout["pp"],
    )
    groups = placed_groups(run.nodes, {n: nodes[n].switch for n in run.nodes if n in nodes})
    on_blocks = block_placement(topology, run)
    run.config = {
        **run.config,
        "placement": {
            "nodes": run.nodes,
            **cost,
            "topology": topology.kind.value,
            "groups": groups,
            **on_blocks,
        },
    }
    record_event(
        session,
        run,
        "run.placed",
        f"nodes {', '.join(run.nodes)}: {cost['switches_spanned']} {topology.group_word}(s) "
        f"({', '.join(groups)}), {cost['cross_switch_pipeline_edges']} cross-"
        f"{topology.group_word.split()[-1]} pipeline edge(s)",
        data={
            "nodes": run.nodes,
            **cost,
            "switches": sorted({nodes[n].switch or "-" for n in run.nodes}),
            **on_blocks,
        },
    )


def adopt_array_nodes(session: Session, run: Run, allocated: list[str], prefix: str) -> None:
    """Slurm placed a sweep's array task: from here on the run holds those nodes like any
    other run, so a failure is recovered onto a spare and retries keep the healthy nodes."""
    nodes = {n.name: n for n in nodes_repo.get_nodes(session, run.cluster, allocated)}
    hold_nodes(session, run, list(allocated), nodes, prefix)


def may_shrink(min_nodes: int | None, held: int) -> bool:
    """A run that lacks nodes continues on the `held` healthy ones it has, rather than
    waiting, only if its spec allows fewer nodes (min_nodes) and it still holds that many.
    Pure, so the failure simulation (sim/) shrinks exactly when the service does."""
    return bool(min_nodes) and held > 0 and min_nodes is not None and min_nodes <= held


def shrink_or_wait(session: Session, run: Run, need: int, free: int, settings: Settings) -> None:
    """No free node for what the run lacks: continue on fewer nodes if its min_nodes
    allows it and the smaller layout resolves, else say what it waits for."""
    if may_shrink(run.min_nodes, len(run.nodes)):
        # The run allows fewer nodes and checkpoints reshard: continue on what is left.
        spec = RunSpec.model_validate({**run.spec, "nodes": len(run.nodes), "min_nodes": None})
        # Planned again on the hardware of the run's own cluster.
        on = planning_settings(settings, find_cluster(settings, run.cluster))
        try:  # its inputs were read as its owner at submission; its shape is stored
            resolved = plan_layout(spec, ModelShape.model_validate(run.config["model"]), on)
        except LayoutError as exc:
            reason = f"cannot shrink to {len(run.nodes)} nodes ({exc}); waiting"
        else:
            old, layout = run.num_nodes, resolved.layout
            run.num_nodes = len(run.nodes)
            run.config = {
                **run.config,
                "layout": layout.model_dump(mode="json"),
                "plan": stored_plan(resolved),
            }
            record_event(
                session,
                run,
                "run.shrunk",
                f"no node to replace a failed one: continuing on {run.num_nodes} "
                f"nodes instead of {old} (min_nodes {run.min_nodes}), "
                f"dp {layout.dp}",
                data={"layout": run.config["layout"]},
            )
            return
    else:
        reason = waiting_reason(need)
    if run.state_reason != reason:
        run.state_reason = reason
        record_event(session, run, "run.waiting", f"{reason}; {free} free now")


ENDED_STATES = [state for state in RunState if state.is_terminal]


def release_ended_runs(snapshot: ClusterSnapshot, slurm: SlurmClient) -> None:
    """Delete the reservation of every run that ended, giving its nodes back.

    An ended run that still records its reservation is releasing: it keeps the name until
    slurmctld has deleted the reservation, and is tried again every tick until then. Slurm
    refuses the delete while a job that ran in it is still ending; a run released on that
    refusal leaked its nodes for good (issue 37), the next run waiting for nodes that were free.
    The snapshot's cluster's runs only: a run's reservation is on its cluster.
    """
    with session_scope() as session:  # ids and names only: ended runs pile up
        rows = session.execute(
            select(Run.id, Run.reservation)
            .where(Run.state.in_(ENDED_STATES), Run.reservation.is_not(None))
            .where(Run.cluster == snapshot.cluster)
            .order_by(Run.id)
        ).all()
    releasing = [(run_id, name) for run_id, name in rows if name]
    for run_id, name in releasing:
        try:
            delete_reservation(slurm, name, snapshot.reservations)
        except SlurmUnreachable as exc:
            # Every other delete would wait out the same timeout: the rest wait a tick.
            log.warning("cannot release run %s's nodes, Slurm did not answer: %s", run_id, exc)
            return
        except SlurmError as exc:
            log.warning("run %s's reservation %s not deleted yet, retrying: %s", run_id, name, exc)
            continue
        with session_scope() as session:
            run = repository.get_run(session, run_id, for_update=True)
            if run is not None and run.reservation == name:
                run.reservation = None
                record_event(session, run, "run.released", f"nodes released ({name})")


def sweep_reservations(settings: Settings, snapshot: ClusterSnapshot, slurm: SlurmClient) -> None:
    """Delete the run reservations of ours in the tick's snapshot that no run holds: their run
    does not exist, or ended and no longer records them. Versions before the fix of issue 37
    released runs whose delete Slurm had refused and left such reservations behind, holding
    free nodes from every other job. Only `<prefix>-run<id>` names are ours to sweep, never
    the spare pool's or another service's; an ended run that still records its reservation
    is releasing, which release_ended_runs finishes. A run's reservation on a cluster that
    is not the run's is leaked too: a run holds nodes on its own cluster only."""
    prefix = settings.slurm_job_prefix
    ours = {
        name: run_id
        for name in snapshot.reservations
        if (run_id := run_of_reservation(prefix, name)) is not None
    }
    if not ours:
        return
    with session_scope() as session:
        runs = {
            row.id: row
            for row in session.execute(
                select(Run.id, Run.state, Run.reservation, Run.cluster).where(
                    Run.id.in_(list(ours.values()))
                )
            )
        }
    leaked = {
        name: run_id
        for name, run_id in ours.items()
        if (run := runs.get(run_id)) is None
        or run.reservation != name
        or run.cluster != snapshot.cluster
    }
    for name, run_id in sorted(leaked.items()):
        run = runs.get(run_id)
        whose = (
            f"run {run_id} ({run.state}, on {run.cluster})"
            if run
            else f"run {run_id}, which does not exist"
        )
        try:
            delete_reservation(slurm, name, snapshot.reservations)
        except SlurmUnreachable as exc:
            log.warning("cannot delete leaked reservation %s, Slurm did not answer: %s", name, exc)
            return
        except SlurmError as exc:
            log.warning("leaked reservation %s of %s not deleted yet: %s", name, whose, exc)
            continue
        log.warning("deleted leaked reservation %s of %s", name, whose)
