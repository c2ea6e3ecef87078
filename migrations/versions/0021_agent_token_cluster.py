"""agent tokens name their node's cluster

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06 19:10:00.000000

Node names repeat across clusters (migration 0019), so an agent token is bound to
(cluster, node): without the cluster, the agent of one cluster's gpu001 could report for,
and drain, another cluster's gpu001. Existing tokens keep NULL, read as the default
cluster's node (service/auth/principal.py), which is the one cluster they were made on.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("node_cluster", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("api_tokens", "node_cluster")
