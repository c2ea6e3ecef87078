"""attempts.heals_from_peer: a replica group's replacement, told apart from a restart

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 05:00:00.000000

Which group attempts heal from a live peer was read from the history (no resume step, and an
earlier attempt of the same group): after a restart from disk with no checkpoint yet, every
group's new attempt matched, all of them waited for a peer to heal from, and the run failed
with NoPeerToHealFromError. The decision is now recorded when the attempt is made
(service/recovery/fast_path.py). Existing rows keep what the old rule said of them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "attempts",
        sa.Column("heals_from_peer", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.execute(
        """
        UPDATE attempts AS a SET heals_from_peer = true
        WHERE a.resume_step IS NULL AND a.replica_group IS NOT NULL AND EXISTS (
            SELECT 1 FROM attempts AS e
            WHERE e.run_id = a.run_id AND e.replica_group = a.replica_group
              AND e.number < a.number)
        """
    )


def downgrade() -> None:
    op.drop_column("attempts", "heals_from_peer")
