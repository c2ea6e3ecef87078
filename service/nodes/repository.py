"""All SQL about nodes."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Node


def list_nodes(session: Session) -> Sequence[Node]:
    return session.scalars(select(Node).order_by(Node.name)).all()


def get_node(session: Session, name: str, *, for_update: bool = False) -> Node | None:
    stmt = select(Node).where(Node.name == name)
    if for_update:
        stmt = stmt.with_for_update()
    return session.scalars(stmt).one_or_none()
