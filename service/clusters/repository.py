"""All SQL about clusters: their nodes counted per cluster, and what placement across
clusters weighs (free nodes, queued demand), each in one query."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import any_, exists, func, select
from sqlalchemy.orm import Session

from service.models import ClusterSetting, Node, NodeState, Run, RunState

# cluster_settings' key of a cluster's spare pool target, as an admin set it: one row per
# cluster (service/recovery/spares.py reads and writes it).
SPARE_TARGET_KEY = "spare_pool_target"


def spare_target_key(cluster: str) -> str:
    return f"{SPARE_TARGET_KEY}:{cluster}"


@dataclass(frozen=True)
class NodeCounts:
    num_nodes: int = 0
    num_healthy: int = 0
    num_spares: int = 0
    free_gpus: int = 0


def node_counts(session: Session) -> dict[str, NodeCounts]:
    """Per cluster: its nodes, the healthy ones, the spares, and the GPUs free to start a
    job now (healthy in runyard's eyes and IDLE in Slurm's, without a drain or other flag:
    `IDLE` exactly, as `IDLE+DRAIN` is not free)."""
    healthy = Node.state == NodeState.HEALTHY
    stmt = select(
        Node.cluster,
        func.count(),
        func.count().filter(healthy),
        func.count().filter(Node.state == NodeState.SPARE),
        func.coalesce(func.sum(Node.num_gpus).filter(healthy, Node.slurm_state == "IDLE"), 0),
    ).group_by(Node.cluster)
    return {
        cluster: NodeCounts(int(n), int(ok), int(spare), int(gpus))
        for cluster, n, ok, spare, gpus in session.execute(stmt).all()
    }


def spare_targets(session: Session) -> dict[str, int]:
    """Cluster -> the spare pool target an admin set."""
    rows = session.execute(
        select(ClusterSetting.key, ClusterSetting.value).where(
            ClusterSetting.key.like(f"{SPARE_TARGET_KEY}:%")
        )
    ).all()
    return {key.partition(":")[2]: int(value) for key, value in rows}


# The runs that hold nodes or wait for them: every state but the ended ones.
ACTIVE_RUN_STATES = [state for state in RunState if not state.is_terminal]


@dataclass(frozen=True)
class PlacementCounts:
    """What a cluster offers a new run, as the reconciler last synced it."""

    num_nodes: int = 0  # every node runyard knows on it
    num_spares: int = 0  # in its spare pool now
    num_free: int = 0  # HEALTHY, IDLE in Slurm, held by no run
    gpus_per_node: int = 0  # the most GPUs a node of it has
    queued_need: int = 0  # nodes its PENDING runs still lack, queued before a new run


def placement_counts(session: Session) -> dict[str, PlacementCounts]:
    """Per cluster, in three queries: its nodes, spares, free nodes (healthy, `IDLE`
    exactly, and in no active run's nodes: a run holds its nodes between attempts), its
    largest node's GPUs, and what its queued runs still lack."""
    nodes = session.execute(
        select(
            Node.cluster,
            func.count(),
            func.count().filter(Node.state == NodeState.SPARE),
            func.coalesce(func.max(Node.num_gpus), 0),
        ).group_by(Node.cluster)
    ).all()
    held = exists().where(
        Run.cluster == Node.cluster,
        Run.state.in_(ACTIVE_RUN_STATES),
        Node.name == any_(Run.nodes),
    )
    free = dict(
        session.execute(
            select(Node.cluster, func.count())
            .where(Node.state == NodeState.HEALTHY, Node.slurm_state == "IDLE", ~held)
            .group_by(Node.cluster)
        ).all()
    )
    queued = dict(
        session.execute(
            select(Run.cluster, func.sum(Run.num_nodes - func.cardinality(Run.nodes)))
            .where(Run.state == RunState.PENDING, func.cardinality(Run.nodes) < Run.num_nodes)
            .group_by(Run.cluster)
        ).all()
    )
    return {
        cluster: PlacementCounts(
            num_nodes=int(num),
            num_spares=int(spares),
            num_free=int(free.get(cluster) or 0),
            gpus_per_node=int(gpus),
            queued_need=int(queued.get(cluster) or 0),
        )
        for cluster, num, spares, gpus in nodes
    }
