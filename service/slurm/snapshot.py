"""One read of the cluster per tick: node states and reservations, taken outside any
transaction and handed to the steps that decide."""

from __future__ import annotations

from dataclasses import dataclass

from service.slurm.client import SlurmClient
from service.slurm.commands import SlurmNode

BAD_FLAGS = ("DRAIN", "DOWN", "FAIL", "NOT_RESPONDING", "POWER", "INVAL", "UNKNOWN", "FUTURE")
# Idle but not free: BLOCKED (Slurm 24.05+) is a node another job's --exclusive=topo holds.
HELD_FLAGS = ("BLOCKED",)


def is_down(state: str) -> bool:
    """Slurm lost the node: DOWN, DOWN*, NOT_RESPONDING ('*')."""
    return "DOWN" in state or "NOT_RESPONDING" in state or state.endswith("*")


@dataclass(frozen=True)
class ClusterSnapshot:
    nodes: dict[str, SlurmNode]
    reservations: dict[str, list[str]]
    # The cluster it was read from (Slurm's ClusterName): node names mean its nodes.
    cluster: str

    def reserved(self) -> set[str]:
        return {n for nodes in self.reservations.values() for n in nodes}

    def is_free(self, name: str) -> bool:
        """Idle, healthy in Slurm's eyes, and in nobody's reservation."""
        node = self.nodes.get(name)
        if node is None or name in self.reserved():
            return False
        return node.state.split("+")[0] == "IDLE" and not any(
            f in node.state for f in (*BAD_FLAGS, *HELD_FLAGS)
        )

    def free_nodes(self) -> set[str]:
        """Every free node (see is_free), in one pass: a caller that asks of many nodes
        uses this, since is_free gathers the reserved nodes at each call (1,280 nodes under
        200 run reservations made that quadratic: seconds per tick)."""
        reserved = self.reserved()
        return {
            name
            for name, node in self.nodes.items()
            if name not in reserved
            and node.state.split("+")[0] == "IDLE"
            and not any(f in node.state for f in (*BAD_FLAGS, *HELD_FLAGS))
        }

    def is_usable(self, name: str) -> bool:
        """Could run a job (idle or busy), i.e. not drained, down or failed."""
        node = self.nodes.get(name)
        return node is not None and not any(f in node.state for f in BAD_FLAGS)


def take_snapshot(slurm: SlurmClient) -> ClusterSnapshot:
    """Two calls, whatever the cluster's size: `scontrol show node` and `show reservation`."""
    return ClusterSnapshot(
        nodes={n.name: n for n in slurm.show_nodes()},
        reservations=slurm.reservations(),
        cluster=slurm.cluster_name,
    )
