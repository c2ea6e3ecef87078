"""Since when each cluster's controller has not answered the reconciler, kept in Postgres.

The reconciler reads every cluster once a tick (service/reconcile/loop.py); a cluster whose
read fails is recorded unreachable from the first failure on, and reachable again at the
first read that succeeds. Kept in the database, not in the leader's memory: the API refuses
a run pinned to a silent cluster at submit (service/runs/cluster_placement.py), and the
failover rule (service/clusters/failover.py) measures the silence against the site's limit,
which a new leader must not restart from zero. Written on a change only, not every tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import ClusterSetting

# cluster_settings' key of a cluster's reachability: `reachability:<cluster>`.
REACHABILITY_KEY = "reachability"


def reachability_key(cluster: str) -> str:
    return f"{REACHABILITY_KEY}:{cluster}"


@dataclass(frozen=True)
class Reachability:
    """What the reconciler last found of one cluster's controller."""

    cluster: str
    unreachable_since: datetime | None  # None: it answered the last read
    detail: str = ""  # why not, in Slurm's words

    def unreachable_for_s(self, now: datetime) -> float | None:
        """Seconds of silence at `now` (what failover.RunCluster takes); None: it answers."""
        if self.unreachable_since is None:
            return None
        return max(0.0, (now - self.unreachable_since).total_seconds())


def record_reachable(session: Session, cluster: str) -> None:
    """`cluster` answered: its silence, if any, is over."""
    row = session.get(ClusterSetting, reachability_key(cluster), with_for_update=True)
    value = {"unreachable_since": None, "detail": ""}
    if row is None:
        session.add(ClusterSetting(key=reachability_key(cluster), value=value))
    elif row.value != value:
        row.value = value


def record_unreachable(session: Session, cluster: str, since: datetime, detail: str) -> datetime:
    """`cluster` did not answer; silent since `since`, or since the earlier moment already
    recorded (another leader saw the silence begin). Returns the since-when kept."""
    row = session.get(ClusterSetting, reachability_key(cluster), with_for_update=True)
    kept = read_row(cluster, row.value).unreachable_since if row is not None else None
    since = min(kept, since) if kept is not None else since
    value = {"unreachable_since": since.isoformat(), "detail": detail[:300]}
    if row is None:
        session.add(ClusterSetting(key=reachability_key(cluster), value=value))
    else:
        row.value = value
    return since


def read_row(cluster: str, value: dict[str, str | None]) -> Reachability:
    since = value.get("unreachable_since")
    return Reachability(
        cluster,
        datetime.fromisoformat(since) if since else None,
        value.get("detail") or "",
    )


def reachability(session: Session) -> dict[str, Reachability]:
    """Cluster -> what the reconciler last found; a cluster it never read is absent (it is
    taken as reachable: a service that has not ticked yet knows nothing against it)."""
    rows = session.execute(
        select(ClusterSetting.key, ClusterSetting.value).where(
            ClusterSetting.key.like(f"{REACHABILITY_KEY}:%")
        )
    ).all()
    found: dict[str, Reachability] = {}
    for key, value in rows:
        cluster = key.partition(":")[2]
        found[cluster] = read_row(cluster, value)
    return found
