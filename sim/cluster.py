"""The simulated cluster: Slurm in memory (service/slurm/fake.py, behind the SlurmClient
seam), one run's nodes, the hot-spare pool, and drained nodes under repair.

Every choice of a node is the service's: the run's first nodes (placement.nodes_for_run),
the nodes that join the pool (spares.choose_new_spares), the spare that replaces a failed
node (slurm.node_choice.choose_replacement), the nodes a run waiting for some gets. The pool
and the run's nodes are held in Slurm reservations as the reconciler holds them.
"""

from __future__ import annotations

from service.slurm.fake import FakeSlurm
from service.slurm.reservations import ensure_reservation, run_reservation, spare_reservation
from sim.failures import NODES_PER_LEAF
from sim.policy import Policy

PREFIX = "runyard"


class Cluster:
    """`run_nodes` nodes for the run plus `pool_target` spares, on leaf switches of 16."""

    def __init__(self, policy: Policy, *, run_nodes: int, pool_target: int) -> None:
        total = run_nodes + pool_target
        leaves = -(-total // NODES_PER_LEAF)
        self.slurm = FakeSlurm.cluster(num_switches=leaves, nodes_per_switch=NODES_PER_LEAF)
        for extra in sorted(self.slurm.nodes)[total:]:
            del self.slurm.nodes[extra]  # the last leaf is partly populated
        self.policy = policy
        self.pool_target = pool_target
        self.switch = {n.name: n.switch for n in self.slurm.nodes.values()}
        self.leaves = sorted({s for s in self.switch.values() if s}, key=lambda s: int(s[4:]))
        self.free: set[str] = set(self.switch)  # healthy, in no run and not a spare
        self.spares: list[str] = []
        self.repairing: set[str] = set()
        self.reservations: dict[str, list[str]] = {}
        first = policy.nodes_for_run(self.free_pairs(), set(), run_nodes)
        if first is None:
            raise ValueError(f"{run_nodes} nodes do not fit a cluster of {total}")
        self.slots: list[str | None] = list(first)
        self._run_switches: set[str | None] | None = None  # cached until a slot changes
        self.by_leaf: dict[str, list[str]] = {}
        for node in sorted(self.switch):
            self.by_leaf.setdefault(self.switch[node] or "-", []).append(node)
        self.free -= set(first)
        self.refill()
        self.hold_run()

    def free_pairs(self) -> list[tuple[str, str | None]]:
        return sorted((n, self.switch[n]) for n in self.free)

    def run_switches(self) -> set[str | None]:
        if self._run_switches is None:
            self._run_switches = {self.switch[n] for n in self.slots if n}
        return self._run_switches

    def set_slot(self, slot: int, node: str | None) -> None:
        self.slots[slot] = node
        self._run_switches = None

    def drop_holes(self) -> None:
        """The run shrank: it continues on the nodes it holds."""
        self.slots = [n for n in self.slots if n]
        self._run_switches = None

    def refill(self) -> None:
        """The reconciler's spares step: top the pool up from free healthy nodes."""
        want = self.pool_target - len(self.spares)
        if want > 0:
            chosen = self.policy.refill(
                self.free_pairs(), [self.switch[s] for s in self.spares], want
            )
            self.spares += chosen
            self.free -= set(chosen)
        ensure_reservation(
            self.slurm, spare_reservation(PREFIX), sorted(self.spares), self.reservations
        )

    def hold_run(self) -> None:
        held = sorted(n for n in self.slots if n)
        ensure_reservation(self.slurm, run_reservation(PREFIX, 1), held, self.reservations)

    def drain(self, node: str, reason: str) -> None:
        """Take a failed node out (through Slurm) until its repair."""
        self.slurm.drain(node, reason)
        self.repairing.add(node)
        self.free.discard(node)
        if node in self.spares:
            self.spares.remove(node)

    def repaired(self, node: str) -> None:
        self.slurm.resume(node)
        self.repairing.discard(node)
        self.free.add(node)

    def take_spare(self) -> str | None:
        """The spare for a failed node of the run (a switch it already uses first)."""
        pick = self.policy.spare_for(
            [(s, self.switch[s]) for s in self.spares], self.run_switches()
        )
        if pick is not None:
            self.spares.remove(pick)
        return pick

    def fill_holes(self, group_nodes: int | None = None, reserve: int | None = None) -> list[int]:
        """A run that lost nodes without a spare gets nodes from placement (free healthy
        ones, then idle spares), after the pool took its refill (the reconciler's order:
        spares, then placement): all its holes at once, as one job needs them, or, with
        `group_nodes`, group by group (the fast path resubmits each replica group alone),
        those the spare policy grants while it keeps `reserve` (None: every group that
        fits, the policy before). The slots filled."""
        holes = [i for i, n in enumerate(self.slots) if n is None]
        if not holes:
            return []
        if group_nodes is not None:
            by_group: dict[int, list[int]] = {}
            for i in holes:
                by_group.setdefault(i // group_nodes, []).append(i)
            if reserve is not None:
                granted = self.policy.grant(
                    {g: len(h) for g, h in by_group.items()},
                    len(self.free) + len(self.spares),
                    reserve,
                    others_train=True,
                )
                by_group = {g: by_group[g] for g in granted}
            filled: list[int] = []
            for group_holes in by_group.values():
                filled += self._fill(group_holes)
            return filled
        return self._fill(holes)

    def _fill(self, holes: list[int]) -> list[int]:
        spares = [(s, self.switch[s]) for s in sorted(self.spares)]
        chosen = self.policy.nodes_for_run(
            self.free_pairs(), self.run_switches(), len(holes), spares
        )
        if chosen is None:
            return []
        for i, node in zip(holes, chosen, strict=True):
            self.set_slot(i, node)
        self.free -= set(chosen)
        self.spares = [s for s in self.spares if s not in chosen]
        self.hold_run()
        self.refill()  # the next tick's spares step
        return holes

    def nodes_on_leaf(self, leaf: int) -> list[str]:
        return self.by_leaf[self.leaves[leaf % len(self.leaves)]]
