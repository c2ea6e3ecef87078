"""Who a runyard user is below the API: the Unix user their jobs run as, and the Slurm
account those jobs are charged to (docs/design.md, "Who a run runs as")."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, String
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class UserLink(Base):
    """One runyard user's Unix identity. A user without one cannot submit: the service
    never runs anyone's code as itself."""

    __tablename__ = "user_links"

    user: Mapped[str] = mapped_column(String(64), primary_key=True)
    unix_user: Mapped[str] = mapped_column(String(64))
    # None: the Slurm account is the team's name (the default a site gets without choosing).
    slurm_account: Mapped[str | None] = mapped_column(String(64))
    linked_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, onupdate=utcnow
    )
