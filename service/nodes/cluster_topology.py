"""The cluster's topology kind, kept in Postgres beside the nodes' groups, and what it means
for a run: on topology/block, the nodes of each model replica share one block, and the
attempt asks Slurm for that with `--segment`.

The reconciler reads the topology from Slurm every TOPOLOGY_EVERY_S (reconcile/loop.py);
each node's group (leaf switch or block) goes to `nodes.switch`, the kind and the base
block's size here, so placement, recovery, submission and the API read one answer from
the database without asking Slurm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from planner.blocks import BlockPlan, block_plan
from service.models import ClusterSetting, Run
from service.slurm.topology import Topology, TopologyKind

TOPOLOGY_KEY = "slurm_topology"  # one row per cluster: `slurm_topology:<cluster>`


@dataclass(frozen=True)
class TopologyShape:
    """The kind of topology and, for blocks, the planning base block's node count."""

    kind: TopologyKind = TopologyKind.TREE
    block_size: int | None = None

    @property
    def group_word(self) -> str:
        """What a node's group is called in messages: "block" or "leaf switch"."""
        return "block" if self.kind is TopologyKind.BLOCK else "leaf switch"


def topology_key(cluster: str) -> str:
    return f"{TOPOLOGY_KEY}:{cluster}"


def record_topology(session: Session, cluster: str, topology: Topology) -> None:
    """Store the kind and block size `cluster`'s Slurm reported, when they changed."""
    value = {"kind": topology.kind.value, "block_size": topology.block_size}
    row = session.get(ClusterSetting, topology_key(cluster))
    if row is None:
        session.add(ClusterSetting(key=topology_key(cluster), value=value))
    elif row.value != value:
        row.value = value


def cluster_topology(session: Session, cluster: str) -> TopologyShape:
    """The last topology the reconciler read of `cluster`; tree until it has read one."""
    row = session.get(ClusterSetting, topology_key(cluster))
    if row is None:
        return TopologyShape()
    return TopologyShape(TopologyKind(row.value["kind"]), row.value.get("block_size"))


def run_block_plan(
    shape: TopologyShape, layout: dict[str, Any], num_nodes: int, gpus_per_node: int
) -> BlockPlan | None:
    """How a run with this resolved `layout` sits on the blocks; None off topology/block."""
    if shape.kind is not TopologyKind.BLOCK or not shape.block_size:
        return None
    return block_plan(
        num_nodes,
        tp=layout["tp"],
        cp=layout["cp"],
        pp=layout["pp"],
        gpus_per_node=gpus_per_node,
        block_size=shape.block_size,
    )


def group_nodes(shape: TopologyShape, layout: dict[str, Any], num_nodes: int, ranks: int) -> int:
    """The nodes placement keeps in one group for this run: a model replica's on blocks
    (when a block holds one), else 1 (a tree packs nodes, it does not bind them)."""
    plan = run_block_plan(shape, layout, num_nodes, ranks)
    return plan.segment if plan is not None and plan.segment is not None else 1


def block_placement(shape: TopologyShape, run: Run) -> dict[str, Any]:
    """What a placed run records about its blocks (its `placement`): the segment its
    attempts ask for and the replica's nodes; nothing off topology/block."""
    plan = run_block_plan(shape, run.config["layout"], run.num_nodes, run.gpus_per_node)
    if plan is None:
        return {}
    return {
        "block_size": plan.block_size,
        "replica_nodes": plan.replica_nodes,
        "segment": plan.segment,
    }
