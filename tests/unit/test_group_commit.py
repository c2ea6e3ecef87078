"""Group commit on the real database: heartbeats that arrive together share a transaction,
each is answered only once it is committed, and one node's answer is its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, delete, select
from sqlalchemy.orm import Session

from service.db import LIVENESS
from service.group_commit import GroupCommit
from service.models import Node, NodeState
from service.nodes.service import touch_heartbeats

NODES = [f"gc{i:03d}" for i in range(40)]


@pytest.fixture
def nodes(database_url: str) -> Iterator[Session]:
    engine = create_engine(database_url)
    with Session(engine) as s, s.begin():
        s.add_all(
            Node(
                cluster="default",
                name=n,
                state=NodeState.HEALTHY,
                state_reason="test",
                num_app_errors=0,
            )
            for n in NODES
        )
    with Session(engine) as session:
        yield session
    with Session(engine) as s, s.begin():
        s.execute(delete(Node).where(Node.name.in_(NODES)))
    engine.dispose()


def test_heartbeats_arriving_together_share_a_commit(nodes: Session) -> None:
    groups: list[list[str]] = []
    first_in_flight, release = threading.Event(), threading.Event()

    def held_open(session: Session, names: list[str]) -> dict[str, bool]:
        groups.append(names)
        first_in_flight.set()
        release.wait(timeout=10)  # the first group stays in flight while the rest arrive
        return touch_heartbeats(session, "default", names)

    heartbeats = GroupCommit("test heartbeats", LIVENESS, held_open)

    async def fleet() -> list[bool]:
        first = asyncio.create_task(heartbeats.submit(NODES[0]))
        while not first_in_flight.is_set():
            await asyncio.sleep(0.01)
        rest = [asyncio.create_task(heartbeats.submit(n)) for n in [*NODES[1:], "gc-none"]]
        await asyncio.sleep(0.05)
        release.set()
        return await asyncio.gather(first, *rest)

    answers = asyncio.run(fleet())
    assert answers == [True] * len(NODES) + [False]  # each request gets its own answer
    assert groups == [[NODES[0]], [*NODES[1:], "gc-none"]]  # two transactions for 41
    # Answered means committed: another connection sees every heartbeat.
    beats = nodes.scalars(select(Node.last_heartbeat_at).where(Node.name.in_(NODES))).all()
    assert len(beats) == len(NODES) and all(beats)


def test_a_failing_group_fails_each_of_its_requests(nodes: Session) -> None:
    def broken(session: Session, names: list[str]) -> dict[str, bool]:
        raise RuntimeError("database unreachable")

    heartbeats = GroupCommit("broken heartbeats", LIVENESS, broken)

    async def two() -> list[BaseException | bool]:
        return await asyncio.gather(
            heartbeats.submit(NODES[0]), heartbeats.submit(NODES[1]), return_exceptions=True
        )

    assert [str(a) for a in asyncio.run(two())] == ["database unreachable"] * 2
