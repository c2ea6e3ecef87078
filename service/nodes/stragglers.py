"""Slow nodes (issue 15): the straggler rule, and the SLOW flag on a node's row.

Input: with each progress report, rank 0 sends every node's slowest rank's mean update
time over the report's window (worker/stragglers.py: the optimizer update, the one part of
a step where no rank waits for another, so a slow GPU shows there and nowhere else).

The rule (defaults in service/config.py):
- in one report, a node is slow when its time is above `slow_node_margin` (1.25) x the
  median of the *other* nodes' times of the same run, and at least
  `slow_node_min_excess_s` above it (1 ms on GPUs, 0.1 s on the CPU dev cluster); a run
  on a single node has no peers and is never judged;
- after `slow_node_reports` (5) consecutive slow reports the node is flagged SLOW
  (`nodes.slow_since`, a node event, `runyard_node_slow` in /metrics, `node show`); one
  report within the margin resets the count and clears the flag.
With the `move` policy a newly flagged node is moved off (service/recovery/slow_nodes.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import Node
from service.models.base import utcnow
from service.nodes.node_state_machine import node_event


@dataclass(frozen=True)
class Judged:
    """One node in one report: its time, its peers' median, and whether it is slow."""

    node: str
    update_s: float
    peers_median_s: float
    slow: bool

    @property
    def ratio(self) -> float:
        return self.update_s / self.peers_median_s if self.peers_median_s > 0 else float("inf")


def judge_report(update_s: dict[str, float], margin: float, min_excess_s: float) -> list[Judged]:
    """Every node of one report against the median of the others (pure). Sorted once, so
    a report of 1,280 nodes costs O(n log n), not a median per node."""
    if len(update_s) < 2:
        return []
    ordered = sorted(update_s.values())
    n = len(ordered)
    position = {value: i for i, value in enumerate(ordered)}  # any index of an equal value

    def rest(k: int, i: int) -> float:  # the k-th smallest value once index i is removed
        return ordered[k] if k < i else ordered[k + 1]

    judged = []
    for node, seconds in sorted(update_s.items()):
        i = position[seconds]
        m = n - 1  # peers
        median = rest(m // 2, i) if m % 2 else (rest(m // 2 - 1, i) + rest(m // 2, i)) / 2
        slow = seconds > margin * median and seconds - median >= min_excess_s
        judged.append(Judged(node, seconds, median, slow))
    return judged


def record_update_times(
    session: Session,
    run_id: int,
    cluster: str,
    update_s: dict[str, float],
    settings: Settings,
    on_flagged: Callable[[Node, Judged], None],
) -> list[Node]:
    """Apply one report to its nodes' rows (`cluster`'s): count slow reports, flag at the threshold
    (calling `on_flagged` for each node flagged now), reset on a report within the margin.
    Only rows that change are locked. Returns the nodes flagged by this report."""
    judged = {
        j.node: j
        for j in judge_report(update_s, settings.slow_node_margin, settings.slow_node_floor_s)
    }
    if not judged:
        return []
    # Unlocked read first: in the common case nothing changes and nothing is locked.
    current = session.execute(
        select(Node.name, Node.num_slow_reports, Node.slow_since).where(
            Node.cluster == cluster, Node.name.in_(list(judged))
        )
    ).all()
    changing = sorted(name for name, count, since in current if judged[name].slow or count or since)
    if not changing:
        return []
    flagged = []
    now = utcnow()
    for node in session.scalars(
        select(Node)
        .where(Node.cluster == cluster, Node.name.in_(changing))
        .order_by(Node.name)
        .with_for_update()
    ):
        j = judged[node.name]
        if not j.slow:
            if node.slow_since is not None:
                node_event(
                    session,
                    node,
                    "node.slow_cleared",
                    f"within {settings.slow_node_margin}x of its peers again in run {run_id} "
                    f"({j.update_s:.3f} s vs a median of {j.peers_median_s:.3f} s)",
                    {"run_id": run_id, "ratio": j.ratio},
                )
            node.num_slow_reports, node.slow_since, node.slow_ratio = 0, None, j.ratio
            continue
        node.num_slow_reports += 1
        node.slow_ratio = j.ratio
        if node.slow_since is None and node.num_slow_reports >= settings.slow_node_reports:
            node.slow_since = now
            node_event(
                session,
                node,
                "node.slow",
                f"SLOW: its ranks' update took {j.ratio:.2f}x the median of its peers in run "
                f"{run_id} ({j.update_s:.3f} s vs {j.peers_median_s:.3f} s) for "
                f"{node.num_slow_reports} consecutive reports",
                {"run_id": run_id, "ratio": j.ratio, "update_s": j.update_s},
            )
            flagged.append(node)
            on_flagged(node, j)
    return flagged


def clear_slow_flag(node: Node) -> None:
    """A node back in service (resumed by an admin) starts with a clean record."""
    node.num_slow_reports, node.slow_since, node.slow_ratio = 0, None, None
