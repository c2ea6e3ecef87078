"""The engine, the dependency that owns a request's session, and the hot path's transactions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache, partial
from typing import Annotated, Concatenate, ParamSpec, TypeVar

import anyio
import anyio.to_thread
from fastapi import Depends
from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import Session, sessionmaker

from service.config import get_settings


@lru_cache
def get_engine() -> Engine:
    # Room for the hot path's transactions, the other endpoints' and the reconciler's, so
    # connections are reused rather than opened and closed as overflow.
    return create_engine(
        get_settings().database_url, pool_pre_ping=True, pool_size=20, max_overflow=10
    )


@lru_cache
def _session_factory() -> sessionmaker[Session]:
    return sessionmaker(get_engine(), expire_on_commit=False)


@contextmanager
def session_scope() -> Iterator[Session]:
    """Commit on success, roll back on error: services never commit themselves."""
    session = _session_factory()()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


P = ParamSpec("P")
T = TypeVar("T")


def in_transaction(
    work: Callable[Concatenate[Session, P], T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """`work(session, ...)` in a session of its own, committed before this returns."""
    with session_scope() as session:
        return work(session, *args, **kwargs)


class Lane:
    """A bounded set of threads for one kind of hot-path transaction.

    The agents' hot path (heartbeats and event batches from every node) runs its
    transactions through lanes: past a lane's limit, requests wait on the event loop, which
    costs nothing, instead of piling up as threads that fight over the GIL and over pooled
    connections (under a fleet's load that made every request slower, and the backlog
    grew). Heartbeats and event batches get separate lanes, so a flood of events (a leaf
    switch failing, a chatty agent) cannot starve the heartbeats, whose silence would
    read as dead nodes.
    """

    def __init__(self, max_transactions: int) -> None:
        self.max_transactions = max_transactions
        self._limiter = anyio.CapacityLimiter(max_transactions)

    async def run(
        self, work: Callable[Concatenate[Session, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """`in_transaction(work, ...)` from an `async def` endpoint: one hop to a thread,
        and the reply waits for the commit (SessionDep costs three: open, endpoint,
        commit)."""
        return await anyio.to_thread.run_sync(
            partial(in_transaction, work, *args, **kwargs), limiter=self._limiter
        )


# Heartbeats and token lookups: one short statement each, latency-critical.
LIVENESS = Lane(8)
# Event batches: up to 1,000 rows each; two at a time keep Postgres and the GIL busy.
EVENT_BATCHES = Lane(2)


def get_session() -> Iterator[Session]:
    with session_scope() as session:
        yield session


# scope="function": the commit happens when the endpoint returns, before the response is
# sent, so a client that got its 201 can read what it created on the very next request.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
