"""SQL for user links: every query of the identity domain is here."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import UserLink


def link_of(session: Session, user: str) -> UserLink | None:
    return session.get(UserLink, user)


def list_links(session: Session) -> list[UserLink]:
    return list(session.scalars(select(UserLink).order_by(UserLink.user)))


def links_to(session: Session, unix_user: str) -> list[UserLink]:
    """The runyard users whose runs run as `unix_user`."""
    stmt = select(UserLink).where(UserLink.unix_user == unix_user).order_by(UserLink.user)
    return list(session.scalars(stmt))
