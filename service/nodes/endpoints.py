"""/v1/nodes: the cluster as runyard sees it (the agents' own routes: service/agents/)."""

from __future__ import annotations

from fastapi import APIRouter

from service.auth.deps import USERS
from service.clusters.deps import ClusterQuery, cluster_name
from service.db import SessionDep
from service.nodes import repository, service
from service.nodes.schemas import NodeDetail, NodeEventOut, NodeOut

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])


@router.get("", dependencies=[USERS])
def list_nodes(session: SessionDep, cluster: ClusterQuery = None) -> list[NodeOut]:
    """Every node (of one cluster, if given) with runyard's state and Slurm's."""
    on = cluster_name(cluster) if cluster is not None else None
    return [NodeOut.model_validate(n) for n in repository.list_nodes(session, on)]


@router.get("/{name}", dependencies=[USERS])
def show_node(name: str, session: SessionDep, cluster: ClusterQuery = None) -> NodeDetail:
    """One node with its recent history (state changes, Xids, heartbeats lost)."""
    on = cluster_name(cluster)
    node = service.require_node(session, on, name)
    events = [NodeEventOut.model_validate(e) for e in service.recent_events(session, on, name)]
    return NodeDetail.model_validate(
        {
            **NodeOut.model_validate(node).model_dump(),
            "num_app_errors": node.num_app_errors,
            "events": events,
        }
    )
