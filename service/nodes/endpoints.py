"""/v1/nodes: the cluster as runyard sees it; heartbeats from the health agents."""

from __future__ import annotations

from fastapi import APIRouter

from service.db import SessionDep
from service.nodes import repository, service
from service.nodes.schemas import Heartbeat, NodeOut

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])


@router.get("")
def list_nodes(session: SessionDep) -> list[NodeOut]:
    """Every node with runyard's state and Slurm's."""
    return [NodeOut.model_validate(n) for n in repository.list_nodes(session)]


@router.post("/{name}/heartbeat")
def heartbeat(name: str, beat: Heartbeat, session: SessionDep) -> NodeOut:
    """A health agent says its node is alive."""
    return NodeOut.model_validate(service.record_heartbeat(session, name))
