"""All SQL about clusters: their nodes counted per cluster, in one query."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import ClusterSetting, Node, NodeState

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
