"""Who may do what: teams with quotas, bearer tokens (stored only as hashes), the audit log."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import BigInteger, DateTime, Enum, ForeignKey, Integer, String
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.models.base import Base, utcnow


class Role(StrEnum):
    USER = "user"  # submits and manages its team's runs
    ADMIN = "admin"  # on-call: every team, nodes, spares, quotas, tokens
    AGENT = "agent"  # a node's health agent: events and heartbeats for that node only
    WORKER = "worker"  # a training attempt's ranks: that attempt only, expires with it


class TokenOrigin(StrEnum):
    """How a token came to exist: what its owner and the on-call see in a token list, and
    what an expired token's refusal tells its holder to do."""

    ADMIN = "admin"  # an admin made it (`runyard admin token create`): automation, agents
    BOOTSTRAP = "bootstrap"  # minted into the database before the API (service.auth.bootstrap)
    LOGIN = "login"  # `runyard login`: a person proved their uid with MUNGE; expires
    SERVICE = "service"  # the service minted it for an attempt's workers


class Team(Base):
    __tablename__ = "teams"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    gpu_quota: Mapped[int | None] = mapped_column(Integer)  # None: unlimited
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex
    prefix: Mapped[str] = mapped_column(String(16))  # first characters, to recognise it
    user: Mapped[str] = mapped_column(String(64))
    team: Mapped[str] = mapped_column(ForeignKey("teams.name"))
    role: Mapped[Role] = mapped_column(
        Enum(
            Role,
            name="role",
            native_enum=False,
            length=16,
            validate_strings=True,
            values_callable=lambda e: [m.value for m in e],
        )
    )
    node_name: Mapped[str | None] = mapped_column(String(64))  # agent tokens
    # The agent's node's cluster: node names repeat across clusters. None on a token minted
    # before clusters were configurable: the default cluster's node.
    node_cluster: Mapped[str | None] = mapped_column(String(64))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    attempt_id: Mapped[int | None] = mapped_column(
        ForeignKey("attempts.id", ondelete="CASCADE"), index=True
    )
    origin: Mapped[TokenOrigin] = mapped_column(
        Enum(
            TokenOrigin,
            name="token_origin",
            native_enum=False,
            length=16,
            validate_strings=True,
            values_callable=lambda e: [m.value for m in e],
        ),
        default=TokenOrigin.ADMIN,
        server_default=TokenOrigin.ADMIN.value,
    )
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class AuditEntry(Base):
    """Append-only: every admin action, who did it, to what."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(64))
    actor_team: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(128))
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
