"""run owners: each runyard user's Unix user and Slurm account; runs and sweeps keep theirs

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 18:30:00.000000

Runs were submitted by the service as itself. From here each user is linked to a Unix user
(and optionally a Slurm account; the team's name otherwise), and a run records the identity
it was accepted with, so its attempts run and are charged the same way to its end. Runs
accepted before this revision have empty columns: the service refuses to submit new
attempts for them until an admin links their owner (they are re-read from the link then).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "user_links",
        sa.Column("user", sa.String(64), primary_key=True),
        sa.Column("unix_user", sa.String(64), nullable=False),
        sa.Column("slurm_account", sa.String(64), nullable=True),
        sa.Column("linked_by", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    for table in ("runs", "sweeps"):
        op.add_column(
            table, sa.Column("unix_user", sa.String(64), nullable=False, server_default="")
        )
        op.add_column(
            table, sa.Column("slurm_account", sa.String(64), nullable=False, server_default="")
        )


def downgrade() -> None:
    for table in ("runs", "sweeps"):
        op.drop_column(table, "slurm_account")
        op.drop_column(table, "unix_user")
    op.drop_table("user_links")
