"""The cluster's network topology as Slurm describes it: `scontrol show topology`, read for
topology/tree (leaf switches) and topology/block (blocks of nodes, Slurm 24.05+).

Either way placement sees one grouping, node -> the group it shares a fast network with
(its leaf switch, or its base block), and the kind, which decides whether a model replica
must stay inside its group (block) or is only packed into as few as possible (tree). No
Slurm version prints this as JSON, so it is read as text in both (the lines are printed by
src/plugins/topology/{tree,block} and are the same in 22.05 and 24.11 for tree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from service.slurm.hostlist import expand_hostlist


class TopologyKind(StrEnum):
    TREE = "tree"  # topology/tree: leaf switches under spines
    BLOCK = "block"  # topology/block: base blocks Slurm pairs into larger aligned ones
    FLAT = "flat"  # no topology plugin: every node alike


@dataclass(frozen=True)
class Topology:
    kind: TopologyKind
    # Node -> its leaf switch (tree) or its base block (block); empty when flat.
    group_of: dict[str, str] = field(default_factory=dict)
    # The planning base block's node count (block only): a segment may not exceed it.
    block_size: int | None = None

    @property
    def keeps_replicas_in_groups(self) -> bool:
        """Whether a model replica's nodes must share one group (topology/block)."""
        return self.kind is TopologyKind.BLOCK


def _fields(line: str) -> dict[str, str]:
    return dict(token.partition("=")[::2] for token in line.split() if "=" in token)


def parse_topology(text: str) -> Topology:
    """`scontrol show topology`: SwitchName=... Level=0 ... Nodes=... lines (tree; the
    leaves are level 0), or BlockName=... Nodes=... BlockSize=... lines (block; the
    AggregatedBlock lines are Slurm's pairings of them and are not groups of their own)."""
    group_of: dict[str, str] = {}
    block_sizes: list[int] = []
    kind = TopologyKind.FLAT
    for line in text.splitlines():
        fields = _fields(line)
        nodes = fields.get("Nodes", "")
        if "BlockName" in fields:
            kind = TopologyKind.BLOCK
            if fields.get("BlockSize", "").isdigit():
                block_sizes.append(int(fields["BlockSize"]))
            for node in expand_hostlist(nodes) if nodes and nodes != "(null)" else []:
                group_of[node] = fields["BlockName"]
        elif "SwitchName" in fields:
            kind = TopologyKind.TREE
            if fields.get("Level") == "0" and nodes and nodes != "(null)":
                for node in expand_hostlist(nodes):
                    group_of[node] = fields["SwitchName"]
    return Topology(kind, group_of, min(block_sizes) if block_sizes else None)
