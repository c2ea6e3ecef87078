"""heartbeat streak: since when a node's agent has heartbeated without a gap

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 10:00:00.000000

`nodes.heartbeats_since` is the first heartbeat of the agent's current unbroken run of them
(no gap longer than heartbeat_suspect_s), written by the heartbeat's own UPDATE: a node
drained only because its agent fell silent returns by itself once this is
heartbeat_return_s old (service/recovery/heartbeat_return.py). Existing rows keep none;
their next heartbeat starts a streak.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("heartbeats_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("nodes", "heartbeats_since")
