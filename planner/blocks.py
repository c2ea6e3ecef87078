"""A run on blocks of nodes (Slurm's topology/block: an NVL72 rack, a leaf switch's nodes):
which nodes must share a block, the `--segment` that asks Slurm for it, and how many blocks
the run spans at least.

The ranks of one model replica (its tp x cp x pp group: tensor peers on adjacent ranks,
then context, then pipeline stages, worker/parallel) exchange activations every
micro-batch; only the data-parallel gradient reduction crosses replicas. So the nodes of a
replica stay inside one block and replicas may sit in different blocks. Pure, so the CLI's
`runyard plan` and the service's placement compute the same thing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def replica_nodes(*, tp: int, cp: int, pp: int, gpus_per_node: int) -> int:
    """Nodes that hold whole model replicas and nothing less: 1 where several replicas share
    a node, tp*cp*pp/gpus_per_node where a replica fills nodes, and the least common
    multiple's nodes where a replica ends part way through a node (12 ranks on 8-GPU nodes:
    3 nodes hold 2 replicas)."""
    ranks = tp * cp * pp
    return math.lcm(ranks, gpus_per_node) // gpus_per_node


@dataclass(frozen=True)
class BlockPlan:
    """How a run of `num_nodes` sits on blocks of `block_size` nodes."""

    num_nodes: int
    block_size: int
    replica_nodes: int  # nodes one model replica (tp x cp x pp) spans
    segment: int | None  # `--segment`: nodes kept inside one block; None when a replica
    # spans more nodes than a block holds (its groups cross blocks)
    min_blocks: int  # the fewest blocks the run can span

    @property
    def fits_in_blocks(self) -> bool:
        return self.segment is not None

    def describe(self) -> str:
        """One line for `runyard plan` and the run's events."""
        if self.segment is None:
            return (
                f"a model replica spans {self.replica_nodes} nodes, more than a block's "
                f"{self.block_size}: its tensor/pipeline groups cross blocks"
            )
        return (
            f"blocks of {self.block_size} nodes: each model replica spans "
            f"{self.replica_nodes} node(s), asked as --segment={self.segment}; the run spans "
            f"at least {self.min_blocks} block(s)"
        )


def block_plan(
    num_nodes: int, *, tp: int, cp: int, pp: int, gpus_per_node: int, block_size: int
) -> BlockPlan:
    """The segment is the replica's nodes: the unit placement keeps inside a block, so the
    node list runyard chooses and what Slurm is asked for agree. Slurm wants the node count
    divisible by the segment and the segment no larger than the planning base block
    (sbatch(1), --segment); a replica larger than a block gets no segment."""
    group = replica_nodes(tp=tp, cp=cp, pp=pp, gpus_per_node=gpus_per_node)
    fits = group <= block_size and num_nodes % group == 0
    return BlockPlan(
        num_nodes, block_size, group, group if fits else None, math.ceil(num_nodes / block_size)
    )
