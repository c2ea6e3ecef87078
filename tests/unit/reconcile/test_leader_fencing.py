"""Leader fencing: a reconciler whose Postgres session died (and with it the advisory lock)
stops acting before it would act beside the replica that took the lock; once the lock is free
again it leads again. On the real Postgres; the session is cut with pg_terminate_backend, as a
Postgres restart or a network cut ends it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, create_engine, text

from service.config import Settings
from service.leader import LeaderLock
from service.reconcile.loop import Reconciler, run_forever
from tests.conftest import wait_for
from tests.unit.reconcile.conftest import Cluster

# A key of this test's own (a service process of the integration tests may hold the real one
# in the same database), as small as the real one: psycopg sends it as int4, not int8.
TEST_KEY = 0x6665_0000 + os.getpid() % 0xFFFF


class CountingReconciler(Reconciler):
    """Acts on every tick, whatever it is told: only the loop's own check can stop it."""

    def __init__(self) -> None:
        self.ticks = 0

    def tick(self, still_leader: Callable[[], bool] | None = None) -> None:
        self.ticks += 1


class CountingLock(LeaderLock):
    """The real lock, counting the times it was asked for and refused."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine, key=TEST_KEY)
        self.refused = 0

    def try_acquire(self) -> bool:
        got = super().try_acquire()
        self.refused += not got
        return got


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


def lock_backend(engine: Engine, granted: bool) -> int | None:
    """The session that holds the test's lock (granted) or waits for it."""
    with engine.connect() as conn:
        pid = conn.execute(
            text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted = :g"
                " AND objid = CAST(:k AS bigint)::oid AND classid = 0"
            ),
            {"k": TEST_KEY, "g": granted},
        ).scalar()
    return int(pid) if pid is not None else None


def test_a_leader_whose_session_died_stops_acting_and_leads_again_later(engine: Engine) -> None:
    reconciler, lock = CountingReconciler(), CountingLock(engine)
    stop, taken = threading.Event(), threading.Event()
    settings = Settings(reconcile_interval_s=0.05)
    loop = threading.Thread(target=run_forever, args=(settings, stop, reconciler, lock))
    loop.start()
    other = engine.connect()

    def take_when_free() -> None:
        """The other replica, queued for the lock: Postgres grants it before any later try."""
        other.execute(text("SELECT pg_advisory_lock(:k)"), {"k": TEST_KEY})
        other.commit()
        taken.set()

    try:
        wait_for("the leader's first ticks", lambda: reconciler.ticks >= 3, timeout_s=10)
        leader = wait_for("the leader's session", lambda: lock_backend(engine, granted=True))
        waiter = threading.Thread(target=take_when_free)
        waiter.start()
        wait_for("the other replica queued", lambda: lock_backend(engine, granted=False))
        # The leader's session ends, as a Postgres restart or a cut connection ends it, and
        # the other replica has the lock.
        with engine.connect() as admin:
            terminate = text("SELECT pg_terminate_backend(:p)")
            assert admin.execute(terminate, {"p": leader}).scalar()
        assert taken.wait(timeout=10), "the other replica never got the lock"
        waiter.join()
        ticks, refused = reconciler.ticks, lock.refused
        # Either the old leader notices and asks for the lock again (refused), or it goes on
        # ticking as if it still led: whichever comes first.
        wait_for(
            "the old leader to ask for the lock again, or to tick on",
            lambda: lock.refused >= refused + 3 or reconciler.ticks >= ticks + 3,
            timeout_s=10,
        )
        # One tick may have passed its check just before the session was cut.
        assert reconciler.ticks <= ticks + 1, "a leader that lost its lock kept acting"
        other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": TEST_KEY})
        other.commit()
        wait_for("the old leader to lead again", lambda: reconciler.ticks >= ticks + 3)
    finally:
        stop.set()
        loop.join(timeout=10)
        other.close()
    assert not loop.is_alive()
    assert lock_backend(engine, granted=True) is None, "the lock is released when the loop stops"


def test_a_tick_stops_before_the_next_step_once_the_lock_is_lost(cluster: Cluster) -> None:
    """The check runs before each step too, so a leader cut off mid-tick acts no further."""
    run_id = cluster.submit_run("fenced")
    cluster.reconciler.tick(still_leader=lambda: False)
    assert cluster.slurm.calls["submit"] == 0 and cluster.attempts(run_id) == []
    answers = iter([True] * 6)  # leader for the first steps, through placement, then not
    cluster.reconciler.tick(still_leader=lambda: next(answers, False))
    assert cluster.slurm.calls["submit"] == 0
    cluster.reconciler.tick(still_leader=lambda: True)
    assert cluster.slurm.calls["submit"] == 1 and len(cluster.attempts(run_id)) == 1
