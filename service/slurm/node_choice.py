"""Choose nodes on the network topology: as few leaf switches as possible, neighbours close.

Pure functions over (node, leaf switch) pairs so they are testable without a cluster.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from service.slurm.hostlist import compress_hostlist


def group_by_switch(free: Iterable[tuple[str, str | None]]) -> dict[str, list[str]]:
    by_switch: dict[str, list[str]] = defaultdict(list)
    for node, switch in free:
        by_switch[switch or "-"].append(node)
    return {s: sorted(nodes) for s, nodes in by_switch.items()}


def choose_nodes(
    free: Iterable[tuple[str, str | None]], count: int, group_nodes: int = 1
) -> list[str] | None:
    """`count` nodes spanning the fewest leaf switches (or blocks), or None if there are not
    enough.

    One switch that fits takes the run (the fullest-fitting one, best fit, to keep larger
    holes for larger runs); otherwise switches are taken largest first. Nodes come out grouped
    by switch and in name order, so consecutive ranks (tensor, then pipeline neighbours)
    share a switch.

    `group_nodes` > 1 (topology/block: the nodes of one model replica, planner/blocks.py)
    takes nodes from each block only in whole groups, so no replica straddles two blocks;
    nodes of a block left over after its last whole group count for nothing.
    """
    by_switch = group_by_switch(free)
    usable = {s: len(nodes) - len(nodes) % group_nodes for s, nodes in by_switch.items()}
    if sum(usable.values()) < count:
        return None
    fitting = [s for s in by_switch if usable[s] >= count]
    if fitting:
        best = min(fitting, key=lambda s: (usable[s], s))
        return by_switch[best][:count]
    chosen: list[str] = []
    for switch in sorted(by_switch, key=lambda s: (-usable[s], s)):
        chosen.extend(by_switch[switch][: min(usable[switch], count - len(chosen))])
        if len(chosen) == count:
            break
    return chosen


def choose_replacement(
    spares: Iterable[tuple[str, str | None]], keep_switches: set[str | None]
) -> str | None:
    """A spare for a failed node: one on a switch the run already uses first."""
    ranked = sorted(spares, key=lambda s: (s[1] not in keep_switches, s[1] or "", s[0]))
    return ranked[0][0] if ranked else None


def placement_cost(
    nodes: list[str],
    switch_of: dict[str, str | None],
    *,
    ranks_per_node: int,
    tp: int,
    cp: int,
    pp: int,
) -> dict[str, int]:
    """What crosses the network: leaf switches spanned and pipeline hops between switches.

    Ranks fill nodes in order, and the mesh puts tp peers on adjacent ranks, then cp, then
    pp, then dp (worker/parallel), so stage s of a pipeline sits `tp * cp` ranks after s-1.
    """
    switches = {switch_of.get(n) or "-" for n in nodes}
    world = len(nodes) * ranks_per_node
    stride = tp * cp
    hops = set()
    for rank in range(world):
        stage = (rank // stride) % pp
        if stage + 1 < pp:
            here, there = nodes[rank // ranks_per_node], nodes[(rank + stride) // ranks_per_node]
            if (switch_of.get(here) or "-") != (switch_of.get(there) or "-"):
                hops.add((here, there))
    return {
        "num_nodes": len(nodes),
        "switches_spanned": len(switches),
        "cross_switch_pipeline_edges": len(hops),
    }


def placed_groups(nodes: list[str], group_of: dict[str, str | None]) -> dict[str, str]:
    """Each leaf switch or block the nodes sit in -> its nodes there (`gpu[003-004]`), in
    the nodes' order: what `run show` prints as the blocks a run spans."""
    members: dict[str, list[str]] = defaultdict(list)
    for node in nodes:
        members[group_of.get(node) or "-"].append(node)
    return {group: compress_hostlist(names) for group, names in members.items()}


def replica_of(nodes: list[str], node: str, group_nodes: int) -> list[str]:
    """The nodes of `node`'s model replica: ranks fill nodes in order, so replicas are
    consecutive runs of `group_nodes` nodes (planner/blocks.py)."""
    start = nodes.index(node) // group_nodes * group_nodes
    return nodes[start : start + group_nodes]
