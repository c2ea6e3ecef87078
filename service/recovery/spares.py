"""The hot-spare pool: a target size set by admins, held in a Slurm reservation."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import session_scope
from service.models import ClusterSetting, Node, NodeState, Run, RunState
from service.nodes.lifecycle import set_node_state
from service.slurm.client import SlurmClient
from service.slurm.reservations import ensure_reservation, spare_reservation
from service.slurm.snapshot import ClusterSnapshot

TARGET_KEY = "spare_pool_target"
ACTIVE_RUN_STATES = (RunState.PENDING, RunState.RUNNING, RunState.CANCELLING)


def get_target(session: Session) -> int:
    row = session.get(ClusterSetting, TARGET_KEY)
    return int(row.value) if row else 0


def set_target(session: Session, size: int) -> None:
    row = session.get(ClusterSetting, TARGET_KEY, with_for_update=True)
    if row is None:
        session.add(ClusterSetting(key=TARGET_KEY, value=size))
    else:
        row.value = size


def spare_nodes(session: Session, *, for_update: bool = False) -> list[Node]:
    stmt = select(Node).where(Node.state == NodeState.SPARE).order_by(Node.name)
    if for_update:
        stmt = stmt.with_for_update()
    return list(session.scalars(stmt).all())


def nodes_held_by_runs(session: Session) -> set[str]:
    rows = session.scalars(  # queued runs hold no nodes: 10,000 of them cost 0.2 s a tick
        select(Run.nodes).where(Run.state.in_(ACTIVE_RUN_STATES), func.cardinality(Run.nodes) > 0)
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
    with session_scope() as session:
        target = get_target(session)
        spares = spare_nodes(session, for_update=True)
        held = nodes_held_by_runs(session)
        for extra in spares[target:]:
            set_node_state(session, extra, NodeState.HEALTHY, "released: spare pool shrank")
        if len(spares) < target:
            candidates = [
                n
                for n in session.scalars(
                    select(Node)
                    .where(Node.state == NodeState.HEALTHY)
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
