"""A Postgres outage is not silence: while the service could not record heartbeats and
progress, its agents and workers were still beating and training. After it leads again
(recovery of the lock means recovery of the database), the silence checks count from then,
not from the service's start, so no node is drained and no run restarted for what the
outage hid."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import select

from contract import MAX_REPORT_BACKOFF_S
from service.config import Settings
from service.db import session_scope
from service.leader import LeaderLock
from service.models import Incident, Node, NodeState, Run
from service.models.base import utcnow
from service.reconcile.loop import run_forever
from tests.unit.reconcile.conftest import Cluster


class RegainedLock(LeaderLock):
    """A lock granted at once and held until the loop is told to stop."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop

    def try_acquire(self) -> bool:
        return True

    def held(self) -> bool:
        return not self.stop.is_set()

    def release(self) -> None:
        pass


def lead_for_one_tick(cluster: Cluster, settings: Settings) -> None:
    """The loop of a service that has the lock again: one whole tick, then stop."""
    stop, tick = threading.Event(), cluster.reconciler.tick

    def one_tick(still_leader: Callable[[], bool] | None = None) -> None:
        tick(still_leader)
        stop.set()

    cluster.reconciler.tick = one_tick  # type: ignore[method-assign]
    try:
        run_forever(settings, stop, cluster.reconciler, RegainedLock(stop))
    finally:
        cluster.reconciler.tick = tick  # type: ignore[method-assign]


def training_through_a_minute_of_outage(cluster: Cluster, name: str) -> int:
    """A run trained to step 20, whose last heartbeat and progress Postgres holds are a
    minute old: the outage ate every one since. The reconciler had been leading for an hour
    before it."""
    run_id = cluster.submit_run(name)
    cluster.cycle()
    cluster.train(run_id, 20)
    a_minute_ago = utcnow() - timedelta(minutes=1)
    with session_scope() as session:
        run = session.get(Run, run_id)
        assert run is not None
        run.last_progress_at = a_minute_ago
        for node in session.scalars(select(Node).where(Node.name.in_(run.nodes))):
            node.last_heartbeat_at = a_minute_ago
    cluster.reconciler.watching_since = utcnow() - timedelta(hours=1)
    return run_id


def incident_signals() -> set[str]:
    with session_scope() as session:
        return {i.signal for i in session.scalars(select(Incident))}


def test_after_the_database_comes_back_no_node_is_drained_and_no_run_restarted(
    cluster: Cluster, settings: Settings
) -> None:
    run_id = training_through_a_minute_of_outage(cluster, "outage")
    nodes = cluster.run(run_id).nodes

    lead_for_one_tick(cluster, settings)

    assert all(cluster.node(n).state == NodeState.HEALTHY for n in nodes)
    with session_scope() as session:
        assert not session.scalars(select(Incident).where(Incident.run_id == run_id)).all()
    # The checks still work: once the workers' longest retry wait has passed since the
    # return and still nothing came, the run is hung and its silent nodes are lost.
    cluster.reconciler.watching_since = utcnow() - timedelta(seconds=MAX_REPORT_BACKOFF_S + 60)
    cluster.tick()
    signals = incident_signals()
    assert "hang:no_progress" in signals and "heartbeat:lost" in signals


def test_a_worker_gets_its_longest_retry_wait_to_report_after_the_return(
    cluster: Cluster, settings: Settings
) -> None:
    # A worker whose reports failed through the outage waits up to MAX_REPORT_BACKOFF_S
    # between tries: 20 s after the return it may not have tried yet, even where runs count
    # as hung after 15 s of silence (the integration tests' threshold).
    training_through_a_minute_of_outage(cluster, "backing-off")
    cluster.reconciler.settings = settings.model_copy(update={"hang_min_s": 15.0})
    cluster.reconciler.watching_since = utcnow() - timedelta(seconds=20)
    cluster.tick()
    assert "hang:no_progress" not in incident_signals()


class FlakyLock(LeaderLock):
    """Granted, lost after one tick (a cut connection), then granted again."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop, self.grants, self.checks = stop, 0, 0

    def try_acquire(self) -> bool:
        self.grants += 1
        self.checks = 0
        return True

    def held(self) -> bool:
        self.checks += 1
        # Checked once before the tick and once before each of its steps: lost after the
        # first grant's tick, kept through the second's.
        return not self.stop.is_set() and (self.grants > 1 or self.checks <= 20)

    def release(self) -> None:
        pass


def test_each_time_it_leads_again_the_service_watches_afresh(
    cluster: Cluster, settings: Settings
) -> None:
    stop, tick, seen = threading.Event(), cluster.reconciler.tick, []

    def recording_tick(still_leader: Callable[[], bool] | None = None) -> None:
        seen.append(cluster.reconciler.watching_since)
        tick(still_leader)
        if len(seen) == 2:
            stop.set()

    cluster.reconciler.tick = recording_tick  # type: ignore[method-assign]
    lock = FlakyLock(stop)
    fast = settings.model_copy(update={"reconcile_interval_s": 0.01})
    try:
        run_forever(fast, stop, cluster.reconciler, lock)
    finally:
        cluster.reconciler.tick = tick  # type: ignore[method-assign]
    assert lock.grants == 2 and len(seen) == 2
    assert seen[1] > seen[0], "leading again after a lost lock must restart the watch"
