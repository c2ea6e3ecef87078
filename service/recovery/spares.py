"""The hot-spare pool: a target size set by admins, held in a Slurm reservation."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from planner import reliability
from service.clusters.registry import clusters
from service.clusters.repository import spare_target_key
from service.config import Settings
from service.db import session_scope
from service.models import ClusterSetting, Node, NodeState, Run, RunState
from service.nodes.node_state_machine import set_node_state
from service.slurm.client import SlurmClient
from service.slurm.reservations import ensure_reservation, spare_reservation
from service.slurm.snapshot import ClusterSnapshot

ACTIVE_RUN_STATES = (RunState.PENDING, RunState.RUNNING, RunState.CANCELLING)
# The most of a run's nodes the pool may hold idle (issue 14: 1.5%, 19 of 1,280 nodes).
MAX_SPARE_SHARE = 0.015
# A failed leaf switch is swapped on site and its nodes come back together: hours, where a
# drained node's repair takes a day (planner.reliability's repair_window_h). An assumption;
# the failure simulation (sim/failures.py) draws a leaf's repair with the same mean.
LEAF_REPAIR_H = 4.0


def get_target(session: Session, cluster: str, configured: int | None = None) -> int:
    """`cluster`'s pool size: what an admin set, else the clusters file's
    spare_pool_target (`configured`), else none."""
    row = session.get(ClusterSetting, spare_target_key(cluster))
    if row is not None:
        return int(row.value)
    return configured or 0


def set_target(session: Session, cluster: str, size: int) -> None:
    row = session.get(ClusterSetting, spare_target_key(cluster), with_for_update=True)
    if row is None:
        session.add(ClusterSetting(key=spare_target_key(cluster), value=size))
    else:
        row.value = size


def configured_target(settings: Settings, cluster: str) -> int | None:
    """The clusters file's spare_pool_target for `cluster`, if it names one."""
    for config in clusters(settings):
        if config.name == cluster:
            return config.spare_pool_target
    return None


def pool_target(
    *, independent: int, nodes_per_leaf: int, run_nodes: int, max_share: float = MAX_SPARE_SHARE
) -> int:
    """The pool's size for a run of `run_nodes`: the spares that cover independent node
    failures over the repair window (`independent`, the planner's `spare_nodes`) plus one
    leaf switch's nodes, which fail together when their switch does, capped at `max_share`
    of the run's nodes, and never under `independent`.

    At 1,280 nodes the cap binds (11 + 16 > 19): what a leaf failure may take from the pool
    is then bounded by `spares_to_grant`."""
    cap = math.floor(max_share * run_nodes)
    return max(independent, min(independent + nodes_per_leaf, cap))


def reserve_for(failures_per_hour: float, hours: float = LEAF_REPAIR_H, risk: float = 0.01) -> int:
    """Spares a correlated failure must leave in the pool: enough for the independent
    failures that arrive, at the run's rate, before its nodes are back (chance of needing
    more under `risk`)."""
    return reliability.spares_needed(failures_per_hour * hours, risk)


def spares_to_grant(
    missing: Mapping[int, int], available: int, reserve: int, *, others_train: bool
) -> list[int]:
    """Which of a run's replica groups (group -> nodes it lacks) get spares now.

    Whole groups only, fewest missing first: a group short of one node cannot start, and
    spares handed to it would sit idle while the next failure finds none. A run that is
    stopped (`others_train` False: no replica groups, or the classic path) takes every group
    the pool can complete: waiting would idle all of it. Where the other groups train on
    (the fast path), a group that lacks one node (an independent failure) takes a spare
    whenever there is one, and a group that lost several at once (a leaf switch) only if
    `reserve` spares stay for the independent failures expected before its nodes are back;
    until then it waits for them while the others train."""
    granted: list[int] = []
    left = available
    for group, need in sorted(missing.items(), key=lambda kv: (kv[1], kv[0])):
        keep = reserve if others_train and need > 1 else 0
        if need > 0 and left - need >= keep:
            granted.append(group)
            left -= need
    return granted


def spare_nodes(session: Session, cluster: str, *, for_update: bool = False) -> list[Node]:
    """`cluster`'s spare pool: a spare never leaves its cluster."""
    stmt = select(Node).where(Node.cluster == cluster, Node.state == NodeState.SPARE)
    stmt = stmt.order_by(Node.name)
    if for_update:
        stmt = stmt.with_for_update()
    return list(session.scalars(stmt).all())


def nodes_held_by_runs(session: Session, cluster: str) -> set[str]:
    """The names of `cluster`'s nodes its active runs hold."""
    rows = session.scalars(  # queued runs hold no nodes: 10,000 of them cost 0.2 s a tick
        select(Run.nodes).where(
            Run.cluster == cluster,
            Run.state.in_(ACTIVE_RUN_STATES),
            func.cardinality(Run.nodes) > 0,
        )
    ).all()
    return {n for nodes in rows for n in nodes}


def choose_new_spares(
    candidates: Sequence[tuple[str, str | None]], spare_switches: Sequence[str | None], count: int
) -> list[str]:
    """Up to `count` of the free healthy `candidates` (name, leaf switch) to join a pool whose
    members sit on `spare_switches`: each pick goes to the switch with the fewest spares so
    far (then by name), so most failures find a spare on their own switch.

    Pure, so the reconciler and the failure simulation (sim/) choose the same way."""
    per_switch = Counter(spare_switches)
    left = sorted(candidates, key=lambda c: c[0])
    chosen: list[str] = []
    while len(chosen) < count and left:
        pick = min(left, key=lambda c: (per_switch[c[1]], c[0]))
        left.remove(pick)
        per_switch[pick[1]] += 1
        chosen.append(pick[0])
    return chosen


def maintain_spares(settings: Settings, snapshot: ClusterSnapshot, slurm: SlurmClient) -> None:
    """Refill (or shrink) the pool toward its target, then make the reservation match."""
    name = spare_reservation(settings.slurm_job_prefix)
    ours = set(snapshot.reservations.get(name, []))
    free = snapshot.free_nodes()
    cluster = snapshot.cluster
    configured = configured_target(settings, cluster)
    with session_scope() as session:
        target = get_target(session, cluster, configured)
        spares = spare_nodes(session, cluster, for_update=True)
        held = nodes_held_by_runs(session, cluster)
        for extra in spares[target:]:
            set_node_state(session, extra, NodeState.HEALTHY, "released: spare pool shrank")
        if len(spares) < target:
            candidates = [
                n
                for n in session.scalars(
                    select(Node)
                    .where(Node.cluster == cluster, Node.state == NodeState.HEALTHY)
                    .order_by(Node.name)
                    .with_for_update()
                ).all()
                if n.name not in held and (n.name in free or n.name in ours)
            ]
            by_name = {n.name: n for n in candidates}
            for chosen in choose_new_spares(
                [(n.name, n.switch) for n in candidates],
                [s.switch for s in spares],
                target - len(spares),
            ):
                pick = by_name[chosen]
                set_node_state(session, pick, NodeState.SPARE, "joined the spare pool")
                spares.append(pick)
        members = sorted(n.name for n in spares[:target])
    ensure_reservation(slurm, name, members, snapshot.reservations)
