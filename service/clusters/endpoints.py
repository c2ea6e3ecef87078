"""/v1/clusters: the Slurm clusters the service drives, each with its state."""

from __future__ import annotations

from fastapi import APIRouter

from service.auth.deps import USERS
from service.clusters import repository
from service.clusters.reachability import Reachability, reachability
from service.clusters.registry import ClusterProbe, default_cluster, probe_clusters
from service.clusters.schemas import ClusterOut
from service.config import get_settings
from service.db import SessionDep

router = APIRouter(prefix="/v1/clusters", tags=["clusters"])


@router.get("", dependencies=[USERS])
def list_clusters(session: SessionDep) -> list[ClusterOut]:
    """Every configured cluster: reachable or not, its Slurm version, nodes, spares, free GPUs."""
    settings = get_settings()
    # Asked before the session's first query: no transaction waits on a slurmctld.
    probes = probe_clusters(settings)
    counts = repository.node_counts(session)
    targets = repository.spare_targets(session)
    reach = reachability(session)
    default = default_cluster(settings).name
    return [cluster_out(p, counts, targets, default, reach.get(p.config.name)) for p in probes]


def cluster_out(
    probe: ClusterProbe,
    counts: dict[str, repository.NodeCounts],
    targets: dict[str, int],
    default: str,
    reach: Reachability | None = None,
) -> ClusterOut:
    config = probe.config
    nodes = counts.get(config.name, repository.NodeCounts())
    return ClusterOut(
        name=config.name,
        default=config.name == default,
        reach=config.reach,
        state=probe.state,
        slurm_version=probe.slurm_version,
        detail=probe.detail,
        unreachable_since=reach.unreachable_since if reach else None,
        partition=config.partition,
        hardware=config.hardware,
        num_nodes=nodes.num_nodes,
        num_healthy=nodes.num_healthy,
        num_spares=nodes.num_spares,
        spare_target=targets.get(config.name, config.spare_pool_target or 0),
        free_gpus=nodes.free_gpus,
    )
