"""Keep the nodes table in step with Slurm and the health agents."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.errors import NotFound
from service.models import Node, NodeState
from service.models.base import utcnow
from service.nodes import repository
from service.slurm.commands import SlurmNode


def sync_from_slurm(session: Session, nodes: list[SlurmNode], switches: dict[str, str]) -> None:
    """Upsert what `scontrol show node` says; runyard's own state is left to its owners."""
    known = {n.name: n for n in repository.list_nodes(session)}
    for sn in nodes:
        node = known.get(sn.name)
        if node is None:
            node = Node(name=sn.name, state=NodeState.HEALTHY, state_reason="registered by Slurm")
            session.add(node)
        node.slurm_state, node.slurm_reason = sn.state, sn.reason
        node.addr, node.num_gpus = sn.addr, sn.num_gpus
        node.switch = switches.get(sn.name)


def record_heartbeat(session: Session, name: str) -> Node:
    node = repository.get_node(session, name, for_update=True)
    if node is None:
        raise NotFound(f"no node named '{name}' in Slurm; `runyard node list` shows the nodes")
    node.last_heartbeat_at = utcnow()
    return node
