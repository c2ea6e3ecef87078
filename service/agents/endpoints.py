"""/v1/nodes/{name}/heartbeat and /events: what the health agents send. Agent tokens, each
for its own node."""

from __future__ import annotations

from fastapi import APIRouter

from service.agents.deps import ClassifierDep
from service.agents.service import ingest_events
from service.auth.deps import AgentDep
from service.clusters.deps import ClusterQuery, cluster_name
from service.clusters.registry import default_cluster
from service.config import get_settings
from service.db import EVENT_BATCHES, LIVENESS
from service.errors import NotFound
from service.group_commit import GroupCommit
from service.nodes.schemas import EventBatch, EventBatchAck, Heartbeat
from service.nodes.service import touch_heartbeats_of

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])


# The agents' hot path (1,280 nodes reporting every few seconds): `async def` endpoints that
# do their database work in one trip to a lane's threads, committed before the reply.
# Heartbeats arriving together share one UPDATE and one commit (service/group_commit.py).
HEARTBEATS = GroupCommit("heartbeats", LIVENESS, touch_heartbeats_of)


@router.post("/{name}/heartbeat", status_code=204)
async def heartbeat(
    name: str, beat: Heartbeat, principal: AgentDep, cluster: ClusterQuery = None
) -> None:
    """A health agent says its node is alive; the 204 comes once that is committed."""
    on = cluster_name(cluster)  # the agent's --cluster: node names repeat across clusters
    principal.require_node(on, name, default_cluster(get_settings()).name)
    if not await HEARTBEATS.submit((on, name)):
        raise NotFound(f"no node named '{name}' on cluster {on}; `runyard node list` shows them")


@router.post("/{name}/events")
async def post_events(
    name: str,
    batch: EventBatch,
    classifier: ClassifierDep,
    principal: AgentDep,
    cluster: ClusterQuery = None,
) -> EventBatchAck:
    """Signals an agent saw on its node; stored once each, classified, acted on."""
    on = cluster_name(cluster)
    principal.require_node(on, name, default_cluster(get_settings()).name)
    return await EVENT_BATCHES.run(ingest_events, on, name, batch, get_settings(), classifier)
