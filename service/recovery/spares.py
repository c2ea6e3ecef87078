"""The hot-spare pool: a target size set by admins, held in a Slurm reservation."""

from __future__ import annotations

from collections import Counter

from sqlalchemy import select
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
    rows = session.scalars(select(Run.nodes).where(Run.state.in_(ACTIVE_RUN_STATES))).all()
    return {n for nodes in rows for n in nodes}


def maintain_spares(settings: Settings, snapshot: ClusterSnapshot, slurm: SlurmClient) -> None:
    """Refill (or shrink) the pool toward its target, then make the reservation match."""
    name = spare_reservation(settings.slurm_job_prefix)
    ours = set(snapshot.reservations.get(name, []))
    with session_scope() as session:
        target = get_target(session)
        spares = spare_nodes(session, for_update=True)
        held = nodes_held_by_runs(session)
        for extra in spares[target:]:
            set_node_state(session, extra, NodeState.HEALTHY, "released: spare pool shrank")
        if len(spares) < target:
            per_switch = Counter(s.switch for s in spares)
            candidates = [
                n
                for n in session.scalars(
                    select(Node)
                    .where(Node.state == NodeState.HEALTHY)
                    .order_by(Node.name)
                    .with_for_update()
                ).all()
                if n.name not in held and (snapshot.is_free(n.name) or n.name in ours)
            ]
            while len(spares) < target and candidates:
                # Spread spares over leaf switches, so most failures find one on their switch.
                pick = min(candidates, key=lambda n: (per_switch[n.switch], n.name))
                candidates.remove(pick)
                set_node_state(session, pick, NodeState.SPARE, "joined the spare pool")
                per_switch[pick.switch] += 1
                spares.append(pick)
        members = sorted(n.name for n in spares[:target])
    ensure_reservation(slurm, name, members, snapshot.reservations)
