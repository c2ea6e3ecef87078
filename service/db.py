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


# The agents' hot path (heartbeats and event batches from every node) runs at most this
# many transactions at once, on threads of its own. Past that, requests wait on the event
# loop, which costs nothing, instead of piling up as threads that fight over the GIL and
# over pooled connections (overflow connections were opened and closed by the dozen each
# second): under a fleet's load that made every request slower, and the backlog grew.
HOT_PATH_TRANSACTIONS = 8
_hot_path = anyio.CapacityLimiter(HOT_PATH_TRANSACTIONS)


async def run_in_transaction(
    work: Callable[Concatenate[Session, P], T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """`in_transaction` from an `async def` endpoint: one hop to a thread, and the reply
    waits for the commit. SessionDep costs three hops (open, endpoint, commit)."""
    return await anyio.to_thread.run_sync(
        partial(in_transaction, work, *args, **kwargs), limiter=_hot_path
    )


def get_session() -> Iterator[Session]:
    with session_scope() as session:
        yield session


# scope="function": the commit happens when the endpoint returns, before the response is
# sent, so a client that got its 201 can read what it created on the very next request.
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
