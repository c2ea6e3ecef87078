"""/v1/nodes: the cluster as runyard sees it; heartbeats and events from the health agents."""

from __future__ import annotations

from fastapi import APIRouter

from service.auth.deps import USERS, AgentDep
from service.config import get_settings
from service.db import EVENT_BATCHES, LIVENESS, SessionDep
from service.errors import NotFound
from service.group_commit import GroupCommit
from service.nodes import repository, service
from service.nodes.schemas import (
    EventBatch,
    EventBatchAck,
    Heartbeat,
    NodeDetail,
    NodeEventOut,
    NodeOut,
)
from service.recovery.deps import ClassifierDep

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])


@router.get("", dependencies=[USERS])
def list_nodes(session: SessionDep) -> list[NodeOut]:
    """Every node with runyard's state and Slurm's."""
    return [NodeOut.model_validate(n) for n in repository.list_nodes(session)]


@router.get("/{name}", dependencies=[USERS])
def show_node(name: str, session: SessionDep) -> NodeDetail:
    """One node with its recent history (state changes, Xids, heartbeats lost)."""
    node = service.require_node(session, name)
    events = [NodeEventOut.model_validate(e) for e in service.recent_events(session, name)]
    return NodeDetail.model_validate(
        {
            **NodeOut.model_validate(node).model_dump(),
            "num_app_errors": node.num_app_errors,
            "events": events,
        }
    )


# The agents' hot path (1,280 nodes reporting every few seconds): `async def` endpoints that
# do their database work in one trip to a lane's threads, committed before the reply.
# Heartbeats arriving together share one UPDATE and one commit (service/group_commit.py).
HEARTBEATS = GroupCommit("heartbeats", LIVENESS, service.touch_heartbeats)


@router.post("/{name}/heartbeat", status_code=204)
async def heartbeat(name: str, beat: Heartbeat, principal: AgentDep) -> None:
    """A health agent says its node is alive; the 204 comes once that is committed."""
    principal.require_node(name)
    if not await HEARTBEATS.submit(name):
        raise NotFound(f"no node named '{name}' in Slurm; `runyard node list` shows the nodes")


@router.post("/{name}/events")
async def post_events(
    name: str, batch: EventBatch, classifier: ClassifierDep, principal: AgentDep
) -> EventBatchAck:
    """Signals an agent saw on its node; stored once each, classified, acted on."""
    principal.require_node(name)
    return await EVENT_BATCHES.run(service.ingest_events, name, batch, get_settings(), classifier)
